"""Seed 001's seq2seq Transformer in PyTorch: Encoder, Decoder and the model that builds
its own masks.

Shapes: B batch, S source length, T target length, D model width, V vocabulary (legend in
``flaxformer_mini/__init__.py``). Masks are keep-masks: 1/True = attend, 0/False = don't.
"""

import torch
import torch.nn as nn

from torch_ref.layers import DecoderBlock, TransformerBlock

# The values of Transformer's tie_embeddings (flaxformer_mini.model.config.TIE_EMBEDDINGS:
# torch_ref imports nothing of the JAX side).
TIE_EMBEDDINGS = ("decoder", "all")


def check_tokens(tokens, vocab_size, max_len, name="input"):
    """Raise a clear error for token ids the embedding tables cannot look up.

    PyTorch would raise too, but as "index out of range in self" from deep inside
    nn.Embedding, without saying which input, which limit, or whether it was the
    position table (sequence too long) or the vocabulary that overflowed.
    """
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"{name}: token ids must be integers, got dtype {tokens.dtype}")
    # nn.Embedding looks up int32 and int64 ids only: other integer dtypes fail inside it
    # ("Expected tensor for argument #1 'indices'") or in the value check below (uint16, uint32).
    if tokens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: token ids must be torch.int32 or torch.int64 (what nn.Embedding looks up), "
                        f"got dtype {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"{name}: expected shape (batch, length), got {tuple(tokens.shape)}")
    if tokens.shape[1] > max_len:
        raise ValueError(f"{name}: length {tokens.shape[1]} exceeds max_len={max_len} (the positional table's size)")
    # The value check reads the ids back to the host (``int(...)``), which torch.compile can
    # only do by breaking the graph. Under compilation it is skipped, as a traced value check
    # is in the Flax twin (a plain ``jax.jit`` is free of it too); the shape, dtype and
    # length checks above still run, at trace time.
    if tokens.numel() and not torch.compiler.is_compiling():
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{name}: token id {bad} is outside the vocabulary [0, {vocab_size})")


class Encoder(nn.Module):
    """Token embedding + learned position embedding, dropout, then ``num_layers`` blocks.
    ``ffn_dim`` (keyword-only): the blocks' feed-forward width F; None keeps the seed's F = D."""

    def __init__(self, num_embeddings, max_len, embed_size, heads, num_layers, dropout, *, ffn_dim=None):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.max_len = max_len
        self.embedding_layer = nn.Embedding(num_embeddings, embed_size)
        self.positional_encoding = nn.Embedding(max_len, embed_size)
        self.transformer_layers = nn.ModuleList(
            [TransformerBlock(embed_size, heads, dropout, ffn_dim=ffn_dim) for _ in range(num_layers)]
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, input, mask, *, check_inputs=True):
        # check_inputs=False: the caller (Transformer) has checked ``input`` already.
        if check_inputs:
            check_tokens(input, self.num_embeddings, self.max_len, "source input")
        B, S = input.shape
        # Seed slip 3: the seed's torch.arange is made on the CPU whatever input's device.
        input_position = torch.arange(0, S, device=input.device).expand(B, S)

        out = self.dropout(self.embedding_layer(input) + self.positional_encoding(input_position))
        for transformerBlock in self.transformer_layers:
            out = transformerBlock(out, out, out, mask)
        return out  # (B, S, D)


class Decoder(nn.Module):
    """Target embedding + positions, ``num_layers`` decoder blocks, projection to V logits.
    ``ffn_dim`` as in Encoder. ``tie_output=True``: the projection's weight is the embedding
    table, one Parameter under both keys (``fc.weight``, ``embedding_layer.weight``); its bias
    stays its own."""

    def __init__(self, target_vocab_size, max_len, embed_size, heads, num_layers, dropout, *, ffn_dim=None,
                 tie_output=False):
        super().__init__()
        self.target_vocab_size = target_vocab_size
        self.max_len = max_len
        self.embedding_layer = nn.Embedding(num_embeddings=target_vocab_size, embedding_dim=embed_size)
        self.positional_embedding = nn.Embedding(num_embeddings=max_len, embedding_dim=embed_size)
        self.decoder_layers = nn.ModuleList(
            [DecoderBlock(embed_size, heads, dropout, ffn_dim=ffn_dim) for _ in range(num_layers)]
        )
        self.fc = nn.Linear(embed_size, target_vocab_size)
        if tie_output:
            # Linear's weight is (V, D), as the Embedding's table: the same tensor fits both.
            # Tied after the Linear drew its own, so every other initial value is the untied
            # model's of the same seed (its RNG draws are the same, in the same order).
            self.fc.weight = self.embedding_layer.weight
        self.dropout = nn.Dropout(dropout)

    def forward(self, input, enc_out, source_mask, target_mask, *, check_inputs=True):
        if check_inputs:  # False: checked by the caller (Transformer)
            check_tokens(input, self.target_vocab_size, self.max_len, "target input")
        B, T = input.shape
        # Seed slip 3: the seed's torch.arange is made on the CPU whatever input's device.
        positions = torch.arange(0, T, device=input.device).expand((B, T))

        x = self.dropout(self.embedding_layer(input) + self.positional_embedding(positions))
        for decoder_layer in self.decoder_layers:
            x = decoder_layer(x, enc_out, enc_out, source_mask, target_mask)
        # No softmax: the logits go to a cross-entropy loss, which applies log-softmax itself.
        return self.fc(x)  # (B, T, V)


