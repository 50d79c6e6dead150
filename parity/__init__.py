"""parity: the bridge between ``torch_ref`` and ``flaxformer_mini``.

- ``torch_to_flax(state_dict, model)`` / ``flax_to_torch(model)``: strict weight conversion,
  driven by the declarative table ``RULES``; ``ConversionError`` names every bad key.
- ``load_state_dict`` / ``save_state_dict``: ``.safetensors`` and ``.pt`` (weights_only).
- ``compare_models``: both twins side by side, every intermediate, first divergence.
- ``compare(torch_model, flax_model, torch_inputs, flax_inputs, atol=, rename=)``: the same for
  any pair of models; ``compare_gradients`` for a loss the user gives on each side.
- ``register_rule`` / ``Rule`` / ``Rename``: teach the converter a layer type, or other names;
  ``register_stack``: a layer list that may be one stacked block (scanned layers);
  ``Tied`` (or ``tied={copy: source}``): weights torch ties and the Flax model holds once;
  ``model_ties``: the ties a model declares itself (a Transformer built with ``tie_embeddings``).
- ``infer_config``: a seed Transformer's ModelConfig from its state dict's shapes.
- ``check_twins`` / ``check_checkpoint``: what ``parity check`` runs, gradients included
  (``float64_reference=True``: each output also judged against the torch twin in float64);
  ``check_decoding``: its ``--decode``, greedy decoding with KV caches compared id for id.
- ``check_bfloat16`` / ``bfloat16_twin``: the Flax twin computing in bfloat16 against the torch
  twin in float32, each intermediate held to the bfloat16 policy by its depth
  (``python -m parity.bfloat16``).
- ``save_flax_params`` / ``load_flax_params``: Flax parameter files (``parity convert``).

This is the only package that imports both torch and JAX.
"""

from flaxformer_mini.lazy_exports import lazy_exports

# Names are imported on first use (flaxformer_mini/lazy_exports.py), so `parity --help` and `parity.cli` answer
# without loading torch and JAX (several seconds); `from parity import X` works as usual.
_EXPORTS = {
    "CheckpointError": "parity.checkpoint_io",
    "load_state_dict": "parity.checkpoint_io",
    "save_state_dict": "parity.checkpoint_io",
    "check_checkpoint": "parity.check",
    "check_twins": "parity.check",
    "check_decoding": "parity.decode_check",
    "check_bfloat16": "parity.bfloat16",
    "bfloat16_twin": "parity.bfloat16",
    "DecodeReport": "parity.decode_check",
    "Report": "parity.report",
    "Row": "parity.report",
    "compare": "parity.compare",
    "compare_gradients": "parity.gradients",
    "compare_intermediates": "parity.compare",
    "compare_models": "parity.compare",
    "flax_intermediates": "parity.compare",
    "torch_intermediates": "parity.compare",
    "RULES": "parity.rules",
    "register_rule": "parity.rules",
    "register_stack": "parity.rules",
    "Rename": "parity.rename",
    "Tied": "parity.tied",
    "model_ties": "parity.tied",
    "ConversionError": "parity.engine",
    "ParamLink": "parity.convert",
    "Rule": "parity.rules",
    "flax_to_torch": "parity.convert",
    "param_links": "parity.convert",
    "torch_key_shapes": "parity.convert",
    "torch_to_flax": "parity.convert",
    "flax_params_from_state_dict": "parity.convert",
    "load_flax_params": "parity.flax_io",
    "params_into_model": "parity.flax_io",
    "save_flax_params": "parity.flax_io",
    "state_dict_from_flax_params": "parity.convert",
    "gradient_rows": "parity.gradients",
    "infer_config": "parity.infer",
    "plot_report": "parity.plot",
    "as_inputs": "parity.twins",
    "parity_numerics": "parity.twins",
    "sample_batch": "parity.twins",
    "transformer_pair": "parity.twins",
    "twins_from_state_dict": "parity.twins",
}

__all__ = sorted(_EXPORTS)


# The modules docs/porting.md reaches by attribute (``parity.rules.TIES[MyHead] = ...``), imported
# on first use like the names above: docs/design.md lists them with the module paths kept stable.
_MODULES = ("checkpoint_io", "nn_transformer", "rules", "tied", "twins")

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), subpackages=_MODULES)
