"""parity: the bridge between ``torch_ref`` and ``flaxformer_mini``.

- ``torch_to_flax(state_dict, model)`` / ``flax_to_torch(model)``: strict weight conversion,
  driven by the declarative table ``RULES``; ``ConversionError`` names every bad key.
- ``load_state_dict`` / ``save_state_dict``: ``.safetensors`` and ``.pt`` (weights_only).
- ``compare_models``: both twins side by side, every intermediate, first divergence.

This is the only package that imports both torch and JAX.
"""

from parity.checkpoint_io import CheckpointError, load_state_dict, save_state_dict
from parity.compare import Report, Row, compare_intermediates, compare_models, flax_intermediates, torch_intermediates
from parity.convert import RULES, ConversionError, Rule, flax_to_torch, torch_key_shapes, torch_to_flax
from parity.twins import as_inputs, parity_numerics, sample_batch, transformer_pair

__all__ = [
    "RULES",
    "Rule",
    "ConversionError",
    "CheckpointError",
    "torch_to_flax",
    "flax_to_torch",
    "torch_key_shapes",
    "load_state_dict",
    "save_state_dict",
    "Report",
    "Row",
    "compare_models",
    "compare_intermediates",
    "torch_intermediates",
    "flax_intermediates",
    "parity_numerics",
    "transformer_pair",
    "sample_batch",
    "as_inputs",
]
