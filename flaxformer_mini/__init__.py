"""flaxformer-mini: a Flax NNX port of a from-scratch PyTorch seq2seq Transformer.

Every module of the seed tutorials has a twin here with the same class name, constructor
arguments (plus a keyword-only ``rngs: nnx.Rngs``) and call signature as in ``torch_ref``,
and parameter paths that mirror the torch ``state_dict`` keys
(``encoder.transformer_layers.0.attention.W_q.weight`` <-> ``encoder/transformer_layers/0/attention/W_q/kernel``).

Shape legend, used in comments and einsum strings across the project:

    B  batch                 D  model width (embed_size, d_model)
    S  source (key) length   H  attention heads
    T  target (query) length K  head width (D // H)
    V  vocabulary            F  feed-forward width
    L  layers (a stacked axis: decoding caches, scanned blocks)
    N  decoded positions (a decoding cache's length, max new tokens)

This package never imports torch, torch_ref or parity: a TPU user needs no PyTorch.
"""

from flaxformer_mini.lazy_exports import lazy_exports

# Names are imported on first use (lazy_exports.py): `flaxformer-mini --help` and an
# option's error answer without importing JAX and Flax (seconds), while `from flaxformer_mini
# import Transformer` works as usual.
_EXPORTS = {
    "MASK_FILL_VALUE": "flaxformer_mini.model.attention",
    "MultiHeadAttention": "flaxformer_mini.model.attention",
    "MultiHeadSelfAttention": "flaxformer_mini.model.attention",
    "PerHeadSelfAttention": "flaxformer_mini.model.attention",
    "SelfAttention": "flaxformer_mini.model.attention",
    "scaled_dot_product_attention": "flaxformer_mini.model.attention",
    "set_attention_impl": "flaxformer_mini.model.attention",
    "PRESETS": "flaxformer_mini.model.config",
    "ModelConfig": "flaxformer_mini.model.config",
    "get_preset": "flaxformer_mini.model.config",
    "DecoderBlock": "flaxformer_mini.model.layers",
    "FeedForward": "flaxformer_mini.model.layers",
    "LearnedPositionalEncoding": "flaxformer_mini.model.layers",
    "TransformerBlock": "flaxformer_mini.model.layers",
    "Decoder": "flaxformer_mini.model.transformer",
    "Encoder": "flaxformer_mini.model.transformer",
    "Transformer": "flaxformer_mini.model.transformer",
    "LAYER_NORM_EPS": "flaxformer_mini.model.primitives",
    "check_tokens": "flaxformer_mini.model.token_checks",
    "checked": "flaxformer_mini.model.token_checks",
    "traced_checks": "flaxformer_mini.model.token_checks",
}

__version__ = "0.1.0"

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
