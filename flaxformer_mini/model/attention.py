"""The seeds' attention modules in Flax NNX, twins of ``torch_ref/attention.py``.

- ``SelfAttention`` (seed 001): the seq2seq model's multi-head attention.
- ``scaled_dot_product_attention`` and ``MultiHeadAttention`` (seed 002).
- ``PerHeadSelfAttention`` (seed 003): one K x K projection shared by all heads.
- ``MultiHeadSelfAttention`` (seed 004): no bias, returns the attention weights too.

Masks are keep-masks broadcastable to (B, H, T, S): 1/True = attend. Scores and the
softmax are computed in float32 whatever the compute dtype, as is usual for bfloat16: the
score product accumulates and returns float32 (``preferred_element_type``), as
``jax.nn.dot_product_attention`` does, rather than rounding each score to bfloat16 and
widening it afterwards. For float32 inputs this changes nothing; float64 inputs (a model run
under ``jax.enable_x64``, as ``parity.compare(..., float64=True)`` runs it) stay float64.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_mini.model.axes import EMBED, HEADS, KV
from flaxformer_mini.model.primitives import linear
from flaxformer_mini.model.signature import ConstructorSignature

# How SelfAttention computes softmax(q k^T / sqrt(K)) v once q, k and v are projected:
#   "einsum"  the seed's formulation, written out (the default; what the parity suite pins)
#   "xla"     jax.nn.dot_product_attention(implementation="xla"): the same math, JAX's code
#   "cudnn"   jax.nn.dot_product_attention(implementation="cudnn"): cuDNN's fused (flash)
#             attention; NVIDIA GPUs only, bfloat16/float16 inputs
# Choose with set_attention_impl(model, name).
ATTENTION_IMPLS = ("einsum", "xla", "cudnn")

# Masked scores are set to this before the softmax (torch_ref uses the same value). A row
# whose keys are all masked becomes a row of equal values: uniform weights, never NaN.
MASK_FILL_VALUE = -1e20


def _as_rank4(mask):
    # torch broadcasts a (S,) or (B, S)-shaped mask silently; make the leading 1s explicit so
    # the code also runs under jax_numpy_rank_promotion="raise".
    mask = jnp.asarray(mask)
    return mask.reshape((1,) * (4 - mask.ndim) + mask.shape)


def masked_fill(scores, mask):
    """torch's ``scores.masked_fill(mask == 0, MASK_FILL_VALUE)``: jnp.where, out of place."""
    if mask is None:
        return scores
    # A cast, not `mask == 0`: the same for bool and 0/1 masks, and no bool-int comparison
    # (an error under jax_numpy_dtype_promotion="strict").
    return jnp.where(~_as_rank4(mask).astype(jnp.bool_), MASK_FILL_VALUE, scores)


def _scores_dtype(*arrays):
    """At least float32: bfloat16 widened, float64 kept."""
    return jnp.float64 if any(a.dtype == jnp.float64 for a in arrays) else jnp.float32


def _softmax_f32(scores, axis=-1):
    return jax.nn.softmax(scores.astype(_scores_dtype(scores)), axis=axis)


class SelfAttention(nnx.Module):
    """Seed 001's multi-head attention: project, split into H heads, attend, merge, project."""

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, embed_size, heads, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.embed_size = embed_size
        self.heads = heads
        self.head_dim = embed_size // heads
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        # Same order as the seed (W_k first), though in Flax the order changes nothing.
        self.W_k = linear(embed_size, embed_size, axes=(EMBED, HEADS), **kw)
        self.W_q = linear(embed_size, embed_size, axes=(EMBED, HEADS), **kw)
        self.W_v = linear(embed_size, embed_size, axes=(EMBED, HEADS), **kw)
        self.fc = linear(heads * self.head_dim, embed_size, axes=(HEADS, EMBED), **kw)
        self.attention_impl = "einsum"

    def __call__(self, query, key, value, mask):
        return self.attend(query, *self.project_kv(key, value), mask)

    def project_kv(self, key, value):
        """Keys and values split into heads, head-first: (B, H, S, K) each. Cached decoding
        computes these once for the encoder output and once per new target token; head-first,
        the cache is written in place at each step and read without a transpose."""
        B, S, _ = key.shape
        H, K = self.heads, self.head_dim
        k = self.W_k(key).reshape(B, S, H, K).transpose(0, 2, 1, 3)
        v = self.W_v(value).reshape(B, S, H, K).transpose(0, 2, 1, 3)
        return k, v

    def attend(self, query, k, v, mask):
        """Attention of ``query`` (B, T, D) over projected keys/values (B, H, S, K)."""
        B, T, _ = query.shape
        H, K = self.heads, self.head_dim
        q = self.W_q(query).reshape(B, T, H, K)
        if self.attention_impl == "einsum":
            # Every operand head-first, as the keys and values are: the products and their
            # gradients are then batched over (B, H) in one layout. With the queries in the
            # seed's (B, T, H, K), XLA:CPU computes them in transposed layouts, slower
            # (docs/benchmarks.md, "The attention's layout on the CPU").
            q = q.transpose(0, 2, 1, 3)  # (B, H, T, K)
            scores = jnp.einsum("BHTK,BHSK->BHTS", q, k, preferred_element_type=_scores_dtype(q, k))
            # As in the seed: fill first, then scale by 1/sqrt(K) (torch_ref SelfAttention).
            weights = _softmax_f32(masked_fill(scores, mask) / (K**0.5))  # (B, H, T, S)
            out = jnp.einsum("BHTS,BHSK->BHTK", weights.astype(v.dtype), v).transpose(0, 2, 1, 3)
        else:
            out = _dot_product_attention(q, k, v, mask, self.attention_impl)
        return self.fc(out.reshape(B, T, H * K))


