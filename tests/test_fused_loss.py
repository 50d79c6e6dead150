"""``fused_token_cross_entropy`` (the ablation ``fused_loss``) against ``token_cross_entropy``.

Property checked: the same loss, summed loss, token count and gradient with respect to the
logits, with padding and label smoothing; in bfloat16 the gradient comes back in bfloat16
(the point of it) and within bfloat16's rounding of the plain loss's float32 gradient.

Sizes: B=3, T=5, V=7 (distinct, so a swapped axis changes a shape); labels with padding (id 0)
in two rows.
"""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from flaxformer_mini.train.loss import fused_token_cross_entropy, token_cross_entropy

B, T, V = 3, 5, 7


def _inputs(dtype):
    rng = np.random.default_rng(0)
    # Logits of either sign up to |8|: large enough that a log-sum-exp without its max shift
    # would lose digits in float32.
    logits = jnp.asarray(rng.normal(0.0, 3.0, (B, T, V)), dtype)
    labels = rng.integers(1, V, (B, T))
    labels[1, 3:] = 0  # padding
    labels[2, 1:] = 0
    return logits, jnp.asarray(labels, jnp.int32)


def _value_and_grad(loss, logits, labels, smoothing):
    return jax.value_and_grad(lambda x: loss(x, labels, smoothing), has_aux=True)(logits)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_in_float32_the_fused_loss_is_the_plain_one(smoothing):
    logits, labels = _inputs(jnp.float32)
    (plain, (plain_total, plain_count)), plain_grad = _value_and_grad(token_cross_entropy, logits, labels, smoothing)
    (fused, (fused_total, fused_count)), fused_grad = _value_and_grad(fused_token_cross_entropy, logits, labels,
                                                                      smoothing)
    assert float(fused_count) == float(plain_count) == 9.0  # 15 labels, 6 of them padding
    # Float32 rounding alone: the two sum the same terms in another order (1e-6 of a loss of ~5).
    np.testing.assert_allclose(float(fused), float(plain), rtol=1e-6)
    np.testing.assert_allclose(float(fused_total), float(plain_total), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(fused_grad), np.asarray(plain_grad), rtol=0, atol=1e-7)
    # Padding positions get no gradient; elsewhere each token's gradient sums to 0 over V.
    assert not np.asarray(fused_grad)[2, 1:].any()
    np.testing.assert_allclose(np.asarray(fused_grad).sum(-1), 0.0, atol=1e-7)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_in_bfloat16_the_fused_loss_keeps_the_logits_dtype_and_the_plain_ones_value(smoothing):
    logits, labels = _inputs(jnp.bfloat16)
    (plain, _), plain_grad = _value_and_grad(token_cross_entropy, logits, labels, smoothing)
    (fused, _), fused_grad = _value_and_grad(fused_token_cross_entropy, logits, labels, smoothing)
    assert fused.dtype == jnp.float32 and fused_grad.dtype == jnp.bfloat16 == plain_grad.dtype
    # Both widen the same bfloat16 logits to float32 before any arithmetic: the values differ
    # by float32 rounding, as in float32.
    np.testing.assert_allclose(float(fused), float(plain), rtol=1e-6)
    # The gradients: float32 values each rounded once to bfloat16 (8 significant bits), so
    # within one bfloat16 step of each other: 2^-8 relative, 4e-3 for the gradients below 1/9.
    np.testing.assert_allclose(np.asarray(fused_grad, np.float32), np.asarray(plain_grad, np.float32),
                               rtol=2.0**-8, atol=1e-6)


def _kept(loss, logits, labels):
    """The arrays autodiff keeps for the backward pass, as JAX's public API prints them, a
    line each ("bf16[3,5,7] from the argument ...", "f32[3,5] output of ...")."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(lambda x: loss(x, labels, 0.1)[0], logits)
    return [line.split(" ")[0] for line in printed.getvalue().splitlines()]


def test_what_the_fused_loss_keeps_for_the_backward_pass_is_the_logits_in_their_dtype():
    logits, labels = _inputs(jnp.bfloat16)
    kept = _kept(fused_token_cross_entropy, logits, labels)
    # The logits as given (bfloat16) and one float32 log-sum-exp per token; no float32
    # (B, T, V) array, which the plain loss keeps (its float32 log-softmax).
    assert f"f32[{B},{T},{V}]" not in kept
    assert f"bf16[{B},{T},{V}]" in kept and f"f32[{B},{T}]" in kept
    assert f"f32[{B},{T},{V}]" in _kept(token_cross_entropy, logits, labels)
