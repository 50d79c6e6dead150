"""The decoder's key/value cache, and the two steps every search is made of, as in gpt-fast:

- ``prefill(model, source, N)``: encodes the source once, computes every decoder layer's
  cross-attention keys/values of the encoder output once, and allocates the self-attention
  cache for N target positions;
- ``decode_one_token(model, cache, tokens, t)``: runs one new token per sequence through the
  decoder, writing its keys/values into the cache at position t.

Shapes: B batch, S source length, N decode positions, L decoder layers, H heads, K head
width, V target vocabulary.
"""

import numbers

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_mini.model import scanned
from flaxformer_mini.model.token_checks import check_tokens


@flax.struct.dataclass
class DecodeCache:
    # Head-first, as SelfAttention.project_kv returns them: position t of every layer is
    # written in place, and attention reads the cache without transposing it.
    self_k: jax.Array  # (L, B, H, N, K): keys of the target positions written so far
    self_v: jax.Array  # (L, B, H, N, K)
    cross_k: jax.Array  # (L, B, H, S, K): encoder output projected once per layer
    cross_v: jax.Array  # (L, B, H, S, K)
    source_mask: jax.Array  # (B, 1, 1, S)

    def repeat_rows(self, n):
        """Each item's cache repeated ``n`` times, item b's copies at rows b*n..b*n+n-1: beam
        search's layout, so the encoder and the cross-attention projections run once per
        item, not once per beam."""
        return DecodeCache(*(jnp.repeat(x, n, axis=1) for x in (self.self_k, self.self_v, self.cross_k, self.cross_v)),
                           source_mask=jnp.repeat(self.source_mask, n, axis=0))


def prefill(model, source, max_positions, *, check_inputs=True):
    """Encode ``source`` (B, S) and build the cache for ``max_positions`` target positions (at
    most the decoder's ``max_len``, its positional table's size). The model computes in the
    mode it is in: decode in eval mode (``model.eval()``), as the searches do, or its dropout
    applies. ``check_inputs=False``: the caller (a search) has checked ``source`` already."""
    if check_inputs:
        # A bool is no count, as decode/options.py's integer_option rules for the searches' counts.
        if (not isinstance(max_positions, numbers.Integral) or isinstance(max_positions, bool)
                or not 1 <= max_positions <= model.decoder.max_len):
            raise ValueError(f"prefill: max_positions must be an int in [1, {model.decoder.max_len}] (the decoder's "
                             f"max_len), got {max_positions!r}")
    enc_out, source_mask = model.encode(source, check_inputs=check_inputs)
    decoder = model.decoder
    cross_k, cross_v = scanned.per_layer(  # (L, B, H, S, K) each
        decoder.decoder_layers, lambda layer: layer.transformer_block.attention.project_kv(enc_out, enc_out),
        scan=decoder.scan_layers)
    L, B, H, _, K = cross_k.shape
    empty = jnp.zeros((L, B, H, max_positions, K), cross_k.dtype)
    return DecodeCache(self_k=empty, self_v=empty, cross_k=cross_k, cross_v=cross_v, source_mask=source_mask)


def decode_one_token(model, cache: DecodeCache, tokens, t, *, check_inputs=True):
    """Logits (B, V) for the next token after ``tokens`` (B,) at position ``t``; the cache
    with position t's keys/values written. ``check_inputs``: the token ids, and a concrete
    ``t`` against the cache's positions (a traced one, as in a search's compiled loop, is the
    caller's to keep in range); False for a caller that made them itself."""
    decoder = model.decoder
    N = cache.self_k.shape[3]
    if check_inputs:
        tokens = jnp.asarray(tokens)  # a list too: the check and the step below read one array
        if tokens.ndim != 1:
            raise ValueError(f"decode_one_token: tokens are one id per sequence, shape (B,), got {tuple(tokens.shape)}")
        check_tokens(tokens[:, None], decoder.target_vocab_size, decoder.max_len, "decode_one_token's tokens")
        if not isinstance(t, jax.core.Tracer) and not 0 <= int(t) < N:
            raise ValueError(f"decode_one_token: position t={int(t)} is outside the cache's {N} positions "
                             f"(0..{N - 1}; prefill's max_positions)")
    position = jnp.full((tokens.shape[0], 1), t)
    # Same as Decoder.__call__ for one position: token + position embedding, (eval) dropout.
    x = decoder.dropout(decoder.embedding_layer(tokens[:, None]) + decoder.positional_embedding(position))  # (B, 1, D)
    # Query t sees positions 0..t; positions past t hold zeros, masked like the causal mask.
    self_mask = (jnp.arange(N) <= t)[None, None, None, :]  # (1, 1, 1, N)
    if decoder.scan_layers:
        x, self_k, self_v = _scanned_step(decoder.decoder_layers, cache, x, t, self_mask)
        return decoder.fc(x)[:, 0], cache.replace(self_k=self_k, self_v=self_v)
    self_k, self_v = cache.self_k, cache.self_v
    for i, layer in enumerate(decoder.decoder_layers):
        k, v = layer.attention.project_kv(x, x)  # (B, H, 1, K)
        start = (i, 0, 0, t, 0)  # layer i, position t
        self_k = jax.lax.dynamic_update_slice(self_k, k[None].astype(self_k.dtype), start)
        self_v = jax.lax.dynamic_update_slice(self_v, v[None].astype(self_v.dtype), start)
        x = layer.step(x, (self_k[i], self_v[i]), (cache.cross_k[i], cache.cross_v[i]), cache.source_mask, self_mask)
    logits = decoder.fc(x)[:, 0]  # (B, V)
    return logits, cache.replace(self_k=self_k, self_v=self_v)


def _scanned_step(layers, cache, x, t, self_mask):
    """``decode_one_token``'s layer loop over a stacked decoder (``scan_layers``): one
    ``nnx.scan`` over the layers and their cache slices, carrying x (B, 1, D). Returns x and
    the self-attention cache (L, B, H, N, K) with position t written."""

    def layer_step(x, layer, self_k, self_v, cross_k, cross_v):  # one layer's slices: (B, H, N, K)
        k, v = layer.attention.project_kv(x, x)  # (B, H, 1, K)
        self_k = jax.lax.dynamic_update_slice(self_k, k.astype(self_k.dtype), (0, 0, t, 0))
        self_v = jax.lax.dynamic_update_slice(self_v, v.astype(self_v.dtype), (0, 0, t, 0))
        x = layer.step(x, (self_k, self_v), (cross_k, cross_v), cache.source_mask, self_mask)
        return x, self_k, self_v

    scan = nnx.scan(layer_step, in_axes=(nnx.Carry, 0, 0, 0, 0, 0), out_axes=(nnx.Carry, 0, 0))
    return scan(x, layers, cache.self_k, cache.self_v, cache.cross_k, cache.cross_v)
