"""Checks on token inputs: what is checked where.

PyTorch's embedding lookup raises on an id outside the table. JAX's gather does not: under
``jax.jit`` an id equal to the vocabulary size gives NaN logits and a negative id wraps
around to another token's row, silently. ``check_tokens`` restores PyTorch's behaviour with
messages that name the input, the bad id and the limit:

- **type**: a torch tensor is refused with a TypeError that says to convert it (``.numpy()``);
  numpy arrays, JAX arrays and nested lists are accepted.
- **dtype, rank and length** (> ``max_len``) are static, so they raise (TypeError /
  ValueError) on every path, eager or traced, before any compiled code runs.
- **id values, eager** (concrete arrays, numpy or JAX): checked on the host; a bad id raises
  ValueError before any layer runs. ``Transformer.__call__`` checks its two inputs once each,
  ``Transformer.encode`` its source once; ``Encoder``/``Decoder`` check their input only when
  called directly (their parent passes ``check_inputs=False``).
- **id values, traced** (inside ``jax.jit``, ``nnx.jit``, ``vmap``, ...): the values are not
  known. By default nothing is traced for them: a bad id gives NaN or another token's logits,
  as JAX would, so check the batch on the host before the jitted call (the train step,
  evaluation and decoding do). To check inside compiled code, run the function through
  ``checked(fn)`` (= ``jax.jit(checkify.checkify(fn))`` + ``err.throw()``): while it traces,
  ``check_tokens`` adds a ``jax.experimental.checkify.debug_check``, and a bad id raises
  ``checkify.JaxRuntimeError`` (a ValueError) on the host after the compiled call, with the
  same message. A caller applying ``checkify.checkify`` itself traces inside
  ``with traced_checks():``.

Why off by default: a ``debug_check`` left in a plain ``jax.jit`` computes nothing (XLA
removes it), but it gives the jaxpr an ``ErrorEffect``, and a jitted function with an effect
leaves JAX's C++ fast path for Python dispatch on every call (``python -m tools.dispatch``
measures it: docs/benchmarks.md, "Token checks and JAX's dispatch").

(``checkify.check``, the non-debug form, would raise "Cannot abstractly evaluate a
checkify.check which was not functionalized" under plain ``jax.jit`` in jax 0.10.2, which is
why the traced check is a ``debug_check``.)
"""

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


# Read at trace time: True while ``checked`` (or ``traced_checks``) traces a function.
_TRACED_CHECKS = contextvars.ContextVar("flaxformer_mini_traced_token_checks", default=False)


@contextlib.contextmanager
def traced_checks():
    """Within this block, ``check_tokens`` on traced ids adds a ``checkify.debug_check``
    (reported only under ``checkify.checkify``). ``checked`` uses it; a caller needs it only
    when applying ``checkify.checkify`` itself. It acts on functions traced inside the block:
    a ``jax.jit`` that traced before keeps its cached program."""
    token = _TRACED_CHECKS.set(True)
    try:
        yield
    finally:
        _TRACED_CHECKS.reset(token)


def _outside_message(name, bad, vocab_size):
    return f"{name}: token id {bad} is outside the vocabulary [0, {vocab_size})"


def check_tokens(tokens, vocab_size, max_len, name="input"):
    """Raise TypeError/ValueError for ids the embedding tables cannot look up.

    Shape and dtype are checked always (they are static, even under ``jax.jit``); the values
    on the host when ``tokens`` is concrete; traced values only under ``checked`` (see the
    module docstring).
    """
    if type(tokens).__module__.split(".")[0] == "torch":
        # A torch tensor's dtype is no numpy dtype: jnp.issubdtype would fail with "Cannot
        # interpret 'torch.int64' as a data type", naming nothing. Found by its type's module,
        # so this package still never imports torch.
        raise TypeError(f"{name}: expected a numpy or JAX array of token ids, got {type(tokens).__module__}."
                        f"{type(tokens).__qualname__} (convert it with .numpy(), or .cpu().numpy() off the CPU)")
    if all(hasattr(tokens, side) for side in ("source", "target_in")):  # numpy would stack its three arrays
        raise TypeError(f"{name}: expected an array of token ids, got a whole {type(tokens).__name__} "
                        f"(pass its .source)")
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
    if tokens.size and isinstance(tokens, jax.core.Tracer) and _TRACED_CHECKS.get():
        # Values are unknown while tracing: a check that checkify reports after the compiled
        # call. Only when asked for: its ErrorEffect would slow every plain jax.jit call.
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
    @functools.wraps(fn)
    def traced(*args, **kwargs):  # runs while jax.jit traces, so the flag covers the trace
        with traced_checks():
            return fn(*args, **kwargs)

    compiled = jax.jit(checkify.checkify(traced, errors=checkify.user_checks), **jit_kwargs)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        err, out = compiled(*args, **kwargs)
        err.throw()
        return out

    return call


def check_same_batch(source, target):
    if source.shape[0] != target.shape[0]:
        raise ValueError(f"source and target batch sizes differ: {source.shape[0]} vs {target.shape[0]}")
