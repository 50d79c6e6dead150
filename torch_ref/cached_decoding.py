"""Incremental decoding with a key/value cache for ``torch_ref.Transformer``: greedy and beam.

This is how a PyTorch user decodes (gpt-fast's ``generate.py``, fairseq's incremental
state): the source is encoded once, every decoder layer's cross-attention keys/values of the
encoder output are projected once, and each new token runs through the decoder alone,
appending its self-attention keys/values to a cache. The cache is preallocated at its full
size (B, H, N, K) and written in place at position t, and t is a tensor, so every step has
the same shapes and ``torch.compile`` compiles the step once (``compile=True``).

It runs the modules of an unchanged ``torch_ref.Transformer`` (the seed's weights and
state-dict keys) and reproduces the seed's numerics: masked scores are filled with -1e20
*before* the scaling by 1/sqrt(K) (``torch_ref/attention.py``). Greedy decoding picks the
same tokens as ``torch_ref.decoding.greedy_decode`` (no cache) and as
``flaxformer_mini.decode.search.greedy_decode``; beam search follows
``flaxformer_mini.decode.search.beam_search`` rule for rule (fairseq's finished hypotheses, GNMT
length penalty).

Shapes: B batch, S source length, N decode positions, L decoder layers, H heads, K head
width, D model width, V target vocabulary, W beams.
"""


import operator

import torch

from torch_ref.attention import MASK_FILL_VALUE
from torch_ref.decoding import BOS, EOS, PAD, check_decode_inputs

# The Flax twin's defaults (flaxformer_mini.decode), repeated: torch_ref never imports JAX.
DEFAULT_LENGTH_PENALTY = 0.6
_NEG = -1e9  # a score no hypothesis reaches; finite, so no inf - inf = NaN anywhere


