"""The seeds' blocks in PyTorch: post-LayerNorm encoder and decoder blocks (seed 001),
learned positional encoding and the feed-forward network (seed 004).

Shapes: B batch, S source length, T target length, D model width, F feed-forward width
(legend in ``flaxformer_mini/__init__.py``).
"""

import torch
import torch.nn as nn

from torch_ref.attention import SelfAttention


class TransformerBlock(nn.Module):
    """Seed 001's post-LN block: attention, Add & Norm, dropout, feed-forward, Add & Norm.

    ``ffn_dim`` (keyword-only) is the feed-forward width F; None keeps the seed's F = D.
    """

    def __init__(self, embed_size, heads, dropout, *, ffn_dim=None):
        super().__init__()
        F = embed_size if ffn_dim is None else ffn_dim
        self.attention = SelfAttention(embed_size, heads)
        # nn.LayerNorm's eps is 1e-5; Flax's LayerNorm defaults to 1e-6 (the twin sets 1e-5).
        self.norm1 = nn.LayerNorm(embed_size)
        self.norm2 = nn.LayerNorm(embed_size)
        # The seed keeps the feed-forward at width D (no expansion; "Attention Is All You
        # Need" uses F = 4D); indices 0 and 2 are part of the state_dict keys (fc.0.weight,
        # fc.2.weight).
        self.fc = nn.Sequential(
            nn.Linear(embed_size, F),
            nn.ReLU(),
            nn.Linear(F, embed_size),
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask):
        attention = self.attention(query, key, value, mask)
        fc_in = self.dropout(self.norm1(attention + query))
        fc_out = self.fc(fc_in)
        return self.norm2(fc_out + fc_in)


class DecoderBlock(nn.Module):
    """Seed 001: masked self-attention + Add & Norm, then a TransformerBlock whose
    attention reads the encoder output (cross-attention). ``ffn_dim`` as in TransformerBlock."""

    def __init__(self, embed_size, heads, dropout, *, ffn_dim=None):
        super().__init__()
        self.attention = SelfAttention(embed_size, heads)
        self.transformer_block = TransformerBlock(embed_size, heads, dropout, ffn_dim=ffn_dim)
        self.norm = nn.LayerNorm(embed_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input, key, value, source_mask, target_mask):
        x = self.attention(input, input, input, target_mask)
        query = self.dropout(self.norm(x + input))
        return self.transformer_block(query, key, value, source_mask)


class LearnedPositionalEncoding(nn.Module):
    """Seed 004: adds a learned embedding of each position 0..T-1 to ``x`` of shape (B, T, D)."""

    def __init__(self, d_model, max_len=512):
        super().__init__()
        # Seed slip 8: the seed calls torch.manual_seed(123) here; seed outside instead.
        self.pos_embedding = nn.Embedding(num_embeddings=max_len, embedding_dim=d_model)

    def forward(self, x):
        T = x.size(1)
        positions = torch.arange(T, device=x.device).unsqueeze(0)  # (1, T)
        return x + self.pos_embedding(positions)  # (1, T, D) broadcasts over B


class FeedForward(nn.Module):
    """Seed 004: Linear(D -> hidden) -> ReLU -> Linear(hidden -> D), applied per token."""

    def __init__(self, d_model=4, hidden_dim=8):
        super().__init__()
        self.linear1 = nn.Linear(d_model, hidden_dim)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(hidden_dim, d_model)

    def forward(self, x):
        return self.linear2(self.relu(self.linear1(x)))
