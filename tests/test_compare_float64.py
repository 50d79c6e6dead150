"""``parity.compare(..., float64=True)`` and ``compare_gradients(..., float64=True)``: both
twins in float64, where a slip smaller than float32's tolerance still fails (a LayerNorm epsilon
of 1e-6 for torch's 1e-5).

Shapes: ids and labels (N, L) token ids; x (N, L, D) after the embedding; logits (N, L, V).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

import parity
from parity.policy import FLOAT64_ATOL
from parity.policy import FLOAT64_MAX_ATOL

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

V, D, HID, N, L = 11, 8, 12, 3, 7  # every size distinct, so a wrong axis cannot pass


class _TorchLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(V, D)
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D, HID), torch.nn.GELU(), torch.nn.Linear(HID, D))
        self.head = torch.nn.Linear(D, V)

    def forward(self, ids):
        x = self.tok(ids)
        x = x + self.mlp(self.ln1(x))
        return self.head(self.ln2(x))


class _FlaxLM(nnx.Module):
    def __init__(self, rngs, ln1_epsilon=1e-5, mlp_dtype=None, cast_logits=False):
        self.tok = nnx.Embed(V, D, rngs=rngs)
        self.ln1 = nnx.LayerNorm(D, epsilon=ln1_epsilon, rngs=rngs)  # torch's 1e-5; Flax's default is 1e-6
        self.ln2 = nnx.LayerNorm(D, epsilon=1e-5, rngs=rngs)
        self.mlp = nnx.Sequential(nnx.Linear(D, HID, dtype=mlp_dtype, rngs=rngs),
                                  lambda x: nnx.gelu(x, approximate=False),  # torch's GELU is the erf form
                                  nnx.Linear(HID, D, dtype=mlp_dtype, rngs=rngs))
        self.head = nnx.Linear(D, V, rngs=rngs)
        self.cast_logits = cast_logits

    def __call__(self, ids):
        x = self.tok(ids)
        x = x + self.mlp(self.ln1(x))
        logits = self.head(self.ln2(x))
        return logits.astype(self.cast_logits) if self.cast_logits else logits  # a dtype, or False


RENAME = {"mlp.{}.{}": "mlp.layers.{}.{}"}
IGNORE = "mlp.layers.1"  # torch's GELU module; the port calls a function there


def _pair(**port):
    torch.manual_seed(0)
    t = _TorchLM().eval()
    with torch.no_grad():  # activations of variance ~9, where the epsilon slip below is < 1e-5 in float32
        t.tok.weight.mul_(3.0)
    f = parity.torch_to_flax(t.state_dict(), _FlaxLM(nnx.Rngs(0), **port), rename=RENAME)
    ids = np.random.default_rng(0).integers(0, V, (N, L))
    return t, f, (torch.as_tensor(ids),), (jnp.asarray(ids),)


def _compare(pair, **kw):
    return parity.compare(*pair, rename=RENAME, ignore_missing=IGNORE, **kw)


def test_a_faithful_port_agrees_in_float64_to_far_below_the_float64_tolerance():
    pair = _pair()
    report = _compare(pair, float64=True)
    assert report.ok and report.atol == FLOAT64_ATOL and report.notes == [], report.format_table()
    # float64 rounding of values of order 1, and room of about four orders of magnitude to the tolerance
    assert report.max_abs < 1e-14, report.format_table(show_all=True)
    assert _compare(pair).atol == 1e-5  # without float64: the parity policy's


def test_a_wrong_layernorm_epsilon_that_float32_passes_fails_in_float64_at_that_layer():
    pair = _pair(ln1_epsilon=1e-6)  # Flax's default, not torch's
    in_float32 = _compare(pair)
    # The slip moves these activations (variance ~9) by less than 1e-5: float32's tolerance,
    # which must leave room for rounding, passes it.
    assert in_float32.ok and 1e-7 < in_float32.max_abs < 1e-5, in_float32.format_table(show_all=True)
    in_float64 = _compare(pair, float64=True)
    assert not in_float64.ok and in_float64.first_divergence.name == "ln1"
    assert in_float64.first_divergence.max_abs > 1e4 * FLOAT64_ATOL


def test_the_callers_models_and_jax_stay_in_float32():
    t, f, tx, fx = _pair()
    _compare((t, f, tx, fx), float64=True)
    assert all(p.dtype == torch.float32 for p in t.parameters())
    assert {v.get_value().dtype for _, v in nnx.to_flat_state(nnx.state(f, nnx.Param))} == {jnp.dtype("float32")}
    assert not jax.config.jax_enable_x64 and jnp.asarray(1.0).dtype == jnp.float32
    assert f(fx[0]).dtype == jnp.float32  # and the model still runs as it did


@pytest.mark.parametrize("dtype", [jnp.float32, "bfloat16"], ids=["float32", "bfloat16-by-name"])
def test_layers_built_to_compute_in_a_narrower_dtype_compute_in_float64_as_torchs_double_does(dtype):
    report = _compare(_pair(mlp_dtype=dtype), float64=True)
    assert report.ok and report.notes == [] and report.max_abs < 1e-14, report.format_table(show_all=True)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rows_a_cast_in_the_ports_code_narrows_are_said_not_trusted_silently(dtype):
    with pytest.warns(UserWarning, match=r"float64=True, but the Flax model computed 1 row\(s\) in a narrower dtype "
                                         r"\(the whole model\): a cast in its code"):
        report = _compare(_pair(cast_logits=dtype), float64=True)
    assert not report.ok and report.first_divergence.name == "", report.format_table()


class _TorchScaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)

    def forward(self, x, scale, mask=None):
        return self.proj(x) * scale if mask is None else self.proj(x) * scale * mask


class _FlaxScaled(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x, scale, mask=None):
        return self.proj(x) * scale if mask is None else self.proj(x) * scale * mask


def test_inputs_that_are_not_arrays_pass_through_as_they_do_in_float32():
    # A Python float and None reach both models as they are; the float input is cast.
    torch.manual_seed(0)
    t = _TorchScaled().eval()
    f = parity.torch_to_flax(t.state_dict(), _FlaxScaled(nnx.Rngs(0)))
    x = np.random.default_rng(0).standard_normal((N, D)).astype(np.float32)
    report = parity.compare(t, f, (torch.as_tensor(x), 0.5, None), (x, 0.5, None), float64=True)
    assert report.ok and report.max_abs < 1e-14, report.format_table(show_all=True)


def test_the_projects_own_twins_agree_in_float64():
    # flaxformer_mini's attention keeps float64 scores (it widens bfloat16 to float32, and
    # must not narrow float64); the seed-size twins agree to 5.8e-15 (in_float64.py).
    import flaxformer_mini as fm
    import torch_ref
    from flaxformer_mini.model.config import get_preset
    from parity.twins import sample_batch

    config = get_preset("tiny")
    torch.manual_seed(0)
    t = torch_ref.Transformer(**config.to_dict()).eval()
    f = parity.torch_to_flax(t.state_dict(), fm.Transformer(**config.to_dict(), rngs=nnx.Rngs(0)))
    f.eval()
    # check_twins' inputs (parity.twins.sample_batch: 4 rows, padded): the float64 copies' eager
    # operations at the shapes tests/test_parity_check_float64.py compiles, shared through the
    # suite's compilation cache.
    src, trg = sample_batch(config)
    report = parity.compare(t, f, (torch.as_tensor(src), torch.as_tensor(trg)), (src, trg), float64=True)
    assert report.ok and report.notes == [] and report.max_abs < 1e-13, report.format_table(show_all=True)


LABELS = np.random.default_rng(1).integers(0, V, (N, L))


def _torch_cross_entropy(model, ids, labels):
    return torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), labels.flatten())


def _flax_cross_entropy(model, ids, labels):  # in the logits' own dtype
    return optax.softmax_cross_entropy_with_integer_labels(model(ids), labels).mean()


def _compare_gradients(pair, torch_loss=_torch_cross_entropy, flax_loss=_flax_cross_entropy, **kw):
    t, f, torch_inputs, flax_inputs = pair
    return parity.compare_gradients(t, f, torch_loss, flax_loss, (*torch_inputs, torch.as_tensor(LABELS)),
                                    (*flax_inputs, jnp.asarray(LABELS)), rename=RENAME, **kw)


def test_a_wrong_layernorm_epsilon_that_float32_passes_fails_the_gradients_in_float64():
    pair = _pair(ln1_epsilon=1e-6)  # Flax's default, not torch's
    in_float32 = _compare_gradients(pair)
    assert in_float32.ok and in_float32.atol == 1e-5, in_float32.format_table(show_all=True)
    in_float64 = _compare_gradients(pair, float64=True)
    assert in_float64.atol == FLOAT64_ATOL and in_float64.notes == [], in_float64.format_table(show_all=True)
    # The slip moves the loss (about 2.5) by some 1e-9, below float32's rounding step there
    # (2.4e-7), so the loss row is the first divergence; every gradient moves too, torch's first
    # parameter's first among them and the slipped LayerNorm's own by some 5e-9.
    rows = {row.name: row for row in in_float64.rows}
    assert in_float64.first_divergence.name == "loss" and rows["loss"].max_abs > 2 * FLOAT64_ATOL
    failed_gradients = [row.name for row in in_float64.rows if not row.ok and row.kind == "gradient"]
    assert failed_gradients[0] == "grad:tok.weight" and len(failed_gradients) == 11
    assert rows["grad:ln1.weight"].max_abs > 10 * FLOAT64_ATOL and rows["grad:ln1.weight"].at is not None


def test_a_faithful_ports_gradients_agree_in_float64_and_the_callers_models_stay_float32():
    t, f, _, fx = pair = _pair()
    report = _compare_gradients(pair, float64=True)
    assert report.ok and report.atol == FLOAT64_ATOL and report.notes == [], report.format_table(show_all=True)
    assert [row.name for row in report.rows][:2] == ["loss", "grad:tok.weight"] and len(report.rows) == 12
    # float64 rounding of gradients of order 1: about 1e-17, far under the tolerance
    assert report.max_abs < 1e-14, report.format_table(show_all=True)
    assert all(p.dtype == torch.float32 and p.grad is None for p in t.parameters())
    assert {v.get_value().dtype for _, v in nnx.to_flat_state(nnx.state(f, nnx.Param))} == {jnp.dtype("float32")}
    assert not jax.config.jax_enable_x64 and jnp.asarray(1.0).dtype == jnp.float32
    assert f(fx[0]).dtype == jnp.float32


def _never_called(*_):
    raise AssertionError("the loss ran, but the call should have been refused before any work")


def test_a_float32_sized_atol_with_float64_is_refused_naming_compare_gradients():
    with pytest.raises(ValueError, match=r"^compare_gradients: atol=1e-05 with float64=True keeps a float32-sized "
                                         r"tolerance.* give at most 1e-08$"):
        _compare_gradients(_pair(), _never_called, _never_called, float64=True, atol=1e-5)
    assert _compare_gradients(_pair(), float64=True, atol=FLOAT64_MAX_ATOL).atol == FLOAT64_MAX_ATOL


def _project_torch_loss(model, ids, labels):
    from torch_ref.training import token_cross_entropy

    return token_cross_entropy(model(ids), labels)  # float64 logits stay float64


def _project_flax_loss(model, ids, labels):
    from flaxformer_mini.train.loss import token_cross_entropy

    return token_cross_entropy(model(ids), labels)[0]  # float64 logits stay float64


def _narrowing_torch_loss(model, ids, labels):
    return torch.nn.functional.cross_entropy(model(ids).float().flatten(0, 1), labels.flatten())


def _narrowing_flax_loss(model, ids, labels):
    return optax.softmax_cross_entropy_with_integer_labels(model(ids).astype(jnp.float32), labels).mean()


def _round_trip_torch_loss(model, ids, labels):
    return _narrowing_torch_loss(model, ids, labels).double()


def _round_trip_flax_loss(model, ids, labels):
    return _narrowing_flax_loss(model, ids, labels).astype(jnp.float64)


def test_the_projects_own_losses_keep_float64_and_agree():
    report = _compare_gradients(_pair(), _project_torch_loss, _project_flax_loss, float64=True)
    assert report.ok and report.notes == [] and report.max_abs < 1e-14, report.format_table(show_all=True)


_ROUND_TRIP = "in float64 holding a float32 value, cast there and back"


@pytest.mark.parametrize(("losses", "narrowed"), [((_torch_cross_entropy, _narrowing_flax_loss), "Flax's in float32"),
                                                  ((_narrowing_torch_loss, _flax_cross_entropy), "torch's in float32"),
                                                  ((_torch_cross_entropy, _round_trip_flax_loss), f"Flax's {_ROUND_TRIP}"),
                                                  ((_round_trip_torch_loss, _flax_cross_entropy), f"torch's {_ROUND_TRIP}")],
                         ids=["flax-astype", "torch-float", "flax-astype-and-back", "torch-float-and-back"])
def test_a_loss_that_narrows_to_float32_is_said_and_its_rounding_fails_the_loss(losses, narrowed):
    with pytest.warns(UserWarning, match=rf"float64=True, but the loss came back narrower \({narrowed}\): "
                                         rf"a cast in the loss or the model"):
        report = _compare_gradients(_pair(), *losses, float64=True)
    assert len(report.notes) == 1 and report.notes[0].startswith("float64=True, but the loss came back narrower")
    # The faithful port's loss differs by float32's rounding there, which the note explains.
    assert not report.ok and report.first_divergence.name == "loss", report.format_table(show_all=True)
    assert 1e-9 < report.rows[0].max_abs < 1e-5


def test_a_float64_loss_is_not_taken_for_a_float32_one_unless_it_is_one():
    from parity.in_float64 import narrower_loss_note

    def said(value):
        return narrower_loss_note({"Flax": value}) != []

    third = np.float64(1) / 3
    assert not said(third) and said(np.float64(np.float32(third)))
    # Values of few bits are exact in both dtypes, and values float32 cannot hold are no float32's.
    assert not any(said(np.float64(v)) for v in (0.0, 0.5, 3.25, 1e300, np.inf, np.nan))
