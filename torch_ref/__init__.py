"""The PyTorch reference: the seed tutorials' modules, faithful, with their slips fixed.

Class names, constructor arguments, call signatures and ``state_dict()`` keys are the
seeds' own, so a state dict saved from the seeds' classes loads here with ``strict=True``.
One name differs: seed 003's ``SelfAttention`` is ``PerHeadSelfAttention`` here, since seed
001 has a ``SelfAttention`` too (the keys are seed 003's).
Every place where this code departs from the seed text is marked ``# Seed slip N:`` with
the number of the slip in docs/design.md ("The seeds' slips").

This package never imports JAX or Flax: a PyTorch user needs neither.
"""

from torch_ref.attention import (
    MASK_FILL_VALUE,
    MultiHeadAttention,
    MultiHeadSelfAttention,
    PerHeadSelfAttention,
    SelfAttention,
    scaled_dot_product_attention,
)
from torch_ref.layers import FeedForward, LearnedPositionalEncoding, TransformerBlock, DecoderBlock
from torch_ref.model import Decoder, Encoder, Transformer, check_tokens
from torch_ref.decoding import greedy_decode
from torch_ref.cached_decoding import CachedDecoder, beam_search, greedy_decode_cached
from torch_ref.training import make_optimizer, token_cross_entropy, train_step

__all__ = [
    "MASK_FILL_VALUE",
    "SelfAttention",
    "TransformerBlock",
    "Encoder",
    "DecoderBlock",
    "Decoder",
    "Transformer",
    "scaled_dot_product_attention",
    "MultiHeadAttention",
    "PerHeadSelfAttention",
    "LearnedPositionalEncoding",
    "MultiHeadSelfAttention",
    "FeedForward",
    "check_tokens",
    "greedy_decode",
    "CachedDecoder",
    "greedy_decode_cached",
    "beam_search",
    "make_optimizer",
    "token_cross_entropy",
    "train_step",
]