def _check_attention_impl(impl):
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"unknown attention_impl {impl!r}; choose one of {', '.join(ATTENTION_IMPLS)}")


def _dot_product_attention(q, k, v, mask, impl):
    """q (B, T, H, K) over k, v (B, H, S, K) through jax.nn.dot_product_attention.

    Equal to the "einsum" path up to rounding: JAX scales before it masks and fills with a
    large negative number instead of -1e20, but a masked key gets weight exactly 0 either
    way, and a row with every key masked becomes uniform in both. Scores and softmax are
    float32 for bfloat16 inputs here too.
    """
    _check_attention_impl(impl)
    if impl == "cudnn" and jax.default_backend() != "gpu":
        raise ValueError(f"attention_impl='cudnn' needs an NVIDIA GPU; JAX's backend here is {jax.default_backend()!r}")
    # JAX's layout is sequence-first, (B, S, H, K): the head-first keys and values (the
    # decoding cache's layout) are transposed back.
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    if mask is not None:
        mask = _mask_for(impl, mask, q.shape[1], k.shape[1])
    # JAX promotes bfloat16 inputs with float32 for the logits' dtype on purpose: allowed
    # here under a program's strict promotion (as the tests run), as around Flax's LayerNorm.
    # That covers the forward pass only. With bfloat16 inputs, the gradient of the "xla"
    # implementation holds float32-by-bfloat16 dot_generals that jax 0.10 lowers through
    # promote_types at compile time, outside any context here: a bfloat16 train step with
    # "xla" attention compiles under standard promotion (JAX's default) only.
    with jax.numpy_dtype_promotion("standard"):
        return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)  # (B, T, H, K)


def _mask_for(impl, mask, T, S):
    """The keep-mask as jax.nn.dot_product_attention takes it for ``impl``: bool, rank 4.

    cuDNN turns a mask into an additive bias and wants that bias's last two axes whole,
    (B|1, H|1, T, S) (jax's check_layout: "Bias must have same seq length as QKV"); XLA
    broadcasts the seed's (B, 1, 1, S) padding mask itself, so it gets the mask as it is.
    """
    mask = _as_rank4(mask).astype(jnp.bool_)
    if impl == "cudnn":
        mask = jnp.broadcast_to(mask, mask.shape[:2] + (T, S))
    return mask


def set_attention_impl(model, impl):
    """Make every SelfAttention in ``model`` use ``impl`` (one of ATTENTION_IMPLS)."""
    _check_attention_impl(impl)
    found = 0
    for _, module in nnx.iter_modules(model):
        if isinstance(module, SelfAttention):
            module.attention_impl = impl
            found += 1
    if not found:
        raise ValueError(f"{type(model).__name__} has no SelfAttention to set attention_impl on")
    return model


def scaled_dot_product_attention(Q, K, V, mask=None):
    """Seed 002: softmax(Q K^T / sqrt(d_k)) V over the last two axes; the mask is applied
    after the scaling (the seed takes none; see torch_ref)."""
    d_k = Q.shape[-1]
    # torch divides by torch.sqrt(torch.tensor(d_k)), a float32 square root; so do we, since
    # sqrt(d_k) rounded from float64 can differ from it in the last bit.
    dtype = _scores_dtype(Q, K)
    scores = jnp.matmul(Q, jnp.swapaxes(K, -2, -1), preferred_element_type=dtype) / jnp.sqrt(jnp.asarray(d_k, dtype))
    weights = _softmax_f32(masked_fill(scores, mask))
    return jnp.matmul(weights.astype(V.dtype), V)


