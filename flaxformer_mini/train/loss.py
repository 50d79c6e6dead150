"""The training loss: token cross-entropy averaged over non-padding labels, and the count of
correctly predicted labels.

``token_cross_entropy`` is the one the train step uses. ``fused_token_cross_entropy`` gives
the same value and gradient with the logits left in their compute dtype (bfloat16 in a
bfloat16 model): no float32 copy of the (B, T, V) logits, their log-softmax or their gradient
is kept between the forward and the backward pass (``tools/ablations.py`` times the two).
"""

import functools

import jax
import jax.numpy as jnp
import optax

from flaxformer_mini.data import PAD


def token_cross_entropy(logits, labels, label_smoothing=0.0, pad_id=PAD):
    """Cross-entropy averaged over the non-padding target tokens.

    Equals ``F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=pad_id,
    label_smoothing=label_smoothing)``. Returns (mean loss, (summed loss, token count)).
    The log-softmax runs in float32 at least: bfloat16 logits are widened, float64 ones (a twin
    run in float64 as a reference, under ``jax.enable_x64``) stay float64, as in torch_ref's.
    """
    logits = logits.astype(jnp.float64 if logits.dtype == jnp.float64 else jnp.float32)  # promote_types: strict mode refuses
    targets = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    if label_smoothing:
        targets = optax.smooth_labels(targets, label_smoothing)
    per_token = optax.softmax_cross_entropy(logits, targets)  # (B, T)
    return _masked_mean(per_token, labels, pad_id)


def fused_token_cross_entropy(logits, labels, label_smoothing=0.0, pad_id=PAD):
    """``token_cross_entropy``'s value and gradient, the logits kept in their own dtype.

    Every element is widened to float32 where it is used (the max, the sum of exponentials,
    the gradient's softmax), so the arithmetic and its accumulation are float32 as in
    ``token_cross_entropy``; what the backward pass keeps is the logits as they came and one
    float32 log-sum-exp per token, and the gradient is written in the logits' dtype. In
    float32 the two functions differ by rounding alone (tests/test_fused_loss.py).
    """
    per_token = _per_token_cross_entropy(logits, labels, float(label_smoothing))  # (B, T) float32
    return _masked_mean(per_token, labels, pad_id)


def _masked_mean(per_token, labels, pad_id):
    mask = (labels != pad_id).astype(per_token.dtype)  # float32, or float64 for a float64 twin
    total = jnp.sum(per_token * mask)
    count = jnp.sum(mask)
    return total / jnp.maximum(count, 1.0), (total, count)


def _log_sum_exp(logits):
    """(B, T) float32 log-sum-exp over the last axis of (B, T, V) ``logits`` of any float dtype."""
    wide = logits.astype(jnp.float32)
    top = jnp.max(wide, axis=-1, keepdims=True)  # exact in any dtype: a max rounds nothing
    return (top + jnp.log(jnp.sum(jnp.exp(wide - top), axis=-1, keepdims=True)))[..., 0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _per_token_cross_entropy(logits, labels, smoothing):
    return _per_token_forward(logits, labels, smoothing)[0]


def _per_token_forward(logits, labels, smoothing):
    """Cross-entropy against the targets (1 - s) * one_hot + s / V (``optax.smooth_labels``):
    log-sum-exp - (1 - s) * logit[label] - s * mean(logits), each term in float32."""
    lse = _log_sum_exp(logits)
    picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0].astype(jnp.float32)
    loss = lse - (1.0 - smoothing) * picked
    if smoothing:
        loss = loss - smoothing * jnp.mean(logits.astype(jnp.float32), axis=-1)
    return loss, (logits, labels, lse)


def _per_token_backward(smoothing, kept, grad):
    logits, labels, lse = kept
    V = logits.shape[-1]
    softmax = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
    targets = (1.0 - smoothing) * jax.nn.one_hot(labels, V, dtype=jnp.float32) + smoothing / V
    # Token ids have no gradient: None is custom_vjp's zero for them.
    return ((softmax - targets) * grad[..., None]).astype(logits.dtype), None


_per_token_cross_entropy.defvjp(_per_token_forward, _per_token_backward)


def correct_tokens(logits, labels, pad_id=PAD):
    """How many non-padding labels the logits' argmax predicts."""
    return jnp.sum((jnp.argmax(logits, -1) == labels) & (labels != pad_id))
