"""Greedy decoding for the PyTorch reference, the way seed 001 describes inference: encode the
source once, then run the decoder over the whole prefix for every new token (no cache).

This is the torch side of the cross-framework decoding check: with the same weights it must
pick the same tokens as ``flaxformer_mini.decode.search.greedy_decode`` (which uses a KV cache).
It is a reference, not how PyTorch users decode: ``torch_ref.cached_decoding`` has the
key/value-cache decoder (greedy and beam search) that the benchmark compares with Flax's.

Shapes: B batch, S source length, N new tokens, V target vocabulary.
"""

import operator

import torch

from torch_ref.model import check_tokens

# The special-token ids of flaxformer_mini.data (PAD = 0, BOS = 1, EOS = 2). torch_ref must
# work without JAX, so it cannot import that module; the defaults repeat its values.
PAD, BOS, EOS = 0, 1, 2


def greedy_decode(model, source, max_new_tokens, bos=BOS, eos=EOS, pad=PAD):
    """Greedy tokens (B, max_new_tokens) int64 for ``source`` (B, S): EOS included, ``pad``
    after it (and after the last step, when every row finished early).

    The decoder reads BOS plus the first N - 1 chosen tokens (the last one is emitted, never
    fed back), so ``max_new_tokens`` may be at most the model's ``max_len``.
    """
    N = check_decode_inputs(model, source, max_new_tokens)

    was_training = model.training
    model.eval()  # no dropout while decoding
    try:
        with torch.no_grad():
            B, device = source.shape[0], source.device
            enc_out, source_mask = model.encode(source)  # (B, S, D), (B, 1, 1, S): once
            ys = torch.full((B, 1), bos, dtype=torch.long, device=device)  # (B, t + 1): BOS + chosen
            out = torch.full((B, N), pad, dtype=torch.long, device=device)
            done = torch.zeros(B, dtype=torch.bool, device=device)
            for t in range(N):
                logits = model.decoder(ys, enc_out, source_mask, model.create_target_mask(ys))  # (B, t + 1, V)
                token = logits[:, -1].argmax(dim=-1)  # ties: the first maximum, as jnp.argmax
                token = token.masked_fill(done, pad)  # after EOS, padding
                out[:, t] = token
                done |= token == eos
                if t + 1 == N or bool(done.all()):
                    break
                ys = torch.cat([ys, token[:, None]], dim=1)
    finally:
        model.train(was_training)
    return out


def check_decode_inputs(model, source, max_new_tokens):
    """Check a decoder's inputs (the token ids, a non-empty source, 1 <= max_new_tokens <=
    max_len); return max_new_tokens as an int. Shared by both torch decoders."""
    check_tokens(source, model.encoder.num_embeddings, model.encoder.max_len, "source")
    if source.shape[1] == 0:
        raise ValueError("source: empty input (length 0)")
    try:
        N = operator.index(max_new_tokens)
    except TypeError:
        raise TypeError(f"max_new_tokens must be an integer, got {max_new_tokens!r}") from None
    max_len = model.decoder.max_len
    if N < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {N}")
    if N > max_len:
        raise ValueError(
            f"max_new_tokens={N} exceeds max_len={max_len}: the positional table holds {max_len} "
            f"decoder positions (BOS + {max_len - 1} fed-back tokens)"
        )
    return N
