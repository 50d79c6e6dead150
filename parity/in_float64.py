"""Both twins in float64: ``parity.compare(..., float64=True)`` and ``compare_gradients(..., float64=True)``.

In float32 the two sides round differently (their summation orders differ), so the policy's
tolerance (1e-5) must leave room for that rounding, and a porting slip smaller than it passes:
Flax's LayerNorm epsilon 1e-6 for torch's 1e-5 moves activations of variance 9 by about 2e-6.
In float64 the rounding is some 1e-15 of the values, so a tolerance of ``FLOAT64_ATOL`` leaves
no room for a slip of any size that float32 could show, and what differs is the port.

The torch twin is a ``.double()`` copy. JAX computes in float32 unless x64 is on: the Flax twin
is a copy with its floating variables cast to float64 and each layer's compute ``dtype``
(``nnx.Embed``'s default is float32, where torch's layers have none) set to float64, run under
``jax.enable_x64(True)`` (JAX's context for it; the caller's models and JAX's global setting
stay as they were). A cast in the port's own code still computes in its dtype: such rows are
said in a note, as is a loss ``compare_gradients(..., float64=True)`` gets back narrower.

Shapes: whatever the models take and give; inputs are cast, integers (token ids) kept.
"""

import contextlib
import copy
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from parity.row_selection import listed


def _torch_float64(x):
    """A floating tensor in float64; anything else (token ids, a flag, None) as it is."""
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _flax_float64(x):
    """A floating array (numpy or JAX) in float64; anything else as it is."""
    if isinstance(x, (np.ndarray, jax.Array)) and jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.asarray(x, jnp.float64)
    return x


def torch_in_float64(torch_model, torch_inputs):
    """A float64 copy of the torch model (the caller's stays as it is) and its inputs."""
    return copy.deepcopy(torch_model).double(), tuple(_torch_float64(x) for x in torch_inputs)


@contextlib.contextmanager
def x64():
    """JAX's float64 for the block: ``jax.enable_x64(True)`` (outside it float64 arrays are made
    float32), with standard dtype promotion, since Flax's LayerNorm promotes its statistics'
    dtype with float32 (``jnp.promote_types``), which a caller's strict promotion refuses for
    float64. Every JAX operation of a float64 run's Flax side goes inside it."""
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        yield


def flax_in_float64(flax_model, flax_inputs):
    """A float64 copy of the Flax model and its inputs; call under ``x64()``."""
    model = nnx.clone(flax_model)
    state = nnx.state(model)
    nnx.update(model, jax.tree.map(lambda v: v.astype(jnp.float64) if jnp.issubdtype(v.dtype, jnp.floating)
                                   else v, state))
    for _, module in nnx.iter_modules(model):
        dtype = getattr(module, "dtype", None)
        if dtype is not None and _is_narrow_float(dtype):  # jnp.float32, "bfloat16", ...
            module.dtype = jnp.float64  # as torch's .double(): every layer computes in float64
    return model, tuple(_flax_float64(x) for x in flax_inputs)


def _is_narrow_float(dtype):
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        return False
    return jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 8


def _narrower(named):
    """The names of ``named``'s values in a float dtype narrower than float64."""
    return [name for name, value in named.items()  # jnp.issubdtype: bfloat16 is a float too
            if jnp.issubdtype(value.dtype, jnp.floating) and value.dtype != np.float64]


def narrower_rows_note(flax_named):
    """[(note, certain)]: the Flax rows a float64 run computed in a narrower float dtype."""
    narrow = _narrower(flax_named)
    if not narrow:
        return []
    return [(f"float64=True, but the Flax model computed {len(narrow)} row(s) in a narrower dtype "
             f"({listed(narrow)}): a cast in its code (astype, or a dtype given to a jnp function); their "
             f"differences are that dtype's rounding, not necessarily the port's", True)]


def narrower_loss_note(losses):
    """[(note, certain)]: the sides of ``losses`` ({side: loss value}) whose loss a float64 run
    got back in a narrower float dtype, or in float64 holding a float32 value (cast to float32
    and back). Only the loss shows such a cast: each gradient has its parameter's dtype,
    float64, whatever dtype the computation between them ran in."""
    narrow = _narrower(losses)
    widened = [side for side, value in losses.items() if side not in narrow and _widened_float32(value)]
    if not narrow and not widened:
        return []
    got = [f"{side}'s in {np.dtype(losses[side].dtype).name}" for side in narrow]
    got += [f"{side}'s in float64 holding a float32 value, cast there and back" for side in widened]
    return [(f"float64=True, but the loss came back narrower ({' and '.join(got)}): a cast in the loss or the model "
             f"(logits.astype(jnp.float32) in JAX, .float() in torch) "
             f"computes the loss in that dtype, so the loss and every gradient carry its rounding, not necessarily "
             f"the port's differences; give float64=True a loss that computes in its input's dtype", True)]


# A float32 value has at most 24 significant bits. A loss computed in float64 is one with odds
# of 2**-29; one of 12 bits or fewer (0.5, 3.25) may be exact in either dtype.
_SHORT_BITS = 12


def _widened_float32(value):
    """Whether a float64 scalar is exactly a float32 value of more than ``_SHORT_BITS``
    significant bits: a value computed in float32 and cast back to float64."""
    if np.ndim(value) != 0 or np.dtype(value.dtype) != np.float64:
        return False
    v = float(value)
    if not np.isfinite(v) or v == 0.0 or abs(v) > float(np.finfo(np.float32).max) or float(np.float32(v)) != v:
        return False
    mantissa = int(abs(math.frexp(v)[0]) * 2 ** 53)  # the 53-bit significand as an integer
    mantissa >>= (mantissa & -mantissa).bit_length() - 1  # its trailing zero bits dropped
    return mantissa.bit_length() > _SHORT_BITS
