"""Parity as a tool: ``parity check --torch-checkpoint`` and ``parity convert`` on files.

Checkpoints come from the seed's own classes (``tests/seed_classes.py``) and from
``torch_ref``, with distinct, non-default sizes (vocabularies 23/19, max_len 17, width 30,
5 heads, 2 layers), so each size is read from its own tensor and a swapped axis shows.

Properties checked:
- every size is inferred from the shapes; heads and padding come from options, a JSON
  config file (options override it) or the seed's defaults;
- a good checkpoint checks clean (exit 0) and the report names every landmark; ``--json``
  holds the whole report, ``--plot`` writes an image, ``--grads`` adds the loss and one
  gradient row per parameter in torch's order, all within tolerance;
- a planted numerical fault in the Flax twin is named as the first divergence;
- unusable input exits 2 with a message naming the key, file or option, and no traceback;
  ``python -m parity.bfloat16 --json`` replaces an existing file only with --force, and
  --force without --json is refused;
- a model whose parameters and gradients alone exceed the memory free is refused before the
  twins are built; a --batch whose records of both twins' outputs exceed it, before the
  comparison; each naming both figures and what to do;
- ``convert`` torch -> Flax -> torch is bit-exact on files, through .safetensors and orbax;
- the config travels with the weights: a torch .safetensors export records it in its
  metadata (torch_ref loads the file strictly), check and convert read it back, a .pt export
  is the state dict alone; a setting no one gave (a 4-head model without --heads) is warned
  of by name with its option and marked assumed in the output; a run's config.json or
  directory serves as --config, and check takes the run itself.

Most runs call ``parity.cli.main`` in-process (JAX's compiled primitives are then shared
between tests); one, the sigpipe test, goes through ``python -m parity check``, end to end. The
checks of models of SIZES run at batch 2, as that process does (the tiny preset's model has the
same shapes), so their programs compile once: a check's batch size is none of the properties here.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open

import torch_ref
from flaxformer_mini.model.config import ModelConfig
from parity import (
    ConversionError,
    check_checkpoint,
    check_twins,
    flax_params_from_state_dict,
    infer_config,
    load_flax_params,
    load_state_dict,
    params_into_model,
    plot_report,
    save_flax_params,
    save_state_dict,
    twins_from_state_dict,
)
from parity.cli import main
from parity.infer import DEFAULTS

import seed_classes
from conftest import ATOL

# Non-default sizes; dropout 0.1 differs from the seed's 0.2 and cannot be read from shapes.
SIZES = dict(src_pad_idx=0, source_vocab_size=23, target_vocab_size=19, max_len=17, embed_size=30, heads=5,
             num_layers=2, dropout=0.1)
LANDMARKS = ["encoder.embeddings", "encoder.transformer_layers.0", "encoder.transformer_layers.1", "encoder",
             "decoder.embeddings", "decoder.decoder_layers.0", "decoder.decoder_layers.1", "decoder.fc", "logits"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def seed_state_dict():
    torch.manual_seed(7)
    return seed_classes.Transformer(**SIZES).state_dict()


@pytest.fixture(scope="module")
def checkpoint(seed_state_dict, tmp_path_factory):
    """The seed classes' state dict saved as .pt, as a seed user would."""
    path = tmp_path_factory.mktemp("ckpt") / "seed.pt"
    torch.save(seed_state_dict, path)
    return path


def write(tmp_path, name, state_dict):
    path = tmp_path / name
    save_state_dict(state_dict, path)
    return str(path)


_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}


def assert_bit_identical(got, want):
    assert list(got) == list(want), "keys differ (or their order)"
    for key, b in want.items():
        a = got[key]
        assert a.dtype == b.dtype and a.shape == b.shape, key
        bits = _BITS[b.dtype]
        assert torch.equal(a.contiguous().view(bits), b.contiguous().view(bits)), f"{key}: bits differ"


# ----------------------------------------------------------------------------- inference


@pytest.mark.parametrize("source", ["seed_classes", "torch_ref"])
@pytest.mark.parametrize("sizes", [
    SIZES,
    dict(src_pad_idx=3, source_vocab_size=11, target_vocab_size=13, max_len=7, embed_size=12, heads=4,
         num_layers=3, dropout=0.0),
])
def test_every_size_is_inferred_from_the_shapes(source, sizes):
    module = seed_classes if source == "seed_classes" else torch_ref
    state_dict = module.Transformer(**sizes).state_dict()
    config = infer_config(state_dict, heads=sizes["heads"], src_pad_idx=sizes["src_pad_idx"])
    assert config == ModelConfig(**{**sizes, "dropout": DEFAULTS["dropout"]})


def test_heads_and_padding_default_to_the_seeds():
    sizes = dict(SIZES, embed_size=16, heads=8)  # 8 divides 16
    config = infer_config(torch_ref.Transformer(**sizes).state_dict())
    assert (config.heads, config.src_pad_idx) == (8, 0) == (DEFAULTS["heads"], DEFAULTS["src_pad_idx"])


def test_options_override_the_config_file_which_overrides_the_defaults(seed_state_dict):
    config = infer_config(seed_state_dict, overrides={"heads": 3, "src_pad_idx": 2, "dropout": 0.1})
    assert (config.heads, config.src_pad_idx, config.dropout) == (3, 2, 0.1)
    config = infer_config(seed_state_dict, heads=5, src_pad_idx=1, overrides={"heads": 3, "src_pad_idx": 2})
    assert (config.heads, config.src_pad_idx) == (5, 1)
    # A size in the file that agrees with the shapes is fine (e.g. a whole ModelConfig dumped).
    assert infer_config(seed_state_dict, overrides=dict(SIZES)) == ModelConfig(**SIZES)


