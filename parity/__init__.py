"""parity: the bridge between ``torch_ref`` and ``flaxformer_mini``.

- ``torch_to_flax(state_dict, model)`` / ``flax_to_torch(model)``: strict weight conversion,
  driven by the declarative table ``RULES``; ``ConversionError`` names every bad key.
- ``load_state_dict`` / ``save_state_dict``: ``.safetensors`` and ``.pt`` (weights_only).
- ``compare_models``: both twins side by side, every intermediate, first divergence.
- ``infer_config``: a seed Transformer's ModelConfig from its state dict's shapes.
- ``check_twins`` / ``check_checkpoint``: what ``parity check`` runs, gradients included.
- ``save_flax_params`` / ``load_flax_params``: Flax parameter files (``parity convert``).

This is the only package that imports both torch and JAX.
"""

from parity.checkpoint_io import CheckpointError, load_state_dict, save_state_dict
from parity.check import check_checkpoint, check_twins
from parity.compare import Report, Row, compare_intermediates, compare_models, flax_intermediates, torch_intermediates
from parity.convert import (
    RULES,
    ConversionError,
    ParamLink,
    Rule,
    flax_to_torch,
    param_links,
    torch_key_shapes,
    torch_to_flax,
)
from parity.flax_io import (
    flax_params_from_state_dict,
    load_flax_params,
    params_into_model,
    save_flax_params,
    state_dict_from_flax_params,
)
from parity.gradients import gradient_rows
from parity.infer import infer_config
from parity.plot import plot_report
from parity.twins import as_inputs, parity_numerics, sample_batch, transformer_pair, twins_from_state_dict

__all__ = [
    "RULES",
    "Rule",
    "ConversionError",
    "CheckpointError",
    "torch_to_flax",
    "flax_to_torch",
    "torch_key_shapes",
    "ParamLink",
    "param_links",
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
    "twins_from_state_dict",
    "infer_config",
    "check_twins",
    "check_checkpoint",
    "gradient_rows",
    "plot_report",
    "flax_params_from_state_dict",
    "state_dict_from_flax_params",
    "save_flax_params",
    "load_flax_params",
    "params_into_model",
]
