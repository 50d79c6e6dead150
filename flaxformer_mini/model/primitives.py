"""Flax layers built with PyTorch's defaults, so a freshly initialised twin is drawn from
the same distributions as its torch counterpart (the values differ: different RNGs).

Where the defaults differ:

| layer     | PyTorch default                              | Flax default                 |
| --------- | -------------------------------------------- | ---------------------------- |
| Linear    | weight (out, in), U(+-1/sqrt(in)); bias same  | kernel (in, out), LeCun normal; bias 0 |
| Embedding | N(0, 1)                                      | N(0, 1/D) (variance scaling)  |
| LayerNorm | eps 1e-5, two-pass variance                  | eps 1e-6, E[x^2] - E[x]^2     |

Each factory takes ``axes``, the logical names of its parameter's axes (partitioning.py), and
stores them in NNX's sharding metadata (``out_sharding``) where the parameter is created; the
rules table turns them into a layout on a mesh. They change no value and no RNG draw.
"""

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.dtypes import promote_dtype

# nn.LayerNorm's default; Flax's nnx.LayerNorm defaults to 1e-6.
LAYER_NORM_EPS = 1e-5


def _partitioned(axes):
    """NNX's sharding metadata for a parameter with logical axis names ``axes`` (None: none).

    ``eager_sharding=False``: flax 0.12 otherwise places an annotated variable on the mesh in
    context as soon as it is created (and refuses to create it with no mesh). These names are
    logical, not mesh axes, and the model is built once on the host, then laid out by
    ``sharding.shard_state`` through the rules table, so the same model builds anywhere.
    """
    return {} if axes is None else {"out_sharding": tuple(axes), "eager_sharding": False}


def _uniform(bound):
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class Linear(nnx.Linear):
    """nnx.Linear over a 2-D (tokens, features) matrix: leading axes are flattened first.

    Same parameters, same result; only the shape of the product XLA sees changes. Over a
    (B, T, D) input, the kernel's gradient is a product contracting two axes (B and T),
    which XLA:CPU compiled into transposing copies fused with the gradient's producer
    (the LayerNorm backward) ahead of the GEMM; over (B*T, D) it is a plain GEMM
    (the measured gain: docs/benchmarks.md).
    """

    def __call__(self, inputs, out_sharding=None):
        if inputs.ndim <= 2 or out_sharding is not None:
            return super().__call__(inputs, out_sharding)
        lead = inputs.shape[:-1]
        y = super().__call__(inputs.reshape(-1, inputs.shape[-1]))
        return y.reshape(*lead, y.shape[-1])


def linear(in_features, out_features, *, use_bias=True, axes=None, dtype=None, param_dtype=jnp.float32, rngs):
    """nnx.Linear initialised like torch.nn.Linear: kaiming_uniform(a=sqrt(5)) is U(+-1/sqrt(in)).
    ``axes``: the kernel's (in, out) logical names; the bias takes the out name."""
    bound = 1.0 / math.sqrt(in_features)
    return Linear(
        in_features,
        out_features,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=_uniform(bound),
        bias_init=_uniform(bound),
        kernel_metadata=_partitioned(axes),
        bias_metadata=_partitioned(None if axes is None else axes[1:]),
        rngs=rngs,
    )


def embedding(num_embeddings, features, *, axes=None, dtype=None, param_dtype=jnp.float32, rngs):
    """nnx.Embed initialised like torch.nn.Embedding: N(0, 1). ``axes``: the table's (rows,
    features) logical names."""
    return nnx.Embed(
        num_embeddings,
        features,
        dtype=dtype,
        param_dtype=param_dtype,
        embedding_init=nnx.initializers.normal(stddev=1.0),
        embedding_metadata=_partitioned(axes),
        rngs=rngs,
    )


