"""Checks on token inputs, run on the host before any compiled code.

PyTorch's embedding lookup raises on an id outside the table. JAX's gather does not: it
clamps the index (or fills with NaN), so an out-of-range id, a negative id or a sequence
longer than the positional table would silently produce numbers. These checks restore
PyTorch's behaviour with messages that name the input and the limit.
"""

import jax
import jax.numpy as jnp
import numpy as np


def check_tokens(tokens, vocab_size, max_len, name="input"):
    """Raise TypeError/ValueError for ids the embedding tables cannot look up.

    Shape and dtype are checked always (they are static, even under ``jax.jit``); the
    values only when ``tokens`` is concrete. Compiled entry points (the train step,
    decoding) call this on the host before they enter the compiled code.
    """
    dtype = getattr(tokens, "dtype", None)
    if dtype is None:
        tokens = np.asarray(tokens)
        dtype = tokens.dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{name}: token ids must be integers, got dtype {dtype}")
    if len(tokens.shape) != 2:
        raise ValueError(f"{name}: expected shape (batch, length), got {tuple(tokens.shape)}")
    if tokens.shape[1] > max_len:
        raise ValueError(f"{name}: length {tokens.shape[1]} exceeds max_len={max_len} (the positional table's size)")
    if isinstance(tokens, jax.core.Tracer) or tokens.size == 0:
        return
    values = np.asarray(tokens)
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name}: token id {bad} is outside the vocabulary [0, {vocab_size})")


def check_same_batch(source, target):
    if source.shape[0] != target.shape[0]:
        raise ValueError(f"source and target batch sizes differ: {source.shape[0]} vs {target.shape[0]}")
