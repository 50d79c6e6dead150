"""Flax parameter files: what ``parity convert`` writes from a torch checkpoint, and reads back.

Two formats, both holding the Flax twin's parameters under their Flax paths, in Flax layout
(a Linear's ``kernel`` is (in, out), the transpose of torch's ``weight``), with the model's
``ModelConfig`` beside them (the weights alone do not say how many heads there are):

- ``.safetensors``: keys ``'encoder/transformer_layers/0/attention/W_q/kernel'``; metadata
  ``{'format': FLAX_FORMAT, 'model_config': '{"src_pad_idx": 0, ...}'}``, and
  ``'assumed_config': '["dropout", ...]'`` naming the fields that were assumed, not known
  (``parity.file_kinds``). Readable with ``safetensors.numpy`` alone: no torch needed on the
  JAX side.
- an orbax directory (a path without a suffix, or ending in ``/``): item ``params``, the
  parameters as a nested dict (``{'encoder': {'transformer_layers': {'0': ...}}}``), and item
  ``config``, JSON ``{"format": FLAX_FORMAT, "model_config": {...}}`` (and ``"assumed_config":
  [...]`` when any field was assumed).

Arrays move between layouts by ``parity.engine`` (the plan of ``parity.RULES``) as numpy
arrays, never through JAX, so every dtype survives bit for bit (JAX would narrow float64
without x64). Reading and writing files is kept apart from conversion, and needs no torch:
``state_dict_from_flax_params`` returns numpy arrays; ``parity.convert`` makes them tensors.
safetensors (in the optional ``[torch]`` extra) and orbax (TensorStore with it, a few tenths
of a second) are imported inside the functions that read or write their format: an orbax
directory reads where safetensors is not installed, and a ``.safetensors`` file without
loading orbax.
"""

import json
import logging
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import flaxformer_mini
from flaxformer_mini import files
from flaxformer_mini.model.config import ModelConfig
from parity import engine, output
from parity.engine import ConversionError  # noqa: F401 - raised by the functions below
from parity.file_kinds import (  # noqa: F401 - FLAX_FORMAT and CONFIG_METADATA_KEY are public names here too
    ASSUMED_METADATA_KEY, CONFIG_METADATA_KEY, FLAX_FORMAT, SAFETENSORS_SUFFIX, TOKENIZERS_METADATA_KEY, TORCH_SUFFIXES,
    CheckpointError, as_model_config, assumed_from_json, config_metadata, read_recorded_tokenizers, readable_file,
    safetensors_header, tokenizers_from_json)
from parity.tied import own_ties

_FLAX_SEP, _TORCH_SEP = "/", "."


# ----------------------------------------------------------------------------- which file is it


def is_orbax_path(path):
    """An orbax directory: an existing directory, or a path ending in '/' or without a suffix."""
    text = os.fspath(path)
    return os.path.isdir(text) or text.endswith(("/", os.sep)) or Path(text).suffix == ""


def checkpoint_kind(path):
    """'flax' or 'torch' for an existing checkpoint ``path``; CheckpointError if it is neither."""
    path = Path(path)
    if is_orbax_path(path):
        if path.exists() and not path.is_dir():  # a file without a suffix
            raise CheckpointError(f"{path}: a file of unknown type; expected {', '.join((SAFETENSORS_SUFFIX, *TORCH_SUFFIXES))}"
                                  f" or a directory (a training run, or Flax parameters written by `parity convert`)")
        if not path.is_dir():  # most often a mistyped run directory
            raise CheckpointError(f"{path}: no such file or directory")
        return "flax"
    readable_file(path)
    suffix = path.suffix.lower()
    if suffix in TORCH_SUFFIXES:
        return "torch"
    if suffix != SAFETENSORS_SUFFIX:
        raise CheckpointError(f"{path}: unknown checkpoint type {suffix!r}; expected "
                              f"{', '.join((SAFETENSORS_SUFFIX, *TORCH_SUFFIXES))} or an orbax directory")
    metadata, keys = safetensors_header(path)
    if metadata.get("format") == FLAX_FORMAT:
        return "flax"
    if keys and all(_FLAX_SEP in k and _TORCH_SEP not in k for k in keys):
        return "flax"  # Flax paths without our metadata: reading it will say what is missing
    return "torch"


# ----------------------------------------------------------------------------- layouts


def abstract_model(config: ModelConfig):
    """The Flax twin of ``config`` with shapes but no arrays (``Transformer.abstract``): enough
    for the conversion plan, and free whatever the model's size."""
    return flaxformer_mini.Transformer.abstract(config)


