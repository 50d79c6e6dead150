"""`parity check --float64-reference`: an output beyond the tolerance agrees when the Flax twin's
float32 error against the torch twin in float64 is at most FLOAT64_FACTOR times torch's own.

A trained model's large activations take float32 rounding past 1e-5 in torch itself (the
README's main job: logits up to 31.6, torch float32 against float64 1.9e-5). Here the tiny
twins' output projection is scaled up to the same effect, so the default check fails on
rounding alone; the reference must pass it, and must still fail a planted bug.
"""

import copy
import json

import numpy as np
import pytest
import torch

import flaxformer_mini as fm
from parity import check_twins, torch_to_flax
from parity.cli import main
from parity.policy import DEFAULT_ATOL, FLOAT64_FACTOR
from parity.twins import as_inputs, sample_batch, transformer_pair

pytestmark = pytest.mark.parity
CONFIG = fm.get_preset("tiny")
SCALE = 300.0  # the output projection's weights x300: logits of a few hundred, as a trained model's are tens


@pytest.fixture(scope="module")
def scaled_twins():
    torch_model, flax_model = transformer_pair(CONFIG, seed=0)
    with torch.no_grad():
        torch_model.decoder.fc.weight.mul_(SCALE)
    torch_to_flax(torch_model.state_dict(), flax_model)
    return torch_model, flax_model


def torch_float32_error_of_logits(torch_model):
    """Independently of parity's code: torch float32 logits against the same model in float64."""
    (source, target), _ = as_inputs(*sample_batch(CONFIG))
    with torch.no_grad():
        t32 = torch_model(source, target).double()
        t64 = copy.deepcopy(torch_model).double()(source, target)
    return float((t32 - t64).abs().max())


def test_rounding_alone_fails_the_absolute_tolerance_and_passes_against_float64(scaled_twins):
    plain = check_twins(*scaled_twins, CONFIG)
    logits = next(r for r in plain.rows if r.alias == "logits")
    assert not plain.ok and logits.max_abs > DEFAULT_ATOL  # the premise: 1e-5 is not reachable here
    torch_error = torch_float32_error_of_logits(scaled_twins[0])
    assert torch_error > DEFAULT_ATOL  # ... by torch itself: float32 rounding, not the port

    judged = check_twins(*scaled_twins, CONFIG, float64_reference=True)
    assert judged.ok and judged.float64_factor == FLOAT64_FACTOR
    logits = next(r for r in judged.rows if r.alias == "logits")
    assert logits.torch_f64 == pytest.approx(torch_error, rel=1e-12)
    assert DEFAULT_ATOL < logits.flax_f64 <= FLOAT64_FACTOR * logits.torch_f64
    assert all(r.torch_f64 is not None for r in judged.rows)  # every output measured, not only the failing
    assert scaled_twins[0].decoder.fc.weight.dtype == torch.float32  # the caller's twin stays float32


def test_a_planted_bug_still_fails_against_float64(scaled_twins):
    torch_model, flax_model = scaled_twins
    broken = copy.deepcopy(flax_model)
    broken.decoder.decoder_layers[0].norm.epsilon = 1e-1  # torch's LayerNorm keeps 1e-5
    report = check_twins(torch_model, broken, CONFIG, float64_reference=True)
    first = report.first_divergence
    assert first is not None and first.name.startswith("decoder.decoder_layers.0")
    assert first.flax_f64 > FLOAT64_FACTOR * first.torch_f64 > 0
    assert (f"against the torch twin in float64, Flax's error {first.flax_f64:.3e} > {FLOAT64_FACTOR}x torch's "
            f"{first.torch_f64:.3e}") in report.format_table()


def test_the_cli_option_reports_both_errors_and_the_hint_names_it(scaled_twins, tmp_path, capsys):
    from safetensors.torch import save_file

    path = tmp_path / "scaled.safetensors"
    save_file(scaled_twins[0].state_dict(), path)
    sizes = ["--heads", str(CONFIG.heads), "--pad-idx", str(CONFIG.src_pad_idx)]
    assert main(["check", "--torch-checkpoint", str(path), *sizes]) == 1
    out = capsys.readouterr().out
    assert "hint: a trained model's large activations" in out and "--float64-reference" in out

    report = tmp_path / "report.json"
    assert main(["check", "--torch-checkpoint", str(path), *sizes, "--float64-reference", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "yes (float64)" in out and "hint:" not in out
    data = json.loads(report.read_text())
    assert data["ok"] is True and data["float64_factor"] == FLOAT64_FACTOR
    logits = next(r for r in data["rows"] if r["label"] == "logits")
    assert logits["max_abs"] > DEFAULT_ATOL and logits["flax_f64"] <= FLOAT64_FACTOR * logits["torch_f64"]
    assert logits["by_float64"] is True
    assert all(r["by_float64"] is (r["max_abs"] > DEFAULT_ATOL) for r in data["rows"] if r["kind"] == "intermediate")
    assert np.isfinite([logits["torch_f64"], logits["flax_f64"]]).all()
