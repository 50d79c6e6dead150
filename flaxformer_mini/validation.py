"""Checks on token inputs: what is checked where.

PyTorch's embedding lookup raises on an id outside the table. JAX's gather does not: under
``jax.jit`` an id equal to the vocabulary size gives NaN logits and a negative id wraps
around to another token's row, silently. ``check_tokens`` restores PyTorch's behaviour with
messages that name the input, the bad id and the limit:

- **dtype, rank and length** (> ``max_len``) are static, so they raise (TypeError /
  ValueError) on every path, eager or traced, before any compiled code runs.
- **id values, eager** (concrete arrays, numpy or JAX): checked on the host; a bad id raises
  ValueError before any layer runs. ``Transformer.__call__`` checks its two inputs once each,
  ``Transformer.encode`` its source once; ``Encoder``/``Decoder`` check their input only when
  called directly (their parent passes ``check_inputs=False``).
- **id values, traced** (inside ``jax.jit``, ``nnx.jit``, ``vmap``, ...): the values are not
  known, so the check becomes a ``jax.experimental.checkify.debug_check``. Under plain
  ``jax.jit`` it is dropped at trace time (no error, no cost: a bad id gives NaN or another
  token's logits, as JAX would). Under ``checkify.checkify`` it is kept: run the function
  through ``checked(fn)`` (= ``jax.jit(checkify.checkify(fn))`` + ``err.throw()``) and a bad
  id raises ``checkify.JaxRuntimeError`` (a ValueError) on the host after the compiled call,
  with the same message. Without ``checked``, call ``check_tokens`` on the host batch before
  the jitted call (the train step and decoding do).

(``checkify.check``, the non-debug form, would raise "Cannot abstractly evaluate a
checkify.check which was not functionalized" under plain ``jax.jit`` in jax 0.10.2, which is
why the traced check is a ``debug_check``.)
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


def _outside_message(name, bad, vocab_size):
    return f"{name}: token id {bad} is outside the vocabulary [0, {vocab_size})"


def check_tokens(tokens, vocab_size, max_len, name="input"):
    """Raise TypeError/ValueError for ids the embedding tables cannot look up.

    Shape and dtype are checked always (they are static, even under ``jax.jit``); the values
    on the host when ``tokens`` is concrete, and as a checkify check when it is traced (see
    the module docstring: reported only under ``checked``/``checkify``).
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
    if tokens.size and isinstance(tokens, jax.core.Tracer):
        # Values are unknown while tracing: a check that checkify reports after the compiled
        # call and plain jax.jit drops (XLA then removes the reductions as dead code).
        low, high = jnp.min(tokens), jnp.max(tokens)
        bad = jnp.where(low < 0, low, high)
        checkify.debug_check((low >= 0) & (high < vocab_size), _outside_message(name, "{}", vocab_size), bad)
    if isinstance(tokens, jax.core.Tracer) or tokens.size == 0:
        return
    values = np.asarray(tokens)
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(_outside_message(name, low if low < 0 else high, vocab_size))


def checked(fn, **jit_kwargs):
    """``fn`` compiled with its token checks kept: ``jax.jit(checkify.checkify(fn))``, then the
    error, if any, raised on the host (``checkify.JaxRuntimeError``, a ValueError, whose
    message names the input, the bad id and the vocabulary size).

    ``fn`` is a pure function of arrays (e.g. ``nnx.merge(graphdef, state)(source, target)``);
    ``jit_kwargs`` go to ``jax.jit``. The price over plain ``jax.jit``: a min and a max per
    token input in the compiled code, and a wait for the error flag after each call.
    """
    # Only user checks: checkify's automatic NaN/index/division checks would change what the
    # compiled code computes, and cost more than these reductions.
    compiled = jax.jit(checkify.checkify(fn, errors=checkify.user_checks), **jit_kwargs)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        err, out = compiled(*args, **kwargs)
        err.throw()
        return out

    return call


def check_same_batch(source, target):
    if source.shape[0] != target.shape[0]:
        raise ValueError(f"source and target batch sizes differ: {source.shape[0]} vs {target.shape[0]}")