class TiedLinear(nnx.Module):
    """An output projection whose weight is an embedding table: ``x @ table.T + bias``, the
    Flax side of torch's ``fc.weight = embedding_layer.weight`` (a tied head).

    It holds a reference to ``embed`` (an ``nnx.Embed`` owned elsewhere, which NNX keeps once
    in the model's state, under its owner's path) and a bias of its own, as torch's tied Linear
    keeps its own bias. torch's ``Linear`` weight is (V, D) like the ``Embedding`` table, so the
    product contracts D of both, with no transposed copy of the table. Computed over flattened
    leading axes, for the reason ``Linear`` gives; the compute dtype as ``nnx.Linear``'s."""

    def __init__(self, embed: nnx.Embed, bias: nnx.Param, *, dtype=None):
        self.embed = embed
        self.bias = bias
        self.dtype = dtype

    def __call__(self, x):
        x, table, bias = promote_dtype((x, self.embed.embedding[...], self.bias[...]), dtype=self.dtype)
        y = jax.lax.dot_general(x.reshape(-1, x.shape[-1]), table, (((1,), (1,)), ((), ())))  # (N, V)
        return (y + bias[None]).reshape(*x.shape[:-1], table.shape[0])  # bias[None]: no implicit rank promotion


class SharedEmbedding(nnx.Module):
    """Looks ids up in another module's table (``embed``, an ``nnx.Embed``): the source
    embedding of a model whose source and target share one (torch: ``encoder.embedding_layer.weight
    = decoder.embedding_layer.weight``). A module of its own, so the owner's table is called
    once by its own owner and each side's lookup has its own place (and its own row in
    ``parity.compare``); computed as ``nnx.Embed.__call__`` computes it."""

    def __init__(self, embed: nnx.Embed):
        self.embed = embed

    def __call__(self, ids):
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ValueError(f"Input type must be an integer or unsigned integer, got {ids.dtype}.")  # nnx.Embed's words
        (table,) = promote_dtype((self.embed.embedding[...],), dtype=self.embed.dtype, inexact=False)
        return jnp.take(table, ids, axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm(x, scale, bias, epsilon, dtype):
    return _layer_norm_forward(x, scale, bias, epsilon, dtype)[0]


def _statistics_dtype(dtype):
    """float32, or float64 for float64, as flax's ``_compute_stats`` promotes. Written out:
    ``jnp.promote_types`` follows the promotion mode in force when JAX traces this, and JAX may
    trace the forward rule again when it differentiates (under ``jax.checkpoint``), outside the
    caller's ``normalize``."""
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


def _layer_norm_forward(x, scale, bias, epsilon, dtype):
    """nnx.LayerNorm's arithmetic over the last axis (two-pass variance, statistics in float32
    or wider), in flax's order (``nnx.normalization._normalize``), so the same roundings. What
    it keeps for the backward pass: its input as it came, the scale, and a mean and 1/std per
    token."""
    wide = x.astype(_statistics_dtype(x.dtype))
    mean = jnp.mean(wide, axis=-1, keepdims=True)
    centred = wide - mean
    inv_std = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + epsilon)
    y = centred * (inv_std * scale.astype(wide.dtype)) + bias.astype(wide.dtype)
    return y.astype(dtype), (x, scale, mean, inv_std)


def _layer_norm_backward(epsilon, dtype, kept, grad):
    x, scale, mean, inv_std = kept
    wide = mean.dtype
    normalised = (x.astype(wide) - mean) * inv_std  # recomputed: elementwise, no reduction
    grad = grad.astype(wide)
    lead = tuple(range(x.ndim - 1))
    d_normalised = grad * scale.astype(wide)
    # The input's gradient in the statistics' dtype, rounded once to x's.
    d_x = inv_std * (d_normalised - jnp.mean(d_normalised, axis=-1, keepdims=True)
                     - normalised * jnp.mean(d_normalised * normalised, axis=-1, keepdims=True))
    # scale and bias came as (1, ..., 1, D): their gradients are summed over every leading axis.
    return (d_x.astype(x.dtype), jnp.sum(grad * normalised, axis=lead, keepdims=True).astype(scale.dtype),
            jnp.sum(grad, axis=lead, keepdims=True).astype(scale.dtype))


