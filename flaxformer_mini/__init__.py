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

This package never imports torch, torch_ref or parity: a TPU user needs no PyTorch.
"""

from flaxformer_mini.attention import (
    MASK_FILL_VALUE,
    MultiHeadAttention,
    MultiHeadSelfAttention,
    PerHeadSelfAttention,
    SelfAttention,
    scaled_dot_product_attention,
    set_attention_impl,
)
from flaxformer_mini.config import PRESETS, ModelConfig, get_preset
from flaxformer_mini.layers import DecoderBlock, FeedForward, LearnedPositionalEncoding, TransformerBlock
from flaxformer_mini.model import Decoder, Encoder, Transformer
from flaxformer_mini.primitives import LAYER_NORM_EPS
from flaxformer_mini.validation import check_tokens, checked, traced_checks

__version__ = "0.1.0"

__all__ = [
    "MASK_FILL_VALUE",
    "LAYER_NORM_EPS",
    "SelfAttention",
    "TransformerBlock",
    "Encoder",
    "DecoderBlock",
    "Decoder",
    "Transformer",
    "scaled_dot_product_attention",
    "set_attention_impl",
    "MultiHeadAttention",
    "PerHeadSelfAttention",
    "LearnedPositionalEncoding",
    "MultiHeadSelfAttention",
    "FeedForward",
    "ModelConfig",
    "PRESETS",
    "get_preset",
    "check_tokens",
    "checked",
    "traced_checks",
]