class Transformer(nn.Module):
    """Seed 001's encoder-decoder. ``forward(source_input, target_input)`` -> logits (B, T, V).

    ``ffn_dim`` (keyword-only): the feed-forward width F of every block; None keeps the
    seed's F = D (the paper's base model has D = 512, F = 2048).

    ``tie_embeddings`` (keyword-only): None keeps the seed's separate tables. ``"decoder"``:
    the output projection's weight is the target embedding (fairseq's
    ``--share-decoder-input-output-embed``); ``"all"``: the source embedding is that table too
    (``--share-all-embeddings``: one vocabulary, so the two vocabulary sizes must be equal).
    A tied weight is one Parameter; ``state_dict()`` still lists each of its keys (the seed's
    keys, every one), all holding that tensor.
    """

    def __init__(self, src_pad_idx, source_vocab_size, target_vocab_size, max_len, embed_size, heads, num_layers,
                 dropout, *, ffn_dim=None, tie_embeddings=None):
        super().__init__()
        if tie_embeddings is not None and tie_embeddings not in TIE_EMBEDDINGS:
            raise ValueError(f"tie_embeddings must be None or one of {', '.join(map(repr, TIE_EMBEDDINGS))}, "
                             f"got {tie_embeddings!r}")
        if heads < 1 or embed_size % heads:
            # SelfAttention splits D into H heads of D // H: the seed builds such a model and its
            # first forward fails in a reshape that names neither size.
            raise ValueError(f"heads must be a positive divisor of embed_size, got heads={heads} and "
                             f"embed_size={embed_size}: each head attends over embed_size // heads of the width")
        if tie_embeddings == "all" and source_vocab_size != target_vocab_size:
            raise ValueError(f"tie_embeddings='all' shares one table between the source and target vocabularies, "
                             f"which must then have one size, got {source_vocab_size} and {target_vocab_size}")
        self.src_pad_idx = src_pad_idx
        self.encoder = Encoder(source_vocab_size, max_len, embed_size, heads, num_layers, dropout, ffn_dim=ffn_dim)
        self.decoder = Decoder(target_vocab_size, max_len, embed_size, heads, num_layers, dropout, ffn_dim=ffn_dim,
                               tie_output=tie_embeddings is not None)
        if tie_embeddings == "all":
            self.encoder.embedding_layer.weight = self.decoder.embedding_layer.weight

    def create_source_mask(self, source_input):
        mask = source_input != self.src_pad_idx
        # Seed slip 2: the seed builds this mask and returns nothing, so it never masks.
        return mask.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, S): every head, every query

    def create_target_mask(self, target_input):
        B, T = target_input.shape
        # Causal: query t sees keys 0..t. Seed slip 4: the seed's prose calls the tril of the
        # scores a softmax; the softmax happens inside SelfAttention. Seed slip 3: the seed's
        # torch.ones is made on the CPU whatever input's device, as its torch.arange is.
        return torch.tril(torch.ones((B, 1, T, T), device=target_input.device))  # (B, 1, T, T)

    def encode(self, source_input, *, check_inputs=True):
        """Encoder output (B, S, D) and the source mask (B, 1, 1, S). ``check_inputs=False``
        skips the token check, for a caller that has checked ``source_input`` already."""
        if check_inputs:
            check_tokens(source_input, self.encoder.num_embeddings, self.encoder.max_len, "source input")
        source_mask = self.create_source_mask(source_input)
        return self.encoder(source_input, source_mask, check_inputs=False), source_mask

    def forward(self, source_input, target_input):
        # Both inputs are checked here, once each (each check reads the ids back to the host),
        # before any layer runs; the submodules do not check again.
        check_tokens(source_input, self.encoder.num_embeddings, self.encoder.max_len, "source input")
        check_tokens(target_input, self.decoder.target_vocab_size, self.decoder.max_len, "target input")
        if source_input.shape[0] != target_input.shape[0]:
            raise ValueError(
                f"source and target batch sizes differ: {source_input.shape[0]} vs {target_input.shape[0]}"
            )
        enc_out, source_mask = self.encode(source_input, check_inputs=False)
        target_mask = self.create_target_mask(target_input)
        return self.decoder(target_input, enc_out, source_mask, target_mask, check_inputs=False)