_layer_norm.defvjp(_layer_norm_forward, _layer_norm_backward)


class LayerNorm(nnx.LayerNorm):
    """nnx.LayerNorm over the last axis, the same parameters and values, with a backward pass
    of its own (``jax.custom_vjp``). Autodiff of nnx.LayerNorm keeps three float32 arrays of
    the input's shape per LayerNorm (its statistics' arithmetic) and, in bfloat16, rounds the
    gradients of the input's two paths (the centring and the statistics) before adding them,
    where they nearly cancel. This one keeps the input and the scale in the compute dtype and a
    mean and 1/std per token in the statistics' dtype (float32, float64 for float64), and
    rounds the input's gradient once. In a scanned bfloat16 train step those float32 stacks were
    the largest part of what the layer loop copies (docs/benchmarks.md, "GPU"). PyTorch's
    LayerNorm has a fused backward of its own too. Being a ``jax.custom_vjp``, it has no
    forward-mode derivative (``jax.jvp``, ``jax.jacfwd``); nothing here uses one.

    Other settings (a mask, reduction or feature axes other than the last, no scale or bias,
    the fast variance, an ``axis_name``) run nnx.LayerNorm's own ``__call__``."""

    def __call__(self, x, *, mask=None):
        last = (-1, x.ndim - 1)
        if (mask is not None or self.scale is None or self.bias is None or self.axis_name is not None
                or self.use_fast_variance or self.reduction_axes not in last or self.feature_axes not in last):
            return super().__call__(x, mask=mask)
        # nnx.LayerNorm's own promotion first: the input, scale and bias in the compute dtype
        # (``dtype``, or their common dtype).
        x, scale, bias = self.promote_dtype((x, self.scale[...], self.bias[...]), dtype=self.dtype)
        lead = (1,) * (x.ndim - 1)  # explicit broadcasting: the tests raise on implicit rank promotion
        return _layer_norm(x, scale.reshape(lead + scale.shape), bias.reshape(lead + bias.shape), self.epsilon,
                           x.dtype)


def layer_norm(num_features, *, axes=None, dtype=None, param_dtype=jnp.float32, rngs):
    """A ``LayerNorm`` with torch's epsilon and torch's two-pass variance. ``axes``: the
    (features,) logical name of its scale and bias.

    Its statistics are in float32 even when ``dtype`` is bfloat16, as Flax's and as PyTorch's
    under autocast. ``use_fast_variance=False``: E[(x - mean)^2], as PyTorch, not
    E[x^2] - mean^2, which loses precision when |mean| >> std.
    """
    return LayerNorm(
        num_features,
        epsilon=LAYER_NORM_EPS,
        use_fast_variance=False,
        dtype=dtype,
        param_dtype=param_dtype,
        scale_metadata=_partitioned(axes),
        bias_metadata=_partitioned(axes),
        rngs=rngs,
    )


def normalize(norm, x):
    """``norm(x)`` for a ``layer_norm``, under standard promotion: the rest of the model stays
    under the tests' ``jax_numpy_dtype_promotion="strict"``. Two promotions inside the
    LayerNorm need it, where no cast of ours reaches: ``LayerNorm`` with ``dtype=None`` brings
    an input and parameters of different dtypes to their common dtype, and nnx.LayerNorm's own
    call (its fallback) takes its statistics in float32 by promotion inside flax
    (``jnp.promote_types(dtype, float32)`` in ``_compute_stats``).
    """
    with jax.numpy_dtype_promotion("standard"):
        return norm(x)


class ReLU(nnx.Module):
    """A parameter-free module, so ``fc`` keeps torch's indices: fc.0, fc.1 (ReLU), fc.2."""

    def __call__(self, x):
        return jax.nn.relu(x)


def sequential(layers, x):
    """Apply an nnx.List of layers in order, as torch's nn.Sequential does.

    The list is applied by its owner rather than given a ``__call__`` of its own: nnx.capture
    (used by the parity harness) cannot record the output of a list that also holds children.
    """
    for layer in layers:
        x = layer(x)
    return x
