"""Masks: padding hides keys, a fully padded row stays finite, and the decoder is causal.

Each property is checked in both twins, and each would fail under the seed's slips (a
-1e-20 fill, which sets masked scores to about 0 instead of excluding their keys, and a
source mask that is never returned).
"""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
import torch_ref
from conftest import assert_close, flax_twin_of
from parity import as_inputs, sample_batch, transformer_pair

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

B, S, T = 3, 13, 11


@pytest.fixture
def twins(tiny_config):
    return transformer_pair(tiny_config, seed=5)


def run_both(twins, source, target):
    t, f = twins
    (ts, tt), (js, jt) = as_inputs(source, target)
    with torch.no_grad():
        return np.asarray(f(js, jt)), t(ts, tt).cpu().numpy()


def test_padding_in_several_rows_matches_torch(tiny_config, twins):
    source, target = sample_batch(tiny_config, batch=5, seed=11, source_len=S, target_len=T)
    source[1, 4:] = 0
    source[2, 9:] = 0
    source[4, 1:] = 0
    f, t = run_both(twins, source, target)
    assert_close(f, t)


def test_appending_padding_to_the_source_changes_no_logit(tiny_config, twins):
    # Padded keys are masked, so extra padding must be invisible to the decoder. Under the
    # seed's -1e-20 fill (slip 1) or its missing source mask (slip 2) this fails.
    source, target = sample_batch(tiny_config, batch=B, seed=12, source_len=9, target_len=T)
    longer = np.concatenate([source, np.zeros((B, 4), source.dtype)], axis=1)
    f_short, t_short = run_both(twins, source, target)
    f_long, t_long = run_both(twins, longer, target)
    np.testing.assert_allclose(f_long, f_short, atol=1e-5)
    np.testing.assert_allclose(t_long, t_short, atol=1e-5)


def test_source_row_of_only_padding_is_finite_and_equal_in_both(tiny_config, twins):
    source, target = sample_batch(tiny_config, batch=B, seed=13, source_len=S, target_len=T)
    source[1, :] = 0  # every key of row 1 is masked: its weights must be uniform, not NaN
    f, t = run_both(twins, source, target)
    assert np.isfinite(f).all() and np.isfinite(t).all()
    assert_close(f, t)


def test_fully_masked_attention_row_gets_uniform_weights():
    # With every key masked, softmax sees equal scores: weights 1/S, so the output is the
    # projection of the mean value vector. Worked out directly from the weights.
    D, H = 30, 5
    torch.manual_seed(0)
    t = torch_ref.SelfAttention(D, H).eval()
    f = flax_twin_of(t, fm.SelfAttention, D, H)
    x = np.random.default_rng(0).standard_normal((2, 7, D)).astype(np.float32)
    mask = np.zeros((2, 1, 1, 7), bool)
    expected = t.fc(t.W_v(torch.as_tensor(x)).mean(dim=1, keepdim=True)).expand(2, 7, D)
    out_t = t(torch.as_tensor(x), torch.as_tensor(x), torch.as_tensor(x), torch.as_tensor(mask))
    out_f = f(jnp.asarray(x), jnp.asarray(x), jnp.asarray(x), jnp.asarray(mask))
    assert_close(out_t.detach().cpu().numpy(), expected)
    assert_close(out_f, expected)


@pytest.mark.parametrize("t_changed", [0, 4, 10])
def test_changing_target_token_t_changes_no_logit_before_t(tiny_config, twins, t_changed):
    source, target = sample_batch(tiny_config, batch=B, seed=14, source_len=S, target_len=T)
    edited = target.copy()
    edited[:, t_changed] = (edited[:, t_changed] + 1) % tiny_config.target_vocab_size
    f_a, t_a = run_both(twins, source, target)
    f_b, t_b = run_both(twins, source, edited)
    for a, b in ((f_a, f_b), (t_a, t_b)):
        np.testing.assert_array_equal(a[:, :t_changed], b[:, :t_changed])
        # ...and the edit is seen from position t on, so the check above is not vacuous.
        assert np.abs(a[:, t_changed] - b[:, t_changed]).max() > 1e-3


def test_source_and_target_masks_have_the_seed_shapes(tiny_config):
    f = fm.Transformer.from_config(tiny_config, rngs=nnx.Rngs(0))
    torch.manual_seed(0)
    t = torch_ref.Transformer(**tiny_config.to_dict())
    source = np.array([[5, 6, 0, 0], [7, 0, 0, 0], [1, 2, 3, 4]])
    target = np.ones((3, 5), np.int64)
    (ts, tt), (js, jt) = as_inputs(source, target)
    for sm in (f.create_source_mask(js), t.create_source_mask(ts).cpu().numpy()):
        assert sm.shape == (3, 1, 1, 4)
        np.testing.assert_array_equal(np.asarray(sm)[:, 0, 0], source != 0)
    for tm in (f.create_target_mask(jt), t.create_target_mask(tt).cpu().numpy()):
        assert tm.shape == (3, 1, 5, 5)
        np.testing.assert_array_equal(np.asarray(tm)[0, 0] != 0, np.tril(np.ones((5, 5), bool)))
