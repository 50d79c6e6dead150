"""The seeds' attention modules in PyTorch.

Shapes use the project's one legend (``flaxformer_mini/__init__.py``): B batch, S source
length, T target (query) length, D model width, H heads, K head width.

- ``SelfAttention`` (seed 001): the seq2seq model's multi-head attention.
- ``scaled_dot_product_attention`` and ``MultiHeadAttention`` (seed 002).
- ``PerHeadSelfAttention`` (seed 003): one K x K projection shared by all heads.
- ``MultiHeadSelfAttention`` (seed 004): no bias, returns the attention weights too.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# Masked scores are set to this before the softmax, so their weight is exp(-huge) == 0.
# A row whose keys are all masked becomes a row of equal values: uniform weights, not NaN
# (a -inf fill would give NaN there).
MASK_FILL_VALUE = -1e20


class SelfAttention(nn.Module):
    """Seed 001's multi-head attention: project, split into H heads, attend, merge, project."""

    def __init__(self, embed_size, heads):
        # Seed slip 5: seed 000 forgets super().__init__(); seed 001 (followed here) has it.
        super().__init__()
        self.embed_size = embed_size
        self.heads = heads
        self.head_dim = embed_size // heads

        # Registration order (W_k before W_q) is the seed's: it fixes the state_dict order
        # and the order in which torch's RNG initialises the weights.
        self.W_k = nn.Linear(self.embed_size, self.embed_size)
        self.W_q = nn.Linear(self.embed_size, self.embed_size)
        self.W_v = nn.Linear(self.embed_size, self.embed_size)
        self.fc = nn.Linear(self.heads * self.head_dim, self.embed_size)

    def forward(self, query, key, value, mask):
        B, T = query.shape[0], query.shape[1]
        S = key.shape[1]

        query = self.W_q(query).reshape(B, T, self.heads, self.head_dim)
        key = self.W_k(key).reshape(B, S, self.heads, self.head_dim)
        value = self.W_v(value).reshape(B, S, self.heads, self.head_dim)

        scores = torch.einsum("bthk,bshk->bhts", query, key)
        if mask is not None:
            # Seed slip 1: the seed fills with -1e-20, which sets a masked score to about 0
            # instead of excluding it (scores [5, 3], the second masked: softmax [0.993, 0.0067],
            # not [1, 0]). The intended value is a large negative number (003: -1e20).
            scores = scores.masked_fill(mask == 0, MASK_FILL_VALUE)
        # The seed scales after masking: -1e20 / sqrt(K) is still ~-1e19, so it works.
        weights = torch.softmax(scores / (self.head_dim**0.5), dim=3)  # (B, H, T, S)

        out = torch.einsum("bhts,bshk->bthk", weights, value).reshape(B, T, self.heads * self.head_dim)
        return self.fc(out)


def scaled_dot_product_attention(Q, K, V, mask=None):
    """Seed 002: softmax(Q K^T / sqrt(d_k)) V over the last two axes.

    ``mask`` is an addition (seed slip 6: the seed's attention takes none); it is applied
    after the scaling, as in the tutorial seed 002 follows.
    """
    d_k = Q.size(-1)
    # torch.tensor(d_k) is an int64 tensor; torch.sqrt of it is float32, as in the seed.
    scores = torch.matmul(Q, K.transpose(-2, -1)) / torch.sqrt(torch.tensor(d_k))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, MASK_FILL_VALUE)
    attention_weights = F.softmax(scores, dim=-1)
    return torch.matmul(attention_weights, V)


class MultiHeadAttention(nn.Module):
    """Seed 002's multi-head attention with ``W_q, W_k, W_v, W_o``."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0, f"d_model={d_model} is not divisible by num_heads={num_heads}"
        self.d_k = d_model // num_heads
        self.num_heads = num_heads

        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, Q, K, V, mask=None):
        # Seed slip 6: the seed prints every shape on every call; a module must not.
        B = Q.size(0)
        Q = self.W_q(Q).view(B, -1, self.num_heads, self.d_k).transpose(1, 2)  # (B, H, T, K)
        K = self.W_k(K).view(B, -1, self.num_heads, self.d_k).transpose(1, 2)  # (B, H, S, K)
        V = self.W_v(V).view(B, -1, self.num_heads, self.d_k).transpose(1, 2)  # (B, H, S, K)
        out = scaled_dot_product_attention(Q, K, V, mask)  # (B, H, T, K)
        out = out.transpose(1, 2).contiguous().view(B, -1, self.num_heads * self.d_k)
        return self.W_o(out)


class PerHeadSelfAttention(nn.Module):
    """Seed 003: heads are split first, then one K x K projection, shared by every head.

    Renamed: the seed calls this class ``SelfAttention``, the name of seed 001's (different)
    attention, which this package keeps. Arguments and ``state_dict`` keys are seed 003's.
    """

    def __init__(self, embed_size, heads):
        super().__init__()
        self.embed_size = embed_size
        self.heads = heads
        self.head_dim = embed_size // heads

        self.queries = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.keys = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.values = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.fc_out = nn.Linear(heads * self.head_dim, embed_size)

    def forward(self, query, keys, values, mask):
        B, T, S = query.shape[0], query.shape[1], keys.shape[1]

        # Seed slip 7: the seed creates these projections and never applies them. The
        # tutorial it follows applies them to each head after the split.
        queries = self.queries(query.reshape(B, T, self.heads, self.head_dim))
        keys = self.keys(keys.reshape(B, S, self.heads, self.head_dim))
        values = self.values(values.reshape(B, S, self.heads, self.head_dim))

        energy = torch.einsum("bthk,bshk->bhts", queries, keys)
        if mask is not None:
            energy = energy.masked_fill(mask == 0, MASK_FILL_VALUE)
        attention = torch.softmax(energy / math.sqrt(self.head_dim), dim=3)

        out = torch.einsum("bhts,bshk->bthk", attention, values).reshape(B, T, self.heads * self.head_dim)
        return self.fc_out(out)


class MultiHeadSelfAttention(nn.Module):
    """Seed 004: bias-free multi-head self-attention that also returns its weights.

    Returns ``(out, attn_weights)`` with ``attn_weights`` of shape (B, H, T, T).
    """

    def __init__(self, d_model=4, num_heads=2):
        super().__init__()
        assert d_model % num_heads == 0, f"d_model={d_model} is not divisible by num_heads={num_heads}"
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads

        # Seed slip 8: the seed calls torch.manual_seed(123) here, a notebook device for
        # reproducible printouts, not part of the module. Seed outside it to reproduce them.
        self.W_Q = nn.Linear(d_model, d_model, bias=False)
        self.W_K = nn.Linear(d_model, d_model, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        B, T, _ = x.size()
        Q = self.W_Q(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, K)
        K = self.W_K(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        V = self.W_V(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

        scores = torch.matmul(Q, K.transpose(-1, -2)) / (self.head_dim**0.5)  # (B, H, T, T)
        attn_weights = F.softmax(scores, dim=-1)
        context = torch.matmul(attn_weights, V)  # (B, H, T, K)

        context = context.transpose(1, 2).contiguous().view(B, T, self.d_model)
        return self.out_proj(context), attn_weights