@pytest.mark.parametrize("mutate, message", [
    (lambda sd: sd.update({"encoder.embedding_layer.wieght": sd.pop("encoder.embedding_layer.weight")}),
     "missing key 'encoder.embedding_layer.weight' (did you mean 'encoder.embedding_layer.wieght'?)"),
    # Another architecture altogether (a porter's own model): the library is the way.
    (lambda sd: (sd.clear(), sd.update({"embed.weight": torch.zeros(3, 4)})),
     "`parity check` and `parity convert` build that architecture only; a model of your own converts and "
     "compares through the library (parity.torch_to_flax, parity.compare: docs/porting.md)"),
    # Another Transformer (nn.TransformerEncoder's names): an "encoder.*" key is near in name
    # only, so no "did you mean", and the same way out.
    (lambda sd: (sd.clear(), sd.update({"encoder.layers.1.norm2.weight": torch.zeros(4)})),
     "missing key 'encoder.embedding_layer.weight'; is this a state dict of this project's Transformer "
     "(torch_ref.Transformer, the seed tutorials' model)? `parity check` and `parity convert` build that "
     "architecture only"),
    (lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("decoder.decoder_layers.1.")],
     "encoder and decoder depths disagree: encoder.transformer_layers has 2 blocks, decoder.decoder_layers has 1"),
    (lambda sd: sd.update({"decoder.positional_embedding.weight": torch.zeros(16, 30)}),
     "max_len disagrees: 'encoder.positional_encoding.weight' has 17 positions, "
     "'decoder.positional_embedding.weight' has 16"),
    (lambda sd: sd.update({"decoder.embedding_layer.weight": torch.zeros(19, 31)}),
     "'decoder.embedding_layer.weight' has 31"),
])
def test_inference_errors_name_the_key(seed_state_dict, mutate, message):
    state_dict = dict(seed_state_dict)
    mutate(state_dict)
    with pytest.raises(ConversionError) as info:
        infer_config(state_dict, heads=5)
    assert message in str(info.value)


# ----------------------------------------------------------------------------- check: end to end


@pytest.mark.parametrize(("prefix", "whose"), [("module.", "a DistributedDataParallel or DataParallel wrapper's"),
                                              ("_orig_mod.", "torch.compile's wrapper's")])
def test_a_checkpoint_of_a_wrapped_model_is_said_with_its_prefix_not_as_another_architecture(
        seed_state_dict, tmp_path, capsys, prefix, whose):
    path = tmp_path / "wrapped.pt"
    torch.save({prefix + k: v for k, v in seed_state_dict.items()}, path)
    for args in (["check", "--torch-checkpoint", str(path), "--heads", "5"],
                 ["convert", str(path), str(tmp_path / "out.safetensors"), "--heads", "5"]):
        assert main(args) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"parity {args[0]}: error: cannot infer the model config: missing key 'encoder.embedding_layer.weight', "
            f"which the state dict holds as '{prefix}encoder.embedding_layer.weight': its keys have {prefix!r} before "
            f"them ({whose}); strip it, {{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}, and save "
            f"the state dict again"]
    assert not (tmp_path / "out.safetensors").exists()