def flax_params_from_state_dict(state_dict, config: ModelConfig, read=np.asarray):
    """{Flax path: numpy array in Flax layout} from a torch state dict of the model ``config``.

    Strict, as ``torch_to_flax``: a missing, unexpected or misshapen key raises ConversionError
    naming every one, and so does a tied copy (``config.tie_embeddings``) that is not its table
    bit for bit. Dtypes are kept as they are in ``state_dict``. ``read``: value -> numpy
    (``parity.convert.tensor_to_numpy`` for torch tensors, bfloat16 included).
    """
    model = abstract_model(config)
    the_plan, tie, untied = engine.plan(model), own_ties(model), {}
    if tie is not None:
        state_dict, untied = tie.forward(state_dict, read=read)
    arrays = engine.check_torch(the_plan, state_dict, "Transformer", read=read, invalid=untied)
    return engine.to_flax(the_plan, arrays)


def torch_arrays_from_flax_params(params, config: ModelConfig):
    """{torch key: numpy array in torch layout} of Flax parameters {Flax path: array}, strictly;
    a tied model's (``config.tie_embeddings``) with each tied key, as its torch twin lists it."""
    model = abstract_model(config)
    the_plan, tie = engine.plan(model), own_ties(model)
    _check_flax_params(params, the_plan, f"the Transformer of {_describe(config)}")
    arrays = engine.to_torch(the_plan, params)
    return arrays if tie is None else tie.backward(arrays)


def _check_flax_params(params, the_plan, what):
    engine.check_flax(the_plan, params, what)


def _describe(config):
    return ", ".join(f"{k}={v}" for k, v in config.to_dict().items())


# ----------------------------------------------------------------------------- files


def save_flax_params(params, config: ModelConfig, path, *, overwrite=False, assumed=(), tokenizers=None,
                     replace_file=True):
    """Write {Flax path: array} and ``config`` as ``.safetensors`` or an orbax directory, all at
    once or not at all (``parity.output``). ``overwrite``: replace an existing orbax directory
    written by ``parity convert`` (a file is always replaced, atomically). ``assumed``: names
    of ``config``'s fields that are a guess (the seed's defaults), recorded as such.
    ``tokenizers``: {file name: sha256} of the text run the weights come from, carried on.
    ``replace_file=False``: a .safetensors file is never replaced, even one created while this
    wrote."""
    config = as_model_config(config)
    params = {k: np.asarray(v, order="C") for k, v in params.items()}  # 0-d stays 0-d
    if is_orbax_path(path):
        return _save_orbax(params, config, Path(path), overwrite, assumed, tokenizers)
    path = Path(path)
    if path.suffix.lower() != SAFETENSORS_SUFFIX:
        raise CheckpointError(f"{path}: Flax parameters are written as {SAFETENSORS_SUFFIX} or an orbax directory "
                              f"(a path without a suffix, or ending in '/'), not {path.suffix!r}")
    from safetensors.numpy import save

    metadata = config_metadata(FLAX_FORMAT, config, assumed, tokenizers)
    files.write_atomic(path, save(params, metadata=metadata), replace=replace_file)
    return path


def recorded_tokenizers(path):
    """{file name: sha256} of the text run's tokenizers that weights written by ``parity
    convert`` record (``.safetensors`` of either layout, or an orbax directory), or None."""
    if not (is_orbax_path(path) and Path(path).is_dir()):
        return read_recorded_tokenizers(path)
    recorded = _orbax_record(Path(path)).get(TOKENIZERS_METADATA_KEY)
    return None if recorded is None else tokenizers_from_json(recorded, path)


def load_flax_params(path):
    """({Flax path: numpy array}, ModelConfig) from a file written by ``save_flax_params``."""
    params, config, _ = read_flax_params(path)
    return params, config


def read_flax_params(path):
    """({Flax path: numpy array}, ModelConfig, the names of its fields recorded as assumed)."""
    if is_orbax_path(path):
        return _load_orbax(Path(path))
    path = Path(path)
    if checkpoint_kind(path) != "flax":
        raise CheckpointError(f"{path}: holds a torch state dict (torch keys), not Flax parameters")
    from safetensors.numpy import load_file

    metadata, _ = safetensors_header(path)
    config = _config_from_json(metadata.get(CONFIG_METADATA_KEY), path)
    assumed = assumed_from_json(metadata.get(ASSUMED_METADATA_KEY, "[]"), path)
    try:
        params = load_file(path)
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for a bad file
        raise CheckpointError(f"{path}: not a readable .safetensors file (truncated or corrupt?): {e}") from None
    return params, config, assumed


def _config_from_json(data, path):
    if data is None:
        raise CheckpointError(f"{path}: no {CONFIG_METADATA_KEY!r} in its metadata; it was not written by "
                              f"`parity convert`, and the weights alone do not say the number of heads")
    try:
        return ModelConfig(**(json.loads(data) if isinstance(data, str) else data))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: unusable {CONFIG_METADATA_KEY!r} in its metadata: {e}") from None


