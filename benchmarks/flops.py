"""Analytic FLOP counts of seed 001's Transformer: forward, train step and greedy decoding.

Shapes: B batch, S source length, T target length, N new tokens, D width, H heads,
F feed-forward width (``ffn_dim``; the seed has no expansion: F = D), L layers per stack, V target
vocabulary. A multiply-add counts as 2 FLOPs.

What is counted (per the usual convention for "model FLOPs", e.g. PaLM's MFU):

- every Linear: 2 * in * out per token (biases, ReLU not counted);
- attention, per head-summed query: scores Q K^T, 2 * Tq * Tk * D, and the weighted sum of
  values, 2 * Tq * Tk * D. The causal mask is applied to a full T x T score matrix (the
  code computes every score, masked ones included), so no factor 1/2;
- encoder layer: self-attention (4 projections of D x D) + feed-forward (D x F, F x D);
- decoder layer: masked self-attention + cross-attention over the S encoder positions (its
  keys and values are projections of the encoder output) + feed-forward;
- the output projection D x V. Embedding lookups, LayerNorm, softmax, dropout, the loss and
  the optimizer update are not counted: they are memory-bound, O(B T D) or O(parameters),
  and together well under 1% of the FLOPs at the base size.

Train step = 3 x forward: the backward pass costs two matmuls per forward matmul (gradient
with respect to the input and to the weight). Seed-sized base preset (B=16, S=T=64, D=F=512,
L=6, V=1000): forward 55.0 GFLOP, train step 165.0 GFLOP (XLA's own cost analysis of the
compiled Flax train step, which also counts elementwise work: 167.4 GFLOP).

Greedy decoding of N tokens has three costs here, because the paths run different algorithms:

- ``decode_cached``: encoder once, cross-attention keys/values once per layer, then per new
  token one position through the decoder, its self-attention reading ``key_slots(t)`` cached
  keys (t + 1 for the minimal algorithm; flaxformer_mini's cache attends over all N slots,
  masked, so its executed count uses N);
- ``decode_uncached_growing``: encoder once, then for t = 1..N the whole decoder on the t
  tokens so far (torch_ref.decoding.greedy_decode, seed 001's inference), cross-attention
  keys/values recomputed every step;
- ``decode_uncached_fixed``: encoder once, then N times the whole decoder on a fixed buffer of
  N positions (flaxformer_mini.decode.search.greedy_decode_uncached: one shape, one compilation).
"""


def linear(tokens, d_in, d_out):
    return 2 * tokens * d_in * d_out


def attention(B, Tq, Tk, D, kv_tokens):
    """One multi-head attention: Q and output projections of Tq tokens, K and V projections of
    ``kv_tokens`` tokens (0 when they come from a cache), scores and weighted sum over Tk keys."""
    projections = 2 * linear(B * Tq, D, D) + 2 * linear(B * kv_tokens, D, D)
    return projections + 2 * (2 * B * Tq * Tk * D)


def feed_forward(B, T, D, F):
    return linear(B * T, D, F) + linear(B * T, F, D)


def encoder(B, S, D, L, F):
    return L * (attention(B, S, S, D, kv_tokens=S) + feed_forward(B, S, D, F))


def decoder(B, T, S, D, L, F, V):
    """The full decoder on T target positions over S encoder positions (keys/values projected)."""
    per_layer = attention(B, T, T, D, kv_tokens=T) + attention(B, T, S, D, kv_tokens=S) + feed_forward(B, T, D, F)
    return L * per_layer + linear(B * T, D, V)


def _dims(config):
    D = config.embed_size
    F = config.ffn_dim or D  # the seed has no expansion (ffn_dim None: F = D)
    return D, config.num_layers, F, config.target_vocab_size


def forward(config, B, S, T):
    D, L, F, V = _dims(config)
    return encoder(B, S, D, L, F) + decoder(B, T, S, D, L, F, V)


def train_step(config, B, S, T):
    return 3 * forward(config, B, S, T)


def decode_cached(config, B, S, N, key_slots=None):
    """Encoder + cross K/V once, then N single-position decoder steps. ``key_slots(t)`` is the
    number of self-attention keys read at step t (0-based); default t + 1."""
    D, L, F, V = _dims(config)
    key_slots = key_slots or (lambda t: t + 1)
    total = encoder(B, S, D, L, F) + L * 2 * linear(B * S, D, D)
    for t in range(N):
        per_layer = (attention(B, 1, key_slots(t), D, kv_tokens=1) + attention(B, 1, S, D, kv_tokens=0)
                     + feed_forward(B, 1, D, F))
        total += L * per_layer + linear(B, D, V)
    return total


def decode_uncached_growing(config, B, S, N):
    D, L, F, V = _dims(config)
    return encoder(B, S, D, L, F) + sum(decoder(B, t, S, D, L, F, V) for t in range(1, N + 1))


def decode_uncached_fixed(config, B, S, N):
    D, L, F, V = _dims(config)
    return encoder(B, S, D, L, F) + N * decoder(B, N, S, D, L, F, V)
