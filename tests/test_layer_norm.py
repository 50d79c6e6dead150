"""The model's LayerNorm (``primitives.LayerNorm``): nnx.LayerNorm's parameters and values,
with a backward pass of its own (``jax.custom_vjp``) that keeps the input and a float32 mean
and 1/std per token instead of autodiff's three float32 arrays of the input's shape.

Properties checked: its values equal nnx.LayerNorm's bit for bit in float32 and bfloat16; its
gradients equal autodiff's in float32, and in bfloat16 its input's gradient is the float32
one rounded once (nnx.LayerNorm's own is further off); a scanned bfloat16 model keeps no
float32 activation of the model's width for its backward pass, only the statistics, and none
of either with the LayerNorms recomputed (the ablations' ``layer_norm_recomputed``); other
settings (a mask) run nnx.LayerNorm's own call; a ``promote_dtype`` given to it is used, as
nnx.LayerNorm uses it. Parity sees each LayerNorm as a row and
converts its parameters: every parity test of the seed's model goes through it.

Sizes: a LayerNorm of 7 features on (3, 5, 7) inputs; a scanned model of D=32, 4 heads, 3
layers a side (odd: the stacked axis), B=2, S=T=8.
"""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

import flaxformer_mini as fm
from flaxformer_mini.model import primitives
from tools import ablation_variants

L, B, S, D = 3, 2, 8, 32


def _layer_norm(dtype):
    norm = primitives.layer_norm(7, dtype=dtype, rngs=nnx.Rngs(0))
    # A scale and bias other than 1 and 0 (values bfloat16 holds exactly, so the float32
    # reference below has the same ones).
    norm.scale[...] = jnp.linspace(0.5, 2.0, 7).astype(jnp.bfloat16).astype(jnp.float32)
    norm.bias[...] = jnp.linspace(-1.0, 1.0, 7).astype(jnp.bfloat16).astype(jnp.float32)
    return norm


def _input(dtype):
    """Inputs with a mean far from their spread (the two-pass variance's case), held exactly in
    bfloat16."""
    return (jax.random.normal(jax.random.key(0), (3, 5, 7)) * 3.0 + 5.0).astype(jnp.bfloat16).astype(dtype)


def _value_and_grads(normalize, norm, x):
    """The value and the gradients (x, then bias and scale) of a loss weighing every output of
    ``normalize(norm, x)`` by a fixed random weight (bfloat16 values)."""
    weights = jax.random.normal(jax.random.key(1), x.shape).astype(jnp.bfloat16).astype(jnp.float32)
    graphdef, state = nnx.split(norm)

    def loss(x, state):
        return jnp.sum(normalize(nnx.merge(graphdef, state), x).astype(jnp.float32) * weights)

    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(x, state)
    return float(value), [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]