def _orbax():
    import orbax.checkpoint as ocp

    # orbax logs every save and restore at INFO through absl.
    logging.getLogger("absl").setLevel(logging.WARNING)
    return ocp


def _nest(flat):
    tree = {}
    for path, value in flat.items():
        *parents, leaf = path.split(_FLAX_SEP)
        node = tree
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return tree


def _flatten(tree, prefix=""):
    for name, value in tree.items():
        path = f"{prefix}{_FLAX_SEP}{name}" if prefix else str(name)
        if isinstance(value, dict):
            yield from _flatten(value, path)
        else:
            yield path, np.asarray(value)


def _save_orbax(params, config, path, overwrite=False, assumed=(), tokenizers=None):
    ocp = _orbax()
    meta = {"format": FLAX_FORMAT, CONFIG_METADATA_KEY: config.to_dict()}
    if assumed:
        meta[ASSUMED_METADATA_KEY] = sorted(assumed)
    if tokenizers:
        meta[TOKENIZERS_METADATA_KEY] = dict(sorted(tokenizers.items()))

    def write(directory):
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
            checkpointer.save(directory, ocp.args.Composite(params=ocp.args.StandardSave(_nest(params)),
                                                            config=ocp.args.JsonSave(meta)))

    # orbax renames its own temporary directory when complete, but into `path`'s place only if
    # nothing is there; parity.output stages it beside `path` so --force can replace one.
    try:
        return output.write_directory_atomic(path, write, overwrite=overwrite)
    except output.OutputExistsError as e:
        raise CheckpointError(str(e)) from None


def _restore(path, **items):
    """orbax's restore of ``items`` from the directory ``path``, as flaxformer-mini reads its own
    checkpoints (``flaxformer_mini.train.checkpoint``): its loggers quiet during the read, and the
    closed-event-loop tracebacks of a failed read's abandoned threads silenced (the caller
    reports the failure in one line). The silencer goes in before the read, not after a
    failure: TensorStore's threads report while the error is still propagating."""
    from flaxformer_mini.train.checkpoint import quiet_orbax_logs, silence_orbax_aftermath  # late: it imports JAX and orbax

    ocp = _orbax()
    silence_orbax_aftermath()
    with quiet_orbax_logs(), ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        return checkpointer.restore(path.absolute(), ocp.args.Composite(**items))


def _failure(error):
    """``error``'s type and first line, at most 300 characters: TensorStore's messages embed a
    spec of several kB."""
    from flaxformer_mini.train.checkpoint import error_summary  # late: it imports JAX and orbax

    return f"{type(error).__name__}: {error_summary(error)}"


def _orbax_record(path):
    """The 'config' item (a dict of FLAX_FORMAT) of an orbax directory ``save_flax_params`` wrote."""
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such directory")
    if not (path / "config").is_dir():  # orbax would say KeyError: 'Item "config" was not found'
        raise CheckpointError(f"{path}: neither a training run (it has no config.json) nor Flax parameters written "
                              f"by `parity convert` (it has no 'config' item)")
    ocp = _orbax()
    try:
        meta = _restore(path, config=ocp.args.JsonRestore())["config"]
    except Exception as e:  # noqa: BLE001 - orbax raises many types for a directory that is not its own
        raise CheckpointError(f"{path}: not an orbax directory of Flax parameters written by `parity convert`: "
                              f"{_failure(e)}") from None
    if not isinstance(meta, dict) or meta.get("format") != FLAX_FORMAT:
        raise CheckpointError(f"{path}: its 'config' item is not a {FLAX_FORMAT} record")
    return meta


def _load_orbax(path):
    ocp = _orbax()
    meta = _orbax_record(path)
    config = _config_from_json(meta.get(CONFIG_METADATA_KEY), path)
    assumed = assumed_from_json(meta.get(ASSUMED_METADATA_KEY, []), path)
    try:
        tree = _restore(path, params=ocp.args.StandardRestore())["params"]
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{path}: cannot read its 'params' item (truncated or corrupt?): {_failure(e)}") from None
    return dict(_flatten(tree)), config, assumed


def params_into_model(params, model):
    """Load {Flax path: array} into the Flax twin ``model``, in place, strictly: every
    parameter with its shape, or ConversionError naming each offender and nothing changed.
    Values are cast to the model's parameter dtype. Returns ``model``."""
    _check_flax_params(params, engine.plan(model), f"{type(model).__name__}")
    variables = engine.flax_variables(model)
    values = {path: jnp.array(params[path], dtype=var.get_value().dtype, copy=True) for path, var in variables.items()}
    for path, value in values.items():
        variables[path].set_value(value)
    return model
