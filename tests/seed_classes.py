"""The seeds' own classes, copied from shared/seeds/ with the least change that fixes each
slip (marked ``# slip N``) and the prints removed. Tests use them to prove that torch_ref
is faithful: same state_dict keys, same outputs."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- seed 001 -------------------------------------------------------------------------
class SelfAttention(nn.Module):
    def __init__(self, embed_size, heads):
        super(SelfAttention, self).__init__()
        self.embed_size = embed_size
        self.heads = heads
        self.head_dim = embed_size // heads
        self.W_k = nn.Linear(self.embed_size, self.embed_size)
        self.W_q = nn.Linear(self.embed_size, self.embed_size)
        self.W_v = nn.Linear(self.embed_size, self.embed_size)
        self.fc = nn.Linear(self.heads * self.head_dim, self.embed_size)

    def forward(self, query, key, value, mask):
        N = query.shape[0]
        query_len, key_len, value_len = query.shape[1], key.shape[1], value.shape[1]
        query = self.W_q(query)
        key = self.W_k(key)
        value = self.W_v(value)
        query = query.reshape(N, query_len, self.heads, self.head_dim)
        key = key.reshape(N, key_len, self.heads, self.head_dim)
        value = value.reshape(N, value_len, self.heads, self.head_dim)
        attention_scores = torch.einsum('nqhd, nkhd-> nhqk', [query, key])
        if mask is not None:
            attention_scores = attention_scores.masked_fill(mask == 0, -1e20)  # slip 1
        attention_weights = torch.softmax((attention_scores) / (self.head_dim ** 0.5), dim=3)
        out = torch.einsum('nhqk, nkhd -> nqhd', [attention_weights, value]).reshape(N, query_len, self.heads * self.head_dim)
        out = self.fc(out)
        return out


class TransformerBlock(nn.Module):
    def __init__(self, embed_size, heads, dropout):
        super(TransformerBlock, self).__init__()
        self.attention = SelfAttention(embed_size, heads)
        self.norm1 = nn.LayerNorm(embed_size)
        self.norm2 = nn.LayerNorm(embed_size)
        self.fc = nn.Sequential(
            nn.Linear(embed_size, embed_size),
            nn.ReLU(),
            nn.Linear(embed_size, embed_size)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask):
        attention = self.attention(query, key, value, mask)
        fc_in = self.dropout(self.norm1(attention + query))
        fc_out = self.fc(fc_in)
        out = self.norm2(fc_out + fc_in)
        return out


class Encoder(nn.Module):
    def __init__(self, num_embeddings, max_len, embed_size, heads, num_layers, dropout):
        super(Encoder, self).__init__()
        self.embedding_layer = nn.Embedding(num_embeddings, embed_size)
        self.positional_encoding = nn.Embedding(max_len, embed_size)
        self.transformer_layers = nn.ModuleList(
            [TransformerBlock(embed_size, heads, dropout) for _ in range(num_layers)]
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, input, mask):
        N, seq_len = input.shape
        input_position = torch.arange(0, seq_len, device=input.device).expand(N, seq_len)  # slip 3
        input_embedding = self.embedding_layer(input)
        positional_embedding = self.positional_encoding(input_position)
        combined_input = input_embedding + positional_embedding
        out = self.dropout(combined_input)
        for transformerBlock in self.transformer_layers:
            out = transformerBlock(out, out, out, mask)
        return out


class DecoderBlock(nn.Module):
    def __init__(self, embed_size, heads, dropout):
        super(DecoderBlock, self).__init__()
        self.attention = SelfAttention(embed_size, heads)
        self.transformer_block = TransformerBlock(embed_size, heads, dropout)
        self.norm = nn.LayerNorm(embed_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input, key, value, source_mask, target_mask):
        x = self.attention(input, input, input, target_mask)
        query = self.dropout(self.norm(x + input))
        out = self.transformer_block(query, key, value, source_mask)
        return out


class Decoder(nn.Module):
    def __init__(self, target_vocab_size, max_len, embed_size, heads, num_layers, dropout):
        super(Decoder, self).__init__()
        self.embedding_layer = nn.Embedding(num_embeddings=target_vocab_size, embedding_dim=embed_size)
        self.positional_embedding = nn.Embedding(num_embeddings=max_len, embedding_dim=embed_size)
        self.decoder_layers = nn.ModuleList([
            DecoderBlock(embed_size, heads, dropout) for _ in range(num_layers)
        ])
        self.fc = nn.Linear(embed_size, target_vocab_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input, enc_out, source_mask, target_mask):
        N, seq_len = input.shape
        positions = torch.arange(0, seq_len, device=input.device).expand((N, seq_len))  # slip 3
        x = self.dropout(self.embedding_layer(input) + self.positional_embedding(positions))
        for decoder_layer in self.decoder_layers:
            x = decoder_layer(x, enc_out, enc_out, source_mask, target_mask)
        out = self.fc(x)
        return out


class Transformer(nn.Module):
    def __init__(self, src_pad_idx, source_vocab_size, target_vocab_size, max_len, embed_size, heads, num_layers, dropout):
        super(Transformer, self).__init__()
        self.src_pad_idx = src_pad_idx
        self.encoder = Encoder(source_vocab_size, max_len, embed_size, heads, num_layers, dropout)
        self.decoder = Decoder(target_vocab_size, max_len, embed_size, heads, num_layers, dropout)

    def create_source_mask(self, source_input):
        mask = (source_input != self.src_pad_idx)
        mask = mask.unsqueeze(1).unsqueeze(2)
        return mask  # slip 2

    def create_target_mask(self, target_input):
        N, seq_len = target_input.shape
        mask = torch.tril(torch.ones((N, 1, seq_len, seq_len)))
        return mask

    def forward(self, source_input, target_input):
        source_mask = self.create_source_mask(source_input)
        target_mask = self.create_target_mask(target_input)
        enc_out = self.encoder(source_input, source_mask)
        out = self.decoder(target_input, enc_out, source_mask, target_mask)
        return out


# --- seed 002 -------------------------------------------------------------------------
def scaled_dot_product_attention(Q, K, V):
    d_k = Q.size(-1)
    scores = torch.matmul(Q, K.transpose(-2, -1)) / torch.sqrt(torch.tensor(d_k))
    attention_weights = F.softmax(scores, dim=-1)
    return torch.matmul(attention_weights, V)


class MultiHeadAttention(torch.nn.Module):
    def __init__(self, d_model, num_heads):
        super(MultiHeadAttention, self).__init__()
        assert d_model % num_heads == 0
        self.d_k = d_model // num_heads
        self.num_heads = num_heads
        self.W_q = torch.nn.Linear(d_model, d_model)
        self.W_k = torch.nn.Linear(d_model, d_model)
        self.W_v = torch.nn.Linear(d_model, d_model)
        self.W_o = torch.nn.Linear(d_model, d_model)

    def forward(self, Q, K, V):  # slip 6: prints removed
        batch_size = Q.size(0)
        Q = self.W_q(Q).view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
        K = self.W_k(K).view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
        V = self.W_v(V).view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
        scores = scaled_dot_product_attention(Q, K, V)
        scores = scores.transpose(1, 2).contiguous()
        concat_scores = scores.view(batch_size, -1, self.num_heads * self.d_k)
        return self.W_o(concat_scores)


# --- seed 003 (class SelfAttention there; renamed to keep both in one module) ---------
class PerHeadSelfAttention(nn.Module):
    def __init__(self, embed_size, heads):
        super(PerHeadSelfAttention, self).__init__()
        self.embed_size = embed_size
        self.heads = heads
        self.head_dim = embed_size // heads
        self.queries = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.keys = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.values = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.fc_out = nn.Linear(heads * self.head_dim, embed_size)

    def forward(self, query, keys, values, mask):
        N = query.shape[0]
        q_len, k_len, v_len = query.shape[1], keys.shape[1], values.shape[1]
        queries = self.queries(query.reshape(N, q_len, self.heads, self.head_dim))  # slip 7
        keys = self.keys(keys.reshape(N, k_len, self.heads, self.head_dim))  # slip 7
        values = self.values(values.reshape(N, v_len, self.heads, self.head_dim))  # slip 7
        energy = torch.einsum("nqhd,nkhd->nhqk", [queries, keys])
        if mask is not None:
            energy = energy.masked_fill(mask == 0, float("-1e20"))
        attention = torch.softmax(energy / math.sqrt(self.head_dim), dim=3)
        out = torch.einsum("nhql,nlhd->nqhd", [attention, values])
        out = out.reshape(N, q_len, self.heads * self.head_dim)
        return self.fc_out(out)


# --- seed 004 -------------------------------------------------------------------------
class LearnedPositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()  # slip 8: torch.manual_seed(123) removed
        self.pos_embedding = nn.Embedding(num_embeddings=max_len, embedding_dim=d_model)

    def forward(self, x):
        seq_len = x.size(1)
        positions = torch.arange(seq_len, device=x.device).unsqueeze(0)
        pos_emb = self.pos_embedding(positions)
        x = x + pos_emb
        return x


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model=4, num_heads=2):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.W_Q = nn.Linear(d_model, d_model, bias=False)  # slip 8: manual_seed removed
        self.W_K = nn.Linear(d_model, d_model, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        bsz, seq_len, _ = x.size()
        Q = self.W_Q(x)
        K = self.W_K(x)
        V = self.W_V(x)
        Q = Q.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        K = K.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        V = V.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(Q, K.transpose(-1, -2)) / (self.head_dim ** 0.5)
        attn_weights = F.softmax(scores, dim=-1)
        context = torch.matmul(attn_weights, V)
        context = context.transpose(1, 2).contiguous()
        context = context.view(bsz, seq_len, self.d_model)
        out = self.out_proj(context)
        return out, attn_weights


class FeedForward(nn.Module):
    def __init__(self, d_model=4, hidden_dim=8):
        super().__init__()
        self.linear1 = nn.Linear(d_model, hidden_dim)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(hidden_dim, d_model)

    def forward(self, x):
        out = self.linear1(x)
        out = self.relu(out)
        out = self.linear2(out)
        return out