autodiff = ablation_variants.normalize_by_autodiff  # nnx.LayerNorm's own call, differentiated by JAX


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_layer_norm_gives_nnx_layer_norms_values_bit_for_bit_and_its_gradients(dtype):
    x = _input(dtype)
    norm = _layer_norm(dtype)
    assert type(norm) is primitives.LayerNorm and isinstance(norm, nnx.LayerNorm)
    ours = primitives.normalize(norm, x)
    assert ours.dtype == dtype
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(autodiff(norm, x), np.float32))
    value, (d_x, d_bias, d_scale) = _value_and_grads(primitives.normalize, _layer_norm(dtype), x)
    plain_value, (plain_x, plain_bias, plain_scale) = _value_and_grads(autodiff, _layer_norm(dtype), x)
    assert value == plain_value
    # scale's and bias's gradients: float32 sums in another order at most.
    for got, want in ((d_bias, plain_bias), (d_scale, plain_scale)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if dtype == jnp.float32:
        np.testing.assert_allclose(d_x, plain_x, rtol=1e-6, atol=1e-6)
        return
    # In bfloat16 the input's gradient is the float32 LayerNorm's rounded once (2^-8 relative).
    # nnx.LayerNorm's own backward rounds the gradients of its two paths to x (the centring and
    # the statistics) to bfloat16 before adding them, and they nearly cancel, so it is further
    # off (measured: docs/benchmarks.md, "Found on the way").
    _, (exact_x, _, _) = _value_and_grads(autodiff, _layer_norm(None), x.astype(jnp.float32))
    np.testing.assert_allclose(d_x, exact_x, rtol=2.0**-8, atol=1e-6)
    assert np.abs(d_x - exact_x).max() < np.abs(plain_x - exact_x).max()


def test_a_mask_runs_nnx_layer_norms_own_call():
    norm, x = _layer_norm(jnp.float32), _input(jnp.float32)
    mask = jnp.arange(7)[None, None, :] < jnp.array([3, 7, 5])[:, None, None]  # (3, 1, 7), broadcast over T
    mask = jnp.broadcast_to(mask, x.shape)
    with jax.numpy_dtype_promotion("standard"):
        got = norm(x, mask=mask)
        want = nnx.LayerNorm.__call__(norm, x, mask=mask)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # The masked statistics differ from the whole row's: the mask reached the computation.
    assert not np.allclose(np.asarray(got[0]), np.asarray(norm(x)[0]))


def _kept(normalize=None):
    """{shape: count} of the float32 arrays of the model's width (L, B, T, D) and of its
    statistics' width (L, B, T, 1) that autodiff keeps for the backward pass of a scanned
    bfloat16 model, as JAX's public API prints them, with the blocks' ``normalize`` swapped
    for ``normalize`` (None: the model's own)."""
    model = fm.Transformer(0, 40, 40, 16, D, 4, L, 0.0, dtype=jnp.bfloat16, scan_layers=True, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    source = jnp.arange(1, 1 + B * S).reshape(B, S) % 39 + 1

    def loss(params):
        return nnx.merge(graphdef, params, rest, copy=True)(source, source[:, ::-1]).astype(jnp.float32).sum()

    printed = io.StringIO()
    swap = (contextlib.nullcontext() if normalize is None
            else ablation_variants.swapped(ablation_variants.layers, "normalize", normalize))
    with swap, contextlib.redirect_stdout(printed):
        print_saved_residuals(loss, params)
    shapes = [line.split(" ")[0] for line in printed.getvalue().splitlines()]
    return {shape: shapes.count(shape) for shape in (f"f32[{L},{B},{S},{D}]", f"f32[{L},{B},{S},1]")}


def test_a_scanned_bfloat16_model_keeps_only_each_layer_norms_input_and_statistics():
    width, stats = f"f32[{L},{B},{S},{D}]", f"f32[{L},{B},{S},1]"
    # Five LayerNorms per encoder + decoder layer pair: a float32 mean and 1/std each.
    assert _kept() == {width: 0, stats: 5 * 2}
    # Autodiff of nnx.LayerNorm keeps three float32 arrays of the model's width each.
    assert _kept(autodiff)[width] == 5 * 3
    # Recomputed in the backward pass (nnx.remat around each LayerNorm): neither.
    with ablation_variants.layer_norms_recomputed(prevent_cse=False):
        assert _kept(ablation_variants.layers.normalize) == {width: 0, stats: 0}


def test_a_promote_dtype_given_is_used_as_nnx_layer_norm_uses_it():
    called = []

    def promote(args, *, dtype=None, inexact=True):
        called.append(dtype)
        return tuple(a.astype(dtype) for a in args)

    norm = primitives.LayerNorm(7, epsilon=1e-5, use_fast_variance=False, dtype=jnp.bfloat16, promote_dtype=promote,
                                rngs=nnx.Rngs(0))
    x = _input(jnp.float32)
    y = norm(x)
    assert called == [jnp.bfloat16] and y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(autodiff(norm, x), np.float32))
