"""`parity check --float64` (``check_twins(..., float64=True)``): copies of both twins in float64,
judged at FLOAT64_ATOL (1e-10). Neither side's float32 rounding is left to hide a slip smaller
than float32's tolerance, and none grows with the model's width or the batch, so a correct port
passes where float32's rounding would not.
"""

import copy
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import flaxformer_mini as fm
from flaxformer_mini.train.loss import token_cross_entropy
from parity import check_twins
from parity.check_memory import model_bytes
from parity.cli import main
from parity.policy import DEFAULT_ATOL, FLOAT64_ATOL, FLOAT64_MAX_ATOL
from parity.twins import transformer_pair
from torch_ref.training import token_cross_entropy as torch_token_cross_entropy

pytestmark = pytest.mark.parity
CONFIG = fm.get_preset("tiny")


@pytest.fixture(scope="module")
def twins():
    return transformer_pair(CONFIG, seed=0)


def test_the_twins_agree_in_float64_to_far_below_its_tolerance_and_stay_float32(twins):
    report = check_twins(*twins, CONFIG, grads=True, float64=True)
    assert report.ok and report.float64 and report.atol == FLOAT64_ATOL and report.notes == []
    assert report.max_abs < 1e-13, report.format_table(show_all=True)
    assert sum(r.kind == "gradient" for r in report.rows) == len(list(twins[0].parameters()))
    assert all(p.dtype == torch.float32 for p in twins[0].parameters())
    assert twins[1].decoder.fc.kernel[...].dtype == jnp.float32 and not jax.config.jax_enable_x64


def test_a_layernorm_epsilon_slip_that_float32_passes_fails_in_float64_at_its_layer(twins):
    torch_model, flax_model = twins
    slipped = copy.deepcopy(flax_model)
    # torch's LayerNorm keeps 1e-5. The tiny twins' activations are small, so 1e-6 moves them
    # past 1e-5 (float32 catches it); 8e-6 moves them by a few 1e-6.
    slipped.decoder.decoder_layers[0].norm.epsilon = 8e-6
    assert check_twins(torch_model, slipped, CONFIG).ok  # the premise: float32's forward passes it
    report = check_twins(torch_model, slipped, CONFIG, grads=True, float64=True)
    first = report.first_divergence
    assert first.name == "decoder.decoder_layers.0.norm" and FLOAT64_ATOL < first.max_abs < DEFAULT_ATOL
    assert any(not r.ok for r in report.rows if r.kind == "gradient")


def test_the_cli_reports_float64_and_refuses_what_it_cannot_go_with(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["check", "--preset", "tiny", "--float64", "--json", str(out)]) == 0
    assert "float64 copies of both twins" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["float64"] is True and data["atol"] == FLOAT64_ATOL and data["ok"] is True
    for options, message in [
            (["--float64-reference"], "--float64 and --float64-reference answer one question two ways"),
            (["--decode", "3"], "--decode compares the float32 twins' greedy tokens; give it without --float64"),
            (["--atol", "1e-5"], f"--atol 1e-05 with --float64 keeps a float32-sized tolerance, which passes the "
                                 f"slips float64 exists to catch; leave --atol out (--float64's 1e-10) or give at "
                                 f"most {FLOAT64_MAX_ATOL:g}")]:
        assert main(["check", "--preset", "tiny", "--float64", *options]) == 2
        captured = capsys.readouterr()
        assert message in captured.err and captured.out == ""
    assert main(["check", "--preset", "tiny", "--float64", "--atol", str(FLOAT64_MAX_ATOL)]) == 0


def test_the_flax_loss_keeps_float64_logits_in_float64_and_widens_bfloat16():
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(3, 5, 7)) * 4, rng.integers(0, 7, (3, 5))
    with jax.enable_x64(True):
        loss = token_cross_entropy(jnp.asarray(logits, jnp.float64), jnp.asarray(labels))[0]
        assert loss.dtype == jnp.float64
    expected = torch_token_cross_entropy(torch.as_tensor(logits), torch.as_tensor(labels))
    assert abs(float(loss) - float(expected)) < 1e-14
    assert token_cross_entropy(jnp.asarray(logits, jnp.bfloat16), jnp.asarray(labels))[0].dtype == jnp.float32


def test_the_memory_estimate_counts_both_float64_copies():
    from flaxformer_mini.model import memory

    n = memory.param_count(CONFIG)
    assert model_bytes(CONFIG, float64=True) == (8 + 16) * n  # the float32 twins and their float64 copies
    assert model_bytes(CONFIG, float64=True, grads=True) == (8 + 32) * n  # gradients of the copies alone
