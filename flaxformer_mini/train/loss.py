"""The training loss: token cross-entropy averaged over non-padding labels, and the count of
correctly predicted labels."""

import jax
import jax.numpy as jnp
import optax

from flaxformer_mini.data import PAD


def token_cross_entropy(logits, labels, label_smoothing=0.0, pad_id=PAD):
    """Cross-entropy averaged over the non-padding target tokens.

    Equals ``F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=pad_id,
    label_smoothing=label_smoothing)``. Returns (mean loss, (summed loss, token count)).
    """
    logits = logits.astype(jnp.float32)  # log-softmax in float32 whatever the compute dtype
    targets = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32)
    if label_smoothing:
        targets = optax.smooth_labels(targets, label_smoothing)
    per_token = optax.softmax_cross_entropy(logits, targets)  # (B, T)
    mask = (labels != pad_id).astype(jnp.float32)
    total = jnp.sum(per_token * mask)
    count = jnp.sum(mask)
    return total / jnp.maximum(count, 1.0), (total, count)


def correct_tokens(logits, labels, pad_id=PAD):
    """How many non-padding labels the logits' argmax predicts."""
    return jnp.sum((jnp.argmax(logits, -1) == labels) & (labels != pad_id))