def test_a_checkpoint_with_a_key_that_is_not_a_string_is_refused_in_one_line(seed_state_dict, tmp_path, capsys):
    path = tmp_path / "int_key.pt"
    torch.save({**seed_state_dict, 7: torch.zeros(3)}, path)  # torch.save keeps a dict's int keys
    for args in (["check", "--torch-checkpoint", str(path), "--heads", "5"],
                 ["convert", str(path), str(tmp_path / "out.safetensors"), "--heads", "5"]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.splitlines() == [f"parity {args[0]}: error: state dict does not fit Transformer:",
                                    "  unexpected key 7"]
    assert not (tmp_path / "out.safetensors").exists()


def test_check_of_a_seed_checkpoint_exits_0_names_every_landmark_and_writes_json_and_plot(checkpoint, tmp_path,
                                                                                          capsys):
    report, plot = tmp_path / "report.json", tmp_path / "report.png"
    # In process (`parity` as a process: the sigpipe test below). --batch 2: the shapes of that
    # test's check (the tiny preset's model) and of the other checks here, which share its programs.
    code = main(["check", "--torch-checkpoint", str(checkpoint), "--heads", "5", "--batch", "2", "--json", str(report),
                 "--plot", str(plot)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "vocab 23/19, max_len 17, embed 30, ffn 30, 5 heads (--heads" in out
    table = out.splitlines()
    for name in LANDMARKS:
        assert any(line.startswith(name + " ") for line in table), name
    assert f"intermediates within {ATOL:g}" in out

    data = json.loads(report.read_text())
    assert data["ok"] is True and data["first_divergence"] is None and data["atol"] == ATOL
    labels = [row["label"] for row in data["rows"]]
    assert [labels.index(n) for n in LANDMARKS] == sorted(labels.index(n) for n in LANDMARKS)  # execution order
    assert all(row["ok"] and row["max_abs"] <= ATOL and row["kind"] == "intermediate" for row in data["rows"])
    assert len(data["rows"]) > len(LANDMARKS)  # every submodule, not only the landmarks
    assert plot.read_bytes().startswith(PNG_MAGIC)


def test_check_reads_heads_and_padding_from_a_config_file(seed_state_dict, tmp_path, capsys):
    path = write(tmp_path, "model.safetensors", seed_state_dict)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"heads": 5, "src_pad_idx": 2}))
    assert main(["check", "--torch-checkpoint", path, "--config", str(config_file), "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "5 heads (config file" in out and "src_pad_idx 2 (config file)" in out
    # An option overrides the file: 7 does not divide 30.
    assert main(["check", "--torch-checkpoint", path, "--config", str(config_file), "--heads", "7"]) == 2
    err = capsys.readouterr().err
    assert "heads=7 does not divide the model width D=30" in err and "assumed" not in err
    # A value of another type in the file: the field and the value named, in one line.
    config_file.write_text(json.dumps({"heads": 5, "dropout": "x"}))
    assert main(["check", "--torch-checkpoint", path, "--config", str(config_file), "--batch", "2"]) == 2
    err = capsys.readouterr().err
    assert "dropout must be a number in [0, 1), got 'x'" in err and "Traceback" not in err
    # Nothing says the heads: the seed's 8 is assumed, and the refusal says so and names --heads.
    assert main(["check", "--torch-checkpoint", path]) == 2
    err = capsys.readouterr().err
    assert ("heads=8 (the seed value, assumed: no --heads, config or metadata gave it) does not divide the model "
            "width D=30") in err and err.rstrip().endswith("give the model's with --heads"), err


def test_check_of_a_torch_ref_checkpoint_with_gradients_adds_a_row_per_parameter_in_torch_order(tmp_path, capsys):
    torch.manual_seed(3)
    model = torch_ref.Transformer(**SIZES)
    path = write(tmp_path, "model.pt", model.state_dict())
    report = tmp_path / "report.json"
    # --batch 2, as test_parity_float64.py's command-line gradient check: one gradient program for both.
    code = main(["check", "--torch-checkpoint", path, "--heads", "5", "--grads", "--json", str(report),
                 "--torch-device", "cpu", "--batch", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "the loss and 90 gradients within 1e-05" in out
    assert "torch on cpu, JAX on cpu" in out  # where each twin ran is part of the evidence

    rows = json.loads(report.read_text())["rows"]
    grads = [row for row in rows if row["kind"] == "gradient"]
    assert [row["name"] for row in grads] == [f"grad:{name}" for name, _ in model.named_parameters()]
    assert [row["name"] for row in rows if row["kind"] == "loss"] == ["loss"]
    assert all(row["ok"] and row["max_abs"] <= ATOL for row in rows)
    # The key bias's gradient is zero in exact arithmetic: both sides give rounding noise only.
    key_bias = [row for row in grads if row["name"].endswith("attention.W_k.bias")]
    assert len(key_bias) == 3 * SIZES["num_layers"] and all(row["max_abs"] < 1e-8 for row in key_bias)
    # Not vacuous: some gradient rows differ by more than nothing, and shapes are torch's.
    assert any(row["max_abs"] > 0 for row in grads)
    assert grads[0]["shape"] == list(dict(model.named_parameters())[grads[0]["name"][5:]].shape)


# ----------------------------------------------------------------------------- check: planted faults


@pytest.fixture
def twins(checkpoint):
    state_dict = load_state_dict(checkpoint)
    config = infer_config(state_dict, heads=5)
    return (*twins_from_state_dict(state_dict, config), config)


def test_planted_layer_norm_fault_is_named_as_the_first_divergence(twins, tmp_path):
    torch_model, flax_model, config = twins
    flax_model.encoder.transformer_layers[1].norm2.epsilon = 1e-1  # torch keeps 1e-5
    report = check_twins(torch_model, flax_model, config, batch=2)
    assert not report.ok
    assert report.first_divergence.name == "encoder.transformer_layers.1.norm2"
    before = report.rows[: report.rows.index(report.first_divergence)]
    assert before and all(row.ok for row in before)
    assert "first divergence: encoder.transformer_layers.1.norm2" in report.format_table()
    # The picture of a failing report is drawn too (the annotation of the first divergence).
    assert plot_report(report, tmp_path / "fault.png").read_bytes().startswith(PNG_MAGIC)


def test_check_checkpoint_of_the_unmodified_state_dict_is_ok(checkpoint):
    state_dict = load_state_dict(checkpoint)
    report = check_checkpoint(state_dict, infer_config(state_dict, heads=5), batch=2, seed=1)
    assert report.ok and report.first_divergence is None


def test_check_exits_1_and_names_the_first_divergence_beyond_tolerance(checkpoint, capsys):
    assert main(["check", "--torch-checkpoint", str(checkpoint), "--heads", "5", "--batch", "2", "--atol", "0"]) == 1
    assert "first divergence: " in capsys.readouterr().out


# ----------------------------------------------------------------------------- check: unusable input


@pytest.mark.parametrize("args, message", [
    (["--heads", "7"], "heads=7 does not divide the model width D=30"),
    (["--heads", "5", "--pad-idx", "23"], "src_pad_idx=23 is outside the source vocabulary [0, 23)"),
    (["--heads", "5", "--plot", "out.gif"], "--plot out.gif: unknown image type '.gif'"),
    (["--heads", "5", "--json", "no/such/dir/report.json"], "--json no/such/dir/report.json: the directory"),
    (["--heads", "5", "--torch-device", "gpu0"], "torch device 'gpu0': not a device torch knows"),
    (["--heads", "5", "--seed", "-1"], "--seed must be between 0 and 2**63-1, got -1"),
    (["--heads", "5", "--seed", str(2**63)], f"--seed must be between 0 and 2**63-1, got {2**63}"),
    (["--heads", "5", "--batch", "1025"], "--batch must be at most 1024 (every intermediate of both twins is held"),
    (["--heads", "5", "--torch-device", "meta"], "torch device 'meta': meta tensors hold shapes, not values"),
    pytest.param(["--heads", "5", "--torch-device", "cuda"], "torch device 'cuda': torch sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this torch sees a CUDA device")),
])
def test_unusable_options_exit_2_naming_the_option(checkpoint, args, message, capsys):
    assert main(["check", "--torch-checkpoint", str(checkpoint), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_model_beyond_the_free_memory_is_refused_before_the_twins_are_built(checkpoint, tmp_path, monkeypatch,
                                                                             capsys):
    from flaxformer_mini.model import memory

    def built(*args, **kwargs):
        raise AssertionError("the twins were built")

    monkeypatch.setattr("parity.twins.transformer_pair", built)
    monkeypatch.setattr("parity.twins.twins_from_state_dict", built)
    monkeypatch.setattr(memory, "free_bytes", lambda device=None: (0, "this machine's available memory"))
    report = tmp_path / "report.json"
    # 33,229 parameters: 8 bytes each in the two float32 twins, 16 with the float64 copy, twice
    # that with the gradients of each.
    for options, held, size in [([], "", "0 MiB"),
                                (["--float64-reference", "--grads"],
                                 " and the torch twin's float64 copy, with their gradients", "1 MiB")]:
        assert main(["check", "--torch-checkpoint", str(checkpoint), "--heads", "5", "--pad-idx", "0",
                     *options, "--json", str(report)]) == 2
        assert capsys.readouterr().err.strip() == (
            f"parity check: error: checkpoint {checkpoint}: its 33,229 parameters in both twins{held} take at least "
            f"{size}, more than the 0 MiB (this machine's available memory) free: check it on a machine with more "
            f"memory")
        assert not report.exists()


def test_the_model_estimate_counts_each_copy_the_check_holds():
    from parity.check_memory import model_bytes
    from parity.twins import transformer_pair

    config = ModelConfig(src_pad_idx=0, source_vocab_size=11, target_vocab_size=13, max_len=7, embed_size=8, heads=2,
                         num_layers=2, dropout=0.0)
    n = sum(p.numel() for p in transformer_pair(config)[0].parameters())  # counted on the torch twin itself
    assert model_bytes(config) == 8 * n
    assert model_bytes(config, grads=True) == 16 * n
    assert model_bytes(config, float64_reference=True) == 16 * n
    assert model_bytes(config, float64_reference=True, grads=True) == 32 * n


class Compared(Exception):
    pass


def test_a_batch_whose_records_exceed_the_free_memory_is_refused_before_the_comparison(tmp_path, monkeypatch,
                                                                                        capsys):
    """The seed preset at --batch 1024 records 7.3 GiB of outputs (202 of them, 962,264 elements a
    row, 8 bytes each), where one train step of it takes 0.43 GiB: 2 GiB free refuses the
    first and would pass the second. --batch 4 at the same memory reaches the comparison."""
    from flaxformer_mini.model import memory

    def compared(*args, **kwargs):
        raise Compared

    monkeypatch.setattr("parity.check.check_twins", compared)
    monkeypatch.setattr(memory, "free_bytes", lambda device=None: (2 * 2**30, "this machine's available memory"))
    report = tmp_path / "report.json"
    assert main(["check", "--preset", "seed", "--batch", "1024", "--json", str(report)]) == 2
    assert capsys.readouterr().err.strip() == (
        "parity check: error: --batch 1024 of preset seed (max_len 10, width 512, 6+6 layers) records every "
        "submodule output of both twins, 7.3 GiB, more than the 2.0 GiB (this machine's available memory) free: "
        "give a smaller --batch")
    assert not report.exists()
    with pytest.raises(Compared):
        main(["check", "--preset", "seed", "--batch", "4"])

def test_a_batch_is_refused_by_the_hosts_memory_where_the_records_are_kept(tmp_path, monkeypatch, capsys):
    """On an accelerator, ``memory.shortfall`` reads the device's free memory; the records are
    numpy arrays on the host, whose 2 GiB the seed preset's 7.3 GiB at --batch 1024 exceed."""
    from flaxformer_mini.model import memory

    def free_bytes(device=None):
        if device is not None and device.platform == "cpu":
            return 2 * 2**30, "this machine's available memory"
        return 1000 * 2**30, "an accelerator's memory"

    monkeypatch.setattr("parity.check.check_twins", lambda *a, **k: (_ for _ in ()).throw(Compared()))
    monkeypatch.setattr(memory, "free_bytes", free_bytes)
    assert main(["check", "--preset", "seed", "--batch", "1024"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "records every submodule output of both twins, 7.3 GiB, more than the 2.0 GiB (this machine's available "
        "memory) free: give a smaller --batch")


def test_check_replaces_no_existing_file_unasked_and_never_the_checkpoint_it_checks(checkpoint, tmp_path, capsys):
    before = checkpoint.read_bytes()
    report = tmp_path / "report.json"
    report.write_text("an earlier report")
    for args, message in [
        (["--json", str(report)], f"--json {report}: already exists (a file); nothing was written. Give --force"),
        (["--json", str(checkpoint), "--force"], f"--json {checkpoint}: is the checkpoint being checked"),
        (["--plot", str(checkpoint.with_suffix(".png")), "--json", str(checkpoint.with_suffix(".png"))],
         "--json and --plot are the same path"),
    ]:
        assert main(["check", "--torch-checkpoint", str(checkpoint), "--heads", "5", "--batch", "2", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert checkpoint.read_bytes() == before and report.read_text() == "an earlier report"
    assert main(["check", "--torch-checkpoint", str(checkpoint), "--heads", "5", "--batch", "2", "--json", str(report),
                 "--force"]) == 0
    assert json.loads(report.read_text())["ok"] is True  # --force replaces it, whole


def test_the_bfloat16_check_replaces_no_json_file_unasked(tmp_path, capsys):
    from parity import bfloat16

    report = tmp_path / "bf16.json"
    report.write_text("an earlier report")
    with pytest.raises(SystemExit) as stop:
        bfloat16.main(["--presets", "tiny", "--json", str(report)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"python -m parity.bfloat16: error: --json {report}: already exists (a file); nothing was written. "
        f"Give --force to replace it, or choose another path")
    assert report.read_text() == "an earlier report"


def test_summaries_of_check_and_convert_name_the_feed_forward_width(tmp_path, capsys):
    torch.manual_seed(0)
    path = write(tmp_path, "wide.pt", torch_ref.Transformer(**SIZES, ffn_dim=46).state_dict())
    assert main(["check", "--torch-checkpoint", path, "--heads", "5", "--batch", "2"]) == 0
    assert "embed 30, ffn 46, 5 heads" in capsys.readouterr().out
    assert main(["convert", path, str(tmp_path / "wide.safetensors"), "--heads", "5"]) == 0
    assert "embed 30, ffn 46, 5 heads" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "wide.safetensors"), str(tmp_path / "back.pt")]) == 0
    assert "embed 30, ffn 46, 5 heads" in capsys.readouterr().out


def test_a_reader_that_stops_early_ends_check_quietly_with_the_sigpipe_code(tmp_path):
    # `parity check | head -1`: stdout's reader is gone before the table is written.
    proc = subprocess.Popen([sys.executable, "-m", "parity", "check", "--preset", "tiny", "--batch", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, err
    assert err == "", err  # no "[Errno 32] Broken pipe", no "Exception ignored ... BrokenPipeError"


def test_preset_and_checkpoint_are_mutually_exclusive_and_checkpoint_options_need_a_checkpoint(checkpoint, capsys):
    assert main(["check", "--preset", "tiny", "--torch-checkpoint", str(checkpoint)]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["check", "--preset", "tiny", "--heads", "5"]) == 2
    assert "--heads applies to --torch-checkpoint only" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["decoder.decoder_layers.1.norm.bias", "encoder.positional_encoding.weight"])
def test_state_dict_with_a_missing_key_exits_2_naming_it(seed_state_dict, tmp_path, key, capsys):
    state_dict = dict(seed_state_dict)
    del state_dict[key]
    assert main(["check", "--torch-checkpoint", write(tmp_path, "model.pt", state_dict), "--heads", "5"]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err


def test_state_dict_with_an_unexpected_key_exits_2_naming_it(seed_state_dict, tmp_path, capsys):
    state_dict = dict(seed_state_dict, **{"encoder.extra.weight": torch.zeros(3)})
    assert main(["check", "--torch-checkpoint", write(tmp_path, "model.safetensors", state_dict), "--heads", "5"]) == 2
    assert "encoder.extra.weight" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_truncated_checkpoint_exits_2_naming_the_file(seed_state_dict, tmp_path, suffix, capsys):
    path = tmp_path / f"model{suffix}"
    save_state_dict(seed_state_dict, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert main(["check", "--torch-checkpoint", str(path), "--heads", "5"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "truncated or corrupt" in err


# ----------------------------------------------------------------------------- convert


@pytest.mark.parametrize("flax_out, torch_back", [("flax.safetensors", "back.pt"), ("flax_orbax", "back.safetensors")])
def test_convert_round_trip_is_bit_exact_on_files(checkpoint, seed_state_dict, tmp_path, flax_out, torch_back, capsys):
    flax_path, back = tmp_path / flax_out, tmp_path / torch_back
    assert main(["convert", str(checkpoint), str(flax_path), "--heads", "5", "--pad-idx", "2"]) == 0
    assert main(["convert", str(flax_path), str(back)]) == 0
    back_state_dict = load_state_dict(back)
    if torch_back.endswith(".pt"):
        assert_bit_identical(back_state_dict, seed_state_dict)  # the seed's key order too
    else:  # safetensors stores keys sorted
        assert_bit_identical(dict(sorted(back_state_dict.items())), dict(sorted(seed_state_dict.items())))

    # In between: Flax paths, Flax layout, the inferred config beside them.
    params, config = load_flax_params(flax_path)
    assert config == ModelConfig(**dict(SIZES, src_pad_idx=2, dropout=DEFAULTS["dropout"]))
    kernel = params["encoder/transformer_layers/0/attention/W_q/kernel"]
    assert np.array_equal(kernel, seed_state_dict["encoder.transformer_layers.0.attention.W_q.weight"].numpy().T)
    assert np.array_equal(params["decoder/decoder_layers/1/transformer_block/fc/2/bias"],
                          seed_state_dict["decoder.decoder_layers.1.transformer_block.fc.2.bias"].numpy())
    assert len(params) == len(seed_state_dict)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_convert_keeps_every_dtype_bit_for_bit(seed_state_dict, tmp_path, dtype):
    # The arrays never pass through JAX, which would narrow float64 without jax_enable_x64.
    state_dict = {k: v.to(dtype) for k, v in seed_state_dict.items()}
    path = write(tmp_path, "model.pt", state_dict)
    assert main(["convert", path, str(tmp_path / "flax.safetensors"), "--heads", "5"]) == 0
    assert main(["convert", str(tmp_path / "flax.safetensors"), str(tmp_path / "back.pt")]) == 0
    assert_bit_identical(load_state_dict(tmp_path / "back.pt"), state_dict)


def test_flax_safetensors_holds_flax_paths_and_the_config_in_its_metadata(checkpoint, tmp_path):
    path = tmp_path / "flax.safetensors"
    assert main(["convert", str(checkpoint), str(path), "--heads", "5"]) == 0
    with safe_open(path, framework="numpy") as f:
        keys, metadata = set(f.keys()), f.metadata()
        assert f.get_tensor("encoder/embedding_layer/embedding").shape == (23, 30)
        assert f.get_tensor("decoder/fc/kernel").shape == (30, 19)  # torch's decoder.fc.weight is (19, 30)
    assert "encoder/transformer_layers/0/attention/W_q/kernel" in keys and not any("." in k for k in keys)
    assert json.loads(metadata["model_config"])["heads"] == 5


def test_converted_flax_parameters_compute_what_the_torch_checkpoint_computes(checkpoint, seed_state_dict, tmp_path):
    import flaxformer_mini as fm
    from flax import nnx

    flax_path = tmp_path / "flax.safetensors"
    assert main(["convert", str(checkpoint), str(flax_path), "--heads", "5"]) == 0
    params, config = load_flax_params(flax_path)
    flax_model = params_into_model(params, fm.Transformer.from_config(config, rngs=nnx.Rngs(0)))
    flax_model.eval()
    torch_model = torch_ref.Transformer(**config.to_dict()).eval()
    torch_model.load_state_dict(seed_state_dict, strict=True)
    # A padded row and a full one, at max_len (17 and 16 positions): the shapes of the checks' batches
    # of 2, whose compiled primitives this forward pass reuses.
    source = np.array([[1, 5, 22, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                       [4, 4, 9, 17, 2, 8, 13, 21, 6, 1, 19, 11, 7, 22, 15, 3, 10]])
    target = np.array([[1, 18, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                       [3, 7, 11, 5, 16, 9, 1, 14, 18, 4, 12, 8, 17, 2, 6, 10]])
    with torch.no_grad():
        want = torch_model(torch.from_numpy(source), torch.from_numpy(target)).numpy()
    got = np.asarray(flax_model(source, target))
    assert np.abs(got - want).max() <= ATOL


@pytest.mark.parametrize("make_args, message", [
    (lambda d, ckpt: [d / "model.npz", d / "flax.safetensors"], "unknown checkpoint type '.npz'"),
    (lambda d, ckpt: [ckpt, d / "flax.npz"], "not '.npz'"),
    (lambda d, ckpt: [ckpt, d / "back.pt"], "a torch checkpoint converts to Flax parameters"),
    (lambda d, ckpt: [d / "missing.pt", d / "flax.safetensors"], "no such file"),
    (lambda d, ckpt: [d / "missing_dir", d / "back.pt"], "missing_dir: no such file or directory"),
    (lambda d, ckpt: [d / "empty", d / "back.pt"], "empty: neither a training run (it has no config.json) nor Flax "
                                                   "parameters written by `parity convert` (it has no 'config' item)"),
])
def test_convert_with_an_unusable_path_exits_2(checkpoint, tmp_path, make_args, message, capsys):
    (tmp_path / "model.npz").write_bytes(b"not a checkpoint")
    (tmp_path / "empty").mkdir()
    assert main(["convert", *map(str, make_args(tmp_path, checkpoint))]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_convert_of_flax_parameters_with_mismatching_keys_exits_2_naming_them(seed_state_dict, tmp_path, capsys):
    config = infer_config(seed_state_dict, heads=5)
    params = flax_params_from_state_dict(seed_state_dict, config)
    params["decoder/fc/kernel_typo"] = params.pop("decoder/fc/kernel")
    path = tmp_path / "flax.safetensors"
    save_flax_params(params, config, path)
    assert main(["convert", str(path), str(tmp_path / "back.pt")]) == 2
    err = capsys.readouterr().err
    assert "missing parameter 'decoder/fc/kernel'" in err and "unexpected parameter 'decoder/fc/kernel_typo'" in err
    assert not (tmp_path / "back.pt").exists()


def test_convert_of_a_torch_checkpoint_with_an_extra_key_exits_2_naming_it(seed_state_dict, tmp_path, capsys):
    path = write(tmp_path, "model.pt", dict(seed_state_dict, **{"decoder.fc.scale": torch.ones(19)}))
    assert main(["convert", path, str(tmp_path / "flax.safetensors"), "--heads", "5"]) == 2
    assert "unexpected key 'decoder.fc.scale'" in capsys.readouterr().err
    assert not (tmp_path / "flax.safetensors").exists()


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_convert_of_flax_parameters_with_an_integer_weight_exits_2_naming_it_as_torch_to_flax_does(
        seed_state_dict, tmp_path, dtype, capsys):
    # torch -> Flax refuses an integer weight by key (check_torch); Flax -> torch must too, or
    # torch_ref's load_state_dict would silently cast it back to float.
    config = infer_config(seed_state_dict, heads=5)
    params = flax_params_from_state_dict(seed_state_dict, config)
    params["decoder/fc/bias"] = params["decoder/fc/bias"].astype(dtype)
    path = tmp_path / "flax.safetensors"
    save_flax_params(params, config, path)
    assert main(["convert", str(path), str(tmp_path / "back.pt")]) == 2
    err = capsys.readouterr().err
    assert f"invalid value for 'decoder/fc/bias': dtype {np.dtype(dtype)} is not a floating-point dtype" in err
    assert "Traceback" not in err and not (tmp_path / "back.pt").exists()
    with pytest.raises(ConversionError) as info:  # the API refuses it the same way
        params_into_model(params, twins_from_state_dict(seed_state_dict, config)[1])
    assert info.value.invalid == {"decoder/fc/bias": f"dtype {np.dtype(dtype)} is not a floating-point dtype"}


# ----------------------------------------------------------------------------- the config travels with the weights


def metadata_of(path):
    with safe_open(path, framework="numpy") as f:
        return f.metadata() or {}


def test_an_export_to_safetensors_records_its_config_which_torch_ref_loads_strictly_and_parity_reads_back(
        checkpoint, tmp_path, capsys):
    from safetensors.torch import load_file

    known = tmp_path / "model_config.json"
    known.write_text(json.dumps({"heads": 5, "src_pad_idx": 2, "dropout": 0.1}))
    want = ModelConfig(**dict(SIZES, src_pad_idx=2))
    flax_path, back, again = tmp_path / "flax.safetensors", tmp_path / "back.safetensors", tmp_path / "again.safetensors"
    assert main(["convert", str(checkpoint), str(flax_path), "--config", str(known)]) == 0
    assert main(["convert", str(flax_path), str(back)]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # everything was given: nothing assumed
    metadata = metadata_of(back)
    assert metadata["format"] == "flaxformer_mini.torch_state_dict" and "assumed_config" not in metadata
    config = json.loads(metadata["model_config"])
    assert config == want.to_dict()
    torch_ref.Transformer(**config).load_state_dict(load_file(back), strict=True)  # the metadata is invisible to torch
    assert "load it with: torch_ref.Transformer(src_pad_idx=2, source_vocab_size=23" in out

    # Read back without a single option: heads, padding and dropout come from the metadata.
    assert main(["convert", str(back), str(again)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "5 heads (file metadata)" in out and "dropout 0.1 (file metadata)" in out
    assert load_flax_params(again)[1] == want
    assert main(["check", "--torch-checkpoint", str(back), "--batch", "2"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "5 heads (file metadata; not in the weights)" in out and "src_pad_idx 2 (file metadata)" in out
    # An option still overrides the record, with a word that it does.
    assert main(["convert", str(back), str(tmp_path / "three.safetensors"), "--heads", "3"]) == 0
    assert f"heads 3 (--heads) overrides heads 5 recorded in {back}'s metadata" in capsys.readouterr().err
    assert load_flax_params(tmp_path / "three.safetensors")[1] == want.replace(heads=3)


def test_a_pt_export_is_the_state_dict_alone_and_says_where_the_config_goes(checkpoint, tmp_path, capsys):
    flax_path, back = tmp_path / "flax.safetensors", tmp_path / "back.pt"
    assert main(["convert", str(checkpoint), str(flax_path), "--heads", "5"]) == 0
    capsys.readouterr()
    assert main(["convert", str(flax_path), str(back)]) == 0
    out = capsys.readouterr().out
    state_dict = torch.load(back, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state_dict.values())  # nothing extra: strict loading works
    torch_ref.Transformer(**SIZES).load_state_dict(state_dict, strict=True)
    assert "the state dict alone, for strict loading; write .safetensors to carry the config in the file" in out
    assert "torch_ref.Transformer(src_pad_idx=0, source_vocab_size=23, target_vocab_size=19, max_len=17, " in out


FOUR_HEADS = dict(src_pad_idx=0, source_vocab_size=11, target_vocab_size=13, max_len=7, embed_size=16, heads=4,
                  num_layers=1, dropout=0.1)


def test_a_four_head_model_converted_without_heads_is_warned_of_each_assumed_setting_and_marked_assumed(
        tmp_path, capsys):
    torch.manual_seed(0)
    path = write(tmp_path, "four_heads.pt", torch_ref.Transformer(**FOUR_HEADS).state_dict())
    flax_path, back = tmp_path / "flax.safetensors", tmp_path / "back.safetensors"
    assert main(["convert", path, str(flax_path)]) == 0  # 8 divides 16: the seed's guess is accepted, not hidden
    out, err = capsys.readouterr()
    assert err.strip() == (
        "parity convert: warning: neither the weights nor the options say these settings, so they are assumed "
        "(the seed's): heads 8 (set with --heads), src_pad_idx 0 (set with --pad-idx), dropout 0.2 (set with "
        "\"dropout\" in --config); OUT's metadata marks them assumed")
    assert "8 heads (default)" in out and "dropout 0.2 (default)" in out and "marked assumed" in out
    assert json.loads(metadata_of(flax_path)["assumed_config"]) == ["dropout", "heads", "src_pad_idx"]

    # The guess travels on, marked, into the torch export, and a check says so.
    assert main(["convert", str(flax_path), str(back)]) == 0
    assert "records these settings as assumed, not known" in capsys.readouterr().err
    assert json.loads(metadata_of(back)["assumed_config"]) == ["dropout", "heads", "src_pad_idx"]
    assert main(["check", "--torch-checkpoint", str(back), "--batch", "1"]) == 0
    out, err = capsys.readouterr()
    assert "8 heads (file metadata, assumed there; not in the weights)" in out
    assert "heads 8 (set with --heads), src_pad_idx 0 (set with --pad-idx)" in err and "dropout" not in err

    # Given, nothing is assumed.
    known = tmp_path / "dropout.json"
    known.write_text(json.dumps({"dropout": 0.1}))
    assert main(["convert", path, str(tmp_path / "known.safetensors"), "--heads", "4", "--pad-idx", "0",
                 "--config", str(known)]) == 0
    assert capsys.readouterr().err == ""
    assert "assumed_config" not in metadata_of(tmp_path / "known.safetensors")
    assert load_flax_params(tmp_path / "known.safetensors")[1] == ModelConfig(**FOUR_HEADS)


@pytest.fixture(scope="module")
def training_run(tmp_path_factory):
    """A flaxformer-mini run (config.json and one checkpoint) of a one-layer tiny model: 5
    heads and dropout 0.1, neither the seed's. Its width, source vocabulary and length are SIZES',
    and its checks run at --batch 2: the check's eager operations are then those the checks of
    SIZES here compile (a second layer adds no shape), all but the target vocabulary's."""
    from flaxformer_mini.train import checkpoint
    from flaxformer_mini.runs.run import Run
    from flaxformer_mini.runs.config import DataConfig, RunConfig, model_config_for
    from flaxformer_mini.train.optimizer import TrainConfig

    out = tmp_path_factory.mktemp("run") / "run"
    data = DataConfig(kind="synthetic", task="copy", vocab_size=SIZES["source_vocab_size"], max_len=SIZES["max_len"] - 1,
                      eval_sequences=16)
    model = model_config_for("tiny", data.vocab_size, data.vocab_size, data.model_max_len).replace(num_layers=1)
    run = Run.create(out, RunConfig(model=model, train=TrainConfig(), data=data, batch_size=8), echo=lambda m: None)
    checkpoint.save(run.checkpoints(), run.initial_state())
    run.close()
    return out, model


def test_a_training_runs_directory_or_config_json_gives_check_and_convert_the_runs_config(training_run, tmp_path,
                                                                                          capsys):
    run, model = training_run
    assert (model.heads, model.dropout) == (5, 0.1)
    exported = tmp_path / "run.pt"
    assert main(["convert", str(run), str(exported)]) == 0
    capsys.readouterr()
    for config in (run / "config.json", run):  # the run's own config.json, as the reviewer gave it, or its directory
        assert main(["check", "--torch-checkpoint", str(exported), "--config", str(config), "--batch", "2"]) == 0
        out, err = capsys.readouterr()
        assert err == "" and "5 heads (config file; not in the weights)" in out
    assert main(["convert", str(exported), str(tmp_path / "flax.safetensors"), "--config", str(run)]) == 0
    assert capsys.readouterr().err == ""
    assert load_flax_params(tmp_path / "flax.safetensors")[1] == model

    # The run itself, checked: its newest checkpoint with its config, not "an orbax directory".
    assert main(["check", "--torch-checkpoint", str(run), "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert f"training run {run}, its newest checkpoint (step 0)" in out and "5 heads (the run's config.json" in out
    assert main(["check", "--torch-checkpoint", str(run), "--heads", "5"]) == 2
    assert "--heads applies to a torch checkpoint only; " in capsys.readouterr().err
    assert main(["check", "--torch-checkpoint", str(run / "checkpoints")]) == 2
    assert (f"{run / 'checkpoints'}: this is the checkpoints directory of a training run; give the run directory "
            f"({run}) to check its newest checkpoint") in capsys.readouterr().err


def test_a_runs_config_json_edited_by_hand_is_refused_as_a_config_file_too(training_run, tmp_path, capsys):
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(training_run[0], edited)
    config = json.loads((edited / "config.json").read_text())
    config["model"]["heads"] = 3  # 30 = 3 x 10: the same shapes as the run's 5 heads
    (edited / "config.json").write_text(json.dumps(config))
    exported = tmp_path / "run.pt"
    assert main(["convert", str(training_run[0]), str(exported)]) == 0
    capsys.readouterr()
    assert main(["check", "--torch-checkpoint", str(exported), "--config", str(edited), "--batch", "1"]) == 2
    assert f"{edited / 'config.json'}: edited since the run wrote it" in capsys.readouterr().err


def test_exporting_a_bfloat16_run_notes_that_float32_torch_may_decode_otherwise(training_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "bf16"
    shutil.copytree(training_run[0], run)
    from flaxformer_mini.runs.directory import CONFIG_CHECKSUM, config_sha256

    config = dict(json.loads((run / "config.json").read_text()), dtype="bfloat16")
    config["checksums"][CONFIG_CHECKSUM] = config_sha256(config)  # as a bfloat16 run writes it
    (run / "config.json").write_text(json.dumps(config))
    assert main(["convert", str(run), str(tmp_path / "bf16.safetensors")]) == 0
    assert f"note: {run} computes in bfloat16; the exported parameters are float32" in capsys.readouterr().out
    assert main(["convert", str(training_run[0]), str(tmp_path / "f32.safetensors")]) == 0
    assert "note:" not in capsys.readouterr().out


def test_the_bfloat16_check_refuses_force_without_json_before_any_work(monkeypatch, capsys):
    from parity import bfloat16

    monkeypatch.setattr("parity.twins.transformer_pair", lambda *a, **k: pytest.fail("the twins were built"))
    with pytest.raises(SystemExit) as stop:
        bfloat16.main(["--presets", "tiny", "--force"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "python -m parity.bfloat16: error: --force goes with --json: it replaces an existing --json file, "
        "and none was given")