class MultiHeadAttention(nnx.Module):
    """Seed 002's multi-head attention with ``W_q, W_k, W_v, W_o``."""

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, d_model, num_heads, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.d_k = d_model // num_heads
        self.num_heads = num_heads
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.W_q = linear(d_model, d_model, axes=(EMBED, HEADS), **kw)
        self.W_k = linear(d_model, d_model, axes=(EMBED, HEADS), **kw)
        self.W_v = linear(d_model, d_model, axes=(EMBED, HEADS), **kw)
        self.W_o = linear(d_model, d_model, axes=(HEADS, EMBED), **kw)

    def __call__(self, Q, K, V, mask=None):
        B = Q.shape[0]
        H, Dk = self.num_heads, self.d_k

        def split(x):  # (B, T, D) -> (B, H, T, K): torch's .view(B, -1, H, K).transpose(1, 2)
            return x.reshape(B, -1, H, Dk).transpose(0, 2, 1, 3)

        out = scaled_dot_product_attention(split(self.W_q(Q)), split(self.W_k(K)), split(self.W_v(V)), mask)
        out = out.transpose(0, 2, 1, 3).reshape(B, -1, H * Dk)
        return self.W_o(out)


class PerHeadSelfAttention(nnx.Module):
    """Seed 003: heads are split first, then one K x K projection, shared by every head.

    Seed 003 calls it ``SelfAttention``, renamed as in torch_ref (seed 001 has a
    ``SelfAttention`` of its own); parameter paths mirror seed 003's keys.
    """

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, embed_size, heads, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.embed_size = embed_size
        self.heads = heads
        self.head_dim = embed_size // heads
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.queries = linear(self.head_dim, self.head_dim, use_bias=False, axes=(KV, KV), **kw)
        self.keys = linear(self.head_dim, self.head_dim, use_bias=False, axes=(KV, KV), **kw)
        self.values = linear(self.head_dim, self.head_dim, use_bias=False, axes=(KV, KV), **kw)
        self.fc_out = linear(heads * self.head_dim, embed_size, axes=(HEADS, EMBED), **kw)

    def __call__(self, query, keys, values, mask):
        B, T, _ = query.shape
        S = keys.shape[1]
        H, K = self.heads, self.head_dim

        # The seed creates these projections and never applies them (torch_ref, slip 7).
        q = self.queries(query.reshape(B, T, H, K))
        k = self.keys(keys.reshape(B, S, H, K))
        v = self.values(values.reshape(B, S, H, K))

        energy = jnp.einsum("BTHK,BSHK->BHTS", q, k, preferred_element_type=_scores_dtype(q, k))
        attention = _softmax_f32(masked_fill(energy, mask) / math.sqrt(K))

        out = jnp.einsum("BHTS,BSHK->BTHK", attention.astype(v.dtype), v).reshape(B, T, H * K)
        return self.fc_out(out)


class MultiHeadSelfAttention(nnx.Module):
    """Seed 004: bias-free multi-head self-attention. Returns ``(out, attn_weights)``, the
    weights of shape (B, H, T, T)."""

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, d_model=4, num_heads=2, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        kw = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.W_Q = linear(d_model, d_model, axes=(EMBED, HEADS), **kw)
        self.W_K = linear(d_model, d_model, axes=(EMBED, HEADS), **kw)
        self.W_V = linear(d_model, d_model, axes=(EMBED, HEADS), **kw)
        self.out_proj = linear(d_model, d_model, axes=(HEADS, EMBED), **kw)

    def __call__(self, x):
        B, T, _ = x.shape
        H, K = self.num_heads, self.head_dim

        def split(y):  # (B, T, D) -> (B, H, T, K)
            return y.reshape(B, T, H, K).transpose(0, 2, 1, 3)

        Q, Kh, V = split(self.W_Q(x)), split(self.W_K(x)), split(self.W_V(x))
        scores = jnp.matmul(Q, jnp.swapaxes(Kh, -1, -2), preferred_element_type=_scores_dtype(Q, Kh)) / (K**0.5)
        attn_weights = _softmax_f32(scores)  # (B, H, T, T)
        context = jnp.matmul(attn_weights.astype(V.dtype), V)  # (B, H, T, K)

        context = context.transpose(0, 2, 1, 3).reshape(B, T, self.d_model)
        return self.out_proj(context), attn_weights
