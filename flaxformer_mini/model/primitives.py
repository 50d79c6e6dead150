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
            raise ValueError("Input type must be an integer or unsigned integer.")  # nnx.Embed's words
        (table,) = promote_dtype((self.embed.embedding[...],), dtype=self.embed.dtype, inexact=False)
        return jnp.take(table, ids, axis=0)


def layer_norm(num_features, *, axes=None, dtype=None, param_dtype=jnp.float32, rngs):
    """nnx.LayerNorm with torch's epsilon and torch's two-pass variance. ``axes``: the
    (features,) logical name of its scale and bias.

    Flax computes its statistics in float32 even when ``dtype`` is bfloat16, which is what
    the project wants. ``use_fast_variance=False`` computes E[(x - mean)^2] like PyTorch
    instead of E[x^2] - mean^2, which loses precision when |mean| >> std.
    """
    return nnx.LayerNorm(
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
    """``norm(x)`` for a ``layer_norm``, its float32 statistics allowed under strict promotion.

    With a bfloat16 ``dtype``, Flax's LayerNorm takes its statistics in float32 by promotion
    (``jnp.promote_types(dtype, float32)`` inside flax's ``_compute_stats``), which
    ``jax_numpy_dtype_promotion="strict"`` (the tests' setting) refuses. That promotion is the
    intended one (docs/design.md: LayerNorm statistics in float32) and happens inside the library,
    where no explicit cast of ours can reach it: so this call alone runs under standard
    promotion, and the rest of the model stays checked. (PyTorch's LayerNorm under autocast
    also runs in float32.)
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
