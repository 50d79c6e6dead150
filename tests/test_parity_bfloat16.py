"""The bfloat16 parity policy (parity/bfloat16.py; docs/design.md, "Parity policy"): the Flax
twin computing in bfloat16 against the torch twin in float32, every intermediate within
4 x 2^-8 x sqrt(depth + 1) of its largest float32 magnitude.

Property checked: the policy holds at every row of the tiny and seed presets, while the check
still sees bfloat16's rounding (the twin computed every row in bfloat16, and its differences
are of bfloat16's size, not float32's), and a port's slip many times that rounding fails at
its layer. With ``--torch-device cuda`` the torch twin runs on CUDA (TF32 off) and the Flax
twin on JAX's GPU: the policy on the machine users train in bfloat16 on.

Sizes: the presets' (tiny: D=30, 5 heads, 2 + 2 layers; seed: D=512, 8 heads, 6 + 6 layers),
batches of 4 with padding (parity.twins.sample_batch).
"""

import json

import pytest

import flaxformer_mini as fm
from parity.bfloat16 import bfloat16_twin, check_bfloat16, depth_of, main
from parity.compare import model_intermediates
from parity.twins import as_inputs, sample_batch, transformer_pair

pytestmark = pytest.mark.parity


@pytest.mark.parametrize("preset,seed", [("tiny", 0), ("tiny", 1), ("seed", 0)])
def test_the_bfloat16_twin_is_within_the_policy_at_every_layer(preset, seed):
    config = fm.get_preset(preset)
    torch_model, flax32 = transformer_pair(config, seed)
    report = check_bfloat16(torch_model, bfloat16_twin(torch_model, config, seed), config, seed=seed)
    assert report.ok, report.format_table()
    # Every row float32 parity compares is here: the same intermediates, LayerNorms included.
    float32_rows, _ = model_intermediates(torch_model, flax32, *as_inputs(*sample_batch(config, seed=seed)))
    assert [r.name for r in report.rows] == list(float32_rows)
    assert sum(".norm" in r.name for r in report.rows) == 5 * config.num_layers
    # The twin computed in bfloat16 throughout, and the check measures bfloat16's rounding: the
    # nearest row is a sizeable share of its tolerance (the float32 twin's differences, about
    # 1e-6, would be under 1e-4 of it).
    assert {r.dtype for r in report.rows} == {"bfloat16"}
    assert report.largest.share > 0.1, report.format_table()


def test_a_layer_norm_epsilon_slip_fails_at_its_layer_in_bfloat16_too():
    # check.py's planted fault: epsilon 1e-1 for torch's 1e-5 in one LayerNorm. Measured on CPU
    # (seed 0): it moves that row by 4.6% of its largest value, where bfloat16's rounding moves
    # it by 0.72% and the tolerance at its depth (2) is 2.7%.
    config = fm.get_preset("tiny")
    torch_model, _ = transformer_pair(config)
    flax_model = bfloat16_twin(torch_model, config)
    flax_model.encoder.transformer_layers[1].norm2.epsilon = 1e-1
    report = check_bfloat16(torch_model, flax_model, config)
    assert not report.ok
    assert report.first_divergence.name == "encoder.transformer_layers.1.norm2"
    assert "first divergence: encoder.transformer_layers.1.norm2" in report.format_table()


def test_each_rows_depth_counts_the_blocks_before_it():
    L = 6
    for name, depth in (("encoder.embedding_layer", 0), ("encoder.dropout", 0), ("encoder.transformer_layers.0", 1),
                        ("encoder.transformer_layers.5.attention.W_q", 6), ("encoder", 6),
                        ("decoder.positional_embedding", 0), ("decoder.decoder_layers.0.norm", 7),
                        ("decoder.decoder_layers.5.transformer_block.fc.2", 12), ("decoder.fc", 13), ("", 13),
                        ("encoder.transformer_layers.10", 11)):
        assert depth_of(name, L) == depth, name


def test_the_command_prints_and_writes_each_row_and_refuses_bad_options(tmp_path, capsys, request):
    out = tmp_path / "bf16.json"
    device = request.config.getoption("--torch-device")
    assert main(["--presets", "tiny", "--torch-device", device, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "all 74 rows within tolerance" in printed and f"torch on {device}" in printed
    (report,) = json.loads(out.read_text())["reports"]
    assert report["preset"] == "tiny" and report["ok"] and len(report["rows"]) == 74
    assert {"name", "depth", "dtype", "max_abs", "scale", "tolerance", "share", "ok"} <= set(report["rows"][0])
    for argv, message in ((["--batch", "0"], "--batch must be in [1, 1024], got 0"),
                          (["--json", str(tmp_path / "no" / "r.json")], "does not exist"),
                          (["--torch-device", "nonsense"], "--torch-device: torch device 'nonsense'")):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err, argv
