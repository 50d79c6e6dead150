"""The seeds' blocks in Flax NNX, twins of ``torch_ref/layers.py``: post-LayerNorm encoder
and decoder blocks (seed 001), learned positional encoding and feed-forward (seed 004).
"""

import jax.numpy as jnp
from flax import nnx

from flaxformer_mini.model.attention import SelfAttention
from flaxformer_mini.model.axes import EMBED, LENGTH, MLP
from flaxformer_mini.model.primitives import ReLU, embedding, layer_norm, linear, normalize, sequential
from flaxformer_mini.model.signature import ConstructorSignature


class TransformerBlock(nnx.Module):
    """Seed 001's post-LN block: attention, Add & Norm, dropout, feed-forward, Add & Norm.

    ``ffn_dim`` is the feed-forward width F; None keeps the seed's F = D.
    """

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, embed_size, heads, dropout, *, ffn_dim=None, dtype=None, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        F = embed_size if ffn_dim is None else ffn_dim
        self.attention = SelfAttention(embed_size, heads, **kw)
        self.norm1 = layer_norm(embed_size, axes=(EMBED,), **kw)
        self.norm2 = layer_norm(embed_size, axes=(EMBED,), **kw)
        # nnx.List keeps torch's nn.Sequential indices in the parameter paths: fc/0, fc/2.
        self.fc = nnx.List([linear(embed_size, F, axes=(EMBED, MLP), **kw), ReLU(),
                            linear(F, embed_size, axes=(MLP, EMBED), **kw)])
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, query, key, value, mask):
        return self._add_norm_feed_forward(query, self.attention(query, key, value, mask))

    def attend(self, query, k, v, mask):
        """The block given projected keys/values (B, H, S, K): cached decoding's entry point."""
        return self._add_norm_feed_forward(query, self.attention.attend(query, k, v, mask))

    def _add_norm_feed_forward(self, query, attention):
        fc_in = self.dropout(normalize(self.norm1, attention + query))
        fc_out = sequential(self.fc, fc_in)
        return normalize(self.norm2, fc_out + fc_in)


class DecoderBlock(nnx.Module):
    """Seed 001: masked self-attention + Add & Norm, then a TransformerBlock whose attention
    reads the encoder output (cross-attention). ``ffn_dim`` as in TransformerBlock."""

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, embed_size, heads, dropout, *, ffn_dim=None, dtype=None, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.attention = SelfAttention(embed_size, heads, **kw)
        self.transformer_block = TransformerBlock(embed_size, heads, dropout, ffn_dim=ffn_dim, **kw)
        self.norm = layer_norm(embed_size, axes=(EMBED,), **kw)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, input, key, value, source_mask, target_mask):
        x = self.attention(input, input, input, target_mask)
        query = self.dropout(normalize(self.norm, x + input))
        return self.transformer_block(query, key, value, source_mask)

    def step(self, input, self_kv, cross_kv, source_mask, target_mask):
        """The block for new target positions ``input`` (B, T, D), given the self-attention
        keys/values of every position so far (cache included) and the cross-attention
        keys/values of the encoder output: what ``__call__`` computes, without recomputing
        the projections of earlier positions."""
        x = self.attention.attend(input, *self_kv, target_mask)
        query = self.dropout(normalize(self.norm, x + input))
        return self.transformer_block.attend(query, *cross_kv, source_mask)


class LearnedPositionalEncoding(nnx.Module):
    """Seed 004: adds a learned embedding of each position 0..T-1 to ``x`` of shape (B, T, D)."""

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, d_model, max_len=512, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.max_len = max_len
        self.pos_embedding = embedding(max_len, d_model, axes=(LENGTH, EMBED), dtype=dtype, param_dtype=param_dtype,
                                       rngs=rngs)

    def __call__(self, x):
        T = x.shape[1]
        if T > self.max_len:  # a JAX gather would clamp to the last position, silently
            raise ValueError(f"sequence length {T} exceeds max_len={self.max_len} (the positional table's size)")
        positions = jnp.arange(T)[None, :]  # (1, T)
        return x + self.pos_embedding(positions)  # (1, T, D) broadcasts over B


class FeedForward(nnx.Module):
    """Seed 004: Linear(D -> hidden) -> ReLU -> Linear(hidden -> D), applied per token."""

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, d_model=4, hidden_dim=8, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.linear1 = linear(d_model, hidden_dim, axes=(EMBED, MLP), **kw)
        self.relu = ReLU()
        self.linear2 = linear(hidden_dim, d_model, axes=(MLP, EMBED), **kw)

    def __call__(self, x):
        return self.linear2(self.relu(self.linear1(x)))