def _heads(linear, x, H):
    """Project x (B, T, D) with ``linear`` and split heads: (B, H, T, K)."""
    B, T, D = x.shape
    return linear(x).reshape(B, T, H, D // H).transpose(1, 2)


def _attend(attention, x, k, v, mask):
    """``SelfAttention.forward`` for queries x (B, 1, D) against cached k, v (B, H, N, K),
    with the seed's order: fill masked scores with -1e20, then scale by 1/sqrt(K)."""
    B, T, _ = x.shape
    H, K = attention.heads, attention.head_dim
    q = attention.W_q(x).reshape(B, T, H, K)
    scores = torch.einsum("bthk,bhsk->bhts", q, k)  # (B, H, 1, N)
    scores = scores.masked_fill(mask == 0, MASK_FILL_VALUE)
    weights = torch.softmax(scores / (K**0.5), dim=3)
    out = torch.einsum("bhts,bhsk->bthk", weights, v).reshape(B, T, H * K)
    return attention.fc(out)


class KVCache:
    """Per-layer caches: self-attention (L, B, H, N, K), written at position t; cross-attention
    (L, B, H, S, K), computed once from the encoder output; the source mask (B, 1, 1, S)."""

    def __init__(self, self_k, self_v, cross_k, cross_v, source_mask):
        self.self_k, self.self_v = self_k, self_v
        self.cross_k, self.cross_v = cross_k, cross_v
        self.source_mask = source_mask

    def repeat_rows(self, n):
        """Each item's cache repeated ``n`` times, item b's copies at rows b*n..b*n+n-1: beam
        search's layout, so the encoder and the cross-attention projections run once per
        item, not once per beam."""
        return KVCache(*(x.repeat_interleave(n, dim=1) for x in (self.self_k, self.self_v, self.cross_k, self.cross_v)),
                       self.source_mask.repeat_interleave(n, dim=0))

    def reorder(self, rows):
        """Keep the self-attention cache rows ``rows`` (B,): beam search's parent beams."""
        self.self_k = self.self_k.index_select(1, rows)
        self.self_v = self.self_v.index_select(1, rows)


def prefill(model, source, max_positions):
    """Encode ``source`` (B, S) once and build the cache for ``max_positions`` positions."""
    enc_out, source_mask = model.encode(source)  # (B, S, D), (B, 1, 1, S)
    layers = model.decoder.decoder_layers
    cross = [layer.transformer_block.attention for layer in layers]
    H = cross[0].heads
    cross_k = torch.stack([_heads(a.W_k, enc_out, H) for a in cross])  # (L, B, H, S, K)
    cross_v = torch.stack([_heads(a.W_v, enc_out, H) for a in cross])
    B = source.shape[0]
    empty = enc_out.new_zeros((len(layers), B, H, max_positions, cross[0].head_dim))
    return KVCache(empty, empty.clone(), cross_k, cross_v, source_mask)


def decode_one_token(model, self_k, self_v, cross_k, cross_v, source_mask, tokens, t):
    """Logits (B, V) for the next token after ``tokens`` (B,) at position ``t`` (a 0-d int64
    tensor, so a compiled step serves every t). Writes position t of ``self_k``/``self_v``
    (L, B, H, N, K) in place."""
    decoder = model.decoder
    N = self_k.shape[3]
    pos = t.reshape(1)
    # Decoder.forward for one position: token + position embedding, (eval) dropout.
    x = decoder.dropout(decoder.embedding_layer(tokens[:, None]) + decoder.positional_embedding(pos)[None])  # (B, 1, D)
    # Query t sees positions 0..t; positions past t hold zeros, masked like the causal mask.
    self_mask = (torch.arange(N, device=tokens.device) <= t)[None, None, None, :]  # (1, 1, 1, N)
    for i, layer in enumerate(decoder.decoder_layers):
        H = layer.attention.heads
        # (B, H, 1, K) at t; cast, since under torch.autocast the projection is bfloat16
        # while the cache keeps the encoder output's dtype.
        self_k[i].index_copy_(2, pos, _heads(layer.attention.W_k, x, H).to(self_k.dtype))
        self_v[i].index_copy_(2, pos, _heads(layer.attention.W_v, x, H).to(self_v.dtype))
        # DecoderBlock.forward, then TransformerBlock.forward, with cached keys/values.
        a = _attend(layer.attention, x, self_k[i], self_v[i], self_mask)
        query = layer.dropout(layer.norm(a + x))
        block = layer.transformer_block
        a = _attend(block.attention, query, cross_k[i], cross_v[i], source_mask)
        fc_in = block.dropout(block.norm1(a + query))
        x = block.norm2(block.fc(fc_in) + fc_in)
    return decoder.fc(x)[:, 0]  # (B, V)


class CachedDecoder:
    """Greedy and beam decoding of ``model`` (a ``torch_ref.Transformer``) with a KV cache.

    ``compile=True`` compiles the one-token step with ``torch.compile`` (static shapes, so
    one graph for every step; beam search's cache reordering stays eager).
    """

    def __init__(self, model, compile=False, backend="inductor"):
        self.model = model
        step = decode_one_token
        if compile:
            step = torch.compile(decode_one_token, dynamic=False, backend=backend)
        self._step = step

    def _start(self, source, max_new_tokens):
        return check_decode_inputs(self.model, source, max_new_tokens)

    def step(self, cache, tokens, t):
        return self._step(self.model, cache.self_k, cache.self_v, cache.cross_k, cache.cross_v, cache.source_mask,
                          tokens, t)

    def greedy(self, source, max_new_tokens):
        """Greedy tokens (B, N) int64 for ``source`` (B, S): EOS included, PAD after it."""
        N = self._start(source, max_new_tokens)
        was_training = self.model.training
        self.model.eval()  # no dropout while decoding
        try:
            with torch.no_grad():
                B, device = source.shape[0], source.device
                cache = prefill(self.model, source, N)
                tokens = torch.full((B,), BOS, dtype=torch.long, device=device)
                out = torch.full((B, N), PAD, dtype=torch.long, device=device)
                done = torch.zeros(B, dtype=torch.bool, device=device)
                for t in range(N):
                    logits = self.step(cache, tokens, torch.tensor(t, device=device))
                    tokens = logits.argmax(dim=-1).masked_fill(done, PAD)  # ties: first maximum, as jnp.argmax
                    out[:, t] = tokens
                    done |= tokens == EOS
                    if bool(done.all()):
                        break
        finally:
            self.model.train(was_training)
        return out

    def beam_search(self, source, max_new_tokens, beam_size=4, alpha=DEFAULT_LENGTH_PENALTY):
        """(tokens (B, W, N), scores (B, W)), best first; a score is the hypothesis's
        log-probability divided by ``length_penalty(length, alpha)``. The rules are
        ``flaxformer_mini.decode.search.beam_search``'s (fairseq's)."""
        if isinstance(beam_size, bool) or not hasattr(beam_size, "__index__"):
            raise TypeError(f"beam size must be an integer, got {beam_size!r}")
        beam_size = operator.index(beam_size)
        if beam_size < 1:
            raise ValueError(f"beam size must be >= 1, got {beam_size}")
        if isinstance(alpha, (str, bytes, bool)) or not hasattr(alpha, "__float__"):
            raise TypeError(f"length penalty alpha must be a number, got {alpha!r}")
        if not alpha >= 0:  # NaN included
            raise ValueError(f"length penalty alpha must be >= 0, got {alpha}")
        N = self._start(source, max_new_tokens)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self._beam(source, N, beam_size, float(alpha))
        finally:
            self.model.train(was_training)

    def _beam(self, source, N, W, alpha):
        B, device = source.shape[0], source.device
        V = self.model.decoder.target_vocab_size
        cache = prefill(self.model, source, N).repeat_rows(W)  # item b's beams: rows b*W..b*W+W-1
        tokens = torch.full((B * W,), BOS, dtype=torch.long, device=device)
        alive_seq = torch.full((B, W, N), PAD, dtype=torch.long, device=device)
        fin_seq = alive_seq.clone()
        alive_logp = torch.full((B, W), _NEG, device=device)
        alive_logp[:, 0] = 0.0  # one live beam at the start
        fin_score = torch.full((B, W), _NEG, device=device)
        top_w = (torch.arange(2 * W, device=device) < W)[None, :]  # (1, 2W)
        t = 0
        while t < N and not bool((fin_score[:, -1] > _NEG / 2).all()):
            logits = self.step(cache, tokens, torch.tensor(t, device=device))  # (B*W, V)
            logp = torch.log_softmax(logits.float(), dim=-1).reshape(B, W, V) + alive_logp[..., None]
            # 2W candidates: even if W of them end in EOS, W remain to continue.
            cand_logp, flat = _top_k(logp.reshape(B, W * V), 2 * W)
            beam, token = flat // V, flat % V
            cand_seq = _take(alive_seq, beam).clone()
            cand_seq[:, :, t] = token
            is_eos = token == EOS
            # fairseq: an EOS candidate is final only among the top W candidates, and an item
            # is done once it has W final hypotheses.
            done = fin_score[:, -1] > _NEG / 2
            # A dead beam's candidate (log-probability near _NEG) is never final: divided by a
            # length penalty above 2 its score would pass _NEG / 2 (a phantom finished hypothesis).
            final = is_eos & top_w & (cand_logp > _NEG / 2) & ~done[:, None]
            cand_score = torch.where(final, cand_logp / length_penalty(t + 1, alpha), torch.tensor(_NEG))
            fin_score, keep = _top_k(torch.cat([fin_score, cand_score], dim=1), W)
            fin_seq = _take(torch.cat([fin_seq, cand_seq], dim=1), keep)
            # Alive: the best W candidates that did not end.
            alive_logp, keep = _top_k(cand_logp.masked_fill(is_eos, _NEG), W)
            alive_seq, parent = _take(cand_seq, keep), _take(beam, keep)
            cache.reorder((torch.arange(B, device=device)[:, None] * W + parent).reshape(-1))
            tokens = _take(token, keep).reshape(-1)
            t += 1
        # Items that ran out of positions before W hypotheses finished: their live beams
        # compete, scored at the length they reached.
        done = fin_score[:, -1] > _NEG / 2
        alive_score = torch.where(done[:, None] | (alive_logp <= _NEG / 2), torch.tensor(_NEG),
                                  alive_logp / length_penalty(t, alpha))
        scores, keep = _top_k(torch.cat([fin_score, alive_score], dim=1), W)
        return _take(torch.cat([fin_seq, alive_seq], dim=1), keep), scores


def length_penalty(length, alpha):
    """GNMT's ((5 + length) / 6) ** alpha (Wu et al. 2016), as in the Flax twin."""
    return ((5.0 + length) / 6.0) ** alpha


def _top_k(x, k):
    """The k largest of x (B, M) along axis 1, ties by lower index first: jax.lax.top_k's
    order (torch.topk leaves the order of ties unspecified, and -1e9 scores tie often)."""
    values, index = torch.sort(x, dim=1, descending=True, stable=True)
    return values[:, :k], index[:, :k]


def _take(x, index):
    """x (B, M, ...) gathered along axis 1 by index (B, W) -> (B, W, ...)."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], index]


def greedy_decode_cached(model, source, max_new_tokens):
    """Greedy tokens (B, N) with the KV cache, eager: ``CachedDecoder(model).greedy``."""
    return CachedDecoder(model).greedy(source, max_new_tokens)


def beam_search(model, source, max_new_tokens, *, beam_size=4, alpha=DEFAULT_LENGTH_PENALTY):
    """Beam search with the KV cache, eager: ``CachedDecoder(model).beam_search``."""
    return CachedDecoder(model).beam_search(source, max_new_tokens, beam_size=beam_size, alpha=alpha)
