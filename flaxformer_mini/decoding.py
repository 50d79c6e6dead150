"""Autoregressive decoding: the jitted greedy decoder and exact-match scoring.

``greedy_decode`` recomputes the decoder over a fixed-size target buffer at every step,
the way the seed describes inference: simple, and compiled once (fixed shapes, the loop
inside ``lax.fori_loop``). Position t's logits depend only on tokens 0..t (the mask is
causal), so the not-yet-written tail of the buffer never matters.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxformer_mini.data import BOS, EOS, PAD
from flaxformer_mini.validation import check_tokens


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy(graphdef, state, source, max_new_tokens):
    model = nnx.merge(graphdef, state)
    enc_out, source_mask = model.encode(source)
    B = source.shape[0]
    N = max_new_tokens
    # buf[:, 0] is BOS, buf[:, t + 1] the token chosen at step t. The decoder reads the first N
    # slots only: the last token is emitted, never fed back, so N positions suffice.
    buf = jnp.full((B, N + 1), PAD, source.dtype).at[:, 0].set(BOS)  # (B, 1 + N)
    target_mask = model.create_target_mask(buf[:, :N])

    def step(t, carry):
        buf, done = carry
        logits = model.decoder(buf[:, :N], enc_out, source_mask, target_mask)  # (B, N, V)
        token = jnp.argmax(logits[:, t], axis=-1).astype(buf.dtype)
        token = jnp.where(done, PAD, token)  # after EOS, only padding
        return buf.at[:, t + 1].set(token), done | (token == EOS)

    buf, _ = jax.lax.fori_loop(0, max_new_tokens, step, (buf, jnp.zeros((B,), jnp.bool_)))
    return buf[:, 1:]


def greedy_decode(model, source, max_new_tokens):
    """Greedy tokens (B, max_new_tokens) for ``source`` (B, S): EOS included, PAD after it.

    ``model`` is a ``Transformer`` (switched to eval mode for the call). ``max_new_tokens``
    may be at most ``max_len``: the decoder reads BOS and the first N - 1 tokens.
    """
    c = model.config
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if max_new_tokens > c.max_len:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} exceeds max_len={c.max_len}: the positional table "
            f"holds {c.max_len} decoder positions (BOS + {c.max_len - 1} fed-back tokens)"
        )
    check_tokens(source, c.source_vocab_size, c.max_len, "source")
    model.eval()
    graphdef, state = nnx.split(model)
    return _greedy(graphdef, state, jnp.asarray(source), max_new_tokens)


def exact_match(predicted, target_out):
    """Per-sequence exact match: every labelled position (EOS included) predicted right.

    ``predicted`` (B, N) from ``greedy_decode``; ``target_out`` (B, T) labels padded with PAD.
    """
    predicted, target_out = np.asarray(predicted), np.asarray(target_out)
    T = target_out.shape[1]
    if predicted.shape[1] < T:
        predicted = np.pad(predicted, ((0, 0), (0, T - predicted.shape[1])), constant_values=PAD)
    labelled = target_out != PAD
    return np.all((predicted[:, :T] == target_out) | ~labelled, axis=1)
