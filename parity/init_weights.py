"""The weights a new run starts from: what ``flaxformer-mini train --init-from FILE`` reads.

``flaxformer_mini.runs.init_from`` finds this module through the packaging entry point
``flaxformer_mini.weight_readers`` (pyproject.toml), so the Flax package never imports parity
(docs/design.md's import rule). It provides ``read_params(path, config, preset)`` and
``params_into_model(params, model)``, which any reader in that group must, and
``recorded_tokenizers(path)``, which a reader may.

FILE is one of
- a torch state dict of ``torch_ref.Transformer`` (the seed's keys): ``.safetensors``, read
  with safetensors' numpy API (no torch needed), or ``.pt``/``.pth``/``.bin``, read with
  ``torch.load(weights_only=True)`` (needs torch);
- Flax parameters written by ``parity convert`` (``.safetensors`` with parity's metadata, or
  an orbax directory).

The run's model comes from its options and data as always; FILE must fit it exactly. The
conversion is parity's strict one (every key, every shape, floating-point values), into the
run's own layout (a ``--scan-layers`` run gets each side's layers stacked), so nothing here
knows a key. Only torch-free modules are imported at the top: a ``.safetensors`` file reads
where torch is not installed.
"""

import dataclasses
import importlib.util
import os
from pathlib import Path

import numpy as np

from flaxformer_mini.runs.init_from import OPTION, InitFromError
from flaxformer_mini.runs.config import RunConfig
from flaxformer_mini.runs.directory import run_holding
from parity import engine, flax_io
from parity.file_kinds import read_recorded_config
from parity.tied import own_ties

_SHOWN = 4  # offending keys named in one error line; the rest are counted


def read_params(path, config: RunConfig, preset=None):
    """({Flax path: numpy array} in the run's own layout, [notes]) from ``path``, for the model
    of ``config``; InitFromError naming every offending key with both shapes, and the options
    that set the model's sizes, when the file does not fit. Nothing is written."""
    if os.path.isfile(os.path.join(path, "config.json")):
        raise InitFromError(f"{OPTION} {path}: is a flaxformer-mini run directory, not a weights file: train with "
                            f"--out {path} to continue that run, or export its weights for a new run with "
                            f"`parity convert {path} model.safetensors` and give {OPTION} model.safetensors")
    holder = run_holding(path)
    if holder is not None:  # a step's orbax directory holds the whole training state, not parity's layout
        raise InitFromError(f"{OPTION} {path}: is part of the flaxformer-mini run {holder}, not a weights file: "
                            f"export its newest weights for a new run with `parity convert {holder} model.safetensors` "
                            f"and give {OPTION} model.safetensors")
    try:
        kind = flax_io.checkpoint_kind(path)
    except ValueError as e:  # parity's CheckpointError: no such file, unknown suffix, unreadable header
        raise InitFromError(f"{OPTION} {_first_line(e)}") from None
    notes = []
    # (the settings the file's metadata records, the names it marks assumed): a torch file's
    # read here, before the try, whose ValueError handler would re-word this module's own errors.
    recorded = (None, ()) if kind == "flax" else _recorded_torch_config(path)
    try:
        if kind == "flax":
            params, file_config, assumed = flax_io.read_flax_params(path)
            recorded = (dataclasses.asdict(file_config), assumed)
            sizes = _sizes_of_config(file_config)
            # Strict against the run's model (unscanned) with the file's own ties, naming Flax
            # paths; then torch keys, a tie's copies included, for the run's ties to check below.
            arrays = flax_io.torch_arrays_from_flax_params(params, _with_ties(config.model, file_config))
        else:
            arrays = _read_torch_file(path)
            sizes = _sizes_of_torch(arrays)
            if sizes and recorded[0] and "heads" not in recorded[1]:
                sizes["heads"] = recorded[0].get("heads")  # the misfit message can then name them
        # The run's layout: its dtype and its stacked or per-layer blocks (abstract: no arrays).
        model = config.abstract_model()
        plan, tie, untied = engine.plan(model), own_ties(model), {}
        if tie is not None:  # --tie-embeddings: each copy the file holds must be its table, bit for bit
            arrays, untied = tie.forward(arrays)
        arrays = engine.check_torch(plan, arrays, "the run's model", invalid=untied)
    except engine.ConversionError as e:
        raise InitFromError(_does_not_fit(path, e, config, preset, sizes)) from None
    except ValueError as e:  # CheckpointError: a truncated or foreign file
        raise InitFromError(f"{OPTION} {_first_line(e)}") from None
    # Outside the try: its own InitFromError is a ValueError too.
    notes += _recorded_config_notes(path, config, recorded)
    bad = [key for key, a in arrays.items() if not np.isfinite(np.asarray(a, np.float32)).all()]
    if bad:
        raise InitFromError(f"{OPTION} {path}: weights hold NaN or Inf: {_listed(map(repr, bad))}; "
                            f"training from them would stop at the first step")
    # A text run's token ids: flaxformer_mini's Run.start warns where they may not be the file's
    # (tokenizers trained on --data rather than taken with --tokenizer-from).
    return engine.to_flax(plan, arrays), notes


def recorded_tokenizers(path):
    """{file name: sha256} of the tokenizers ``path`` records it was trained with (``parity
    convert`` of a text run writes them into the file's metadata, and every later conversion
    carries them on), or None."""
    try:
        return flax_io.recorded_tokenizers(path)
    except ValueError as e:  # CheckpointError: unusable metadata
        raise InitFromError(f"{OPTION} {_first_line(e)}") from None


def params_into_model(params, model):
    """``params`` (``read_params``) into ``model``'s parameters, in place: strict again, cast to
    the run's parameter dtype."""
    flax_io.params_into_model(params, model)


def _read_torch_file(path):
    """{torch key: numpy array} of a torch state dict file."""
    if Path(path).suffix.lower() == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise InitFromError(f"{OPTION} {path}: reading .safetensors needs the safetensors package "
                                f"(pip install safetensors; no torch needed)") from None
        try:
            return load_file(path)
        except Exception as e:  # noqa: BLE001 - safetensors raises several types for a bad file
            if not _has_torch():
                raise InitFromError(f"{OPTION} {path}: not a readable .safetensors file for numpy (truncated, "
                                    f"corrupt, or a dtype numpy lacks, such as bfloat16): {e}") from None
            # torch's reader takes what numpy's cannot (bfloat16), and names a bad file itself.
    elif not _has_torch():
        raise InitFromError(f"{OPTION} {path}: a torch pickle ({Path(path).suffix}) needs PyTorch to read, and torch "
                            f"is not installed here. Install it (README, Install), or save the state dict as "
                            f".safetensors where torch is (safetensors.torch.save_file(model.state_dict(), "
                            f"'model.safetensors')), which reads without torch")
    # Imported here, not above: they import torch, which a .safetensors file does not need.
    from parity.checkpoint_io import load_state_dict
    from parity.convert import tensor_to_numpy

    return {key: tensor_to_numpy(value) for key, value in load_state_dict(path).items()}


def _has_torch():
    """Whether torch can be imported, without importing it (several seconds)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken install, or an import hook refusing it
        return False


def _sizes_of_torch(arrays):
    """The model sizes a torch state dict's shapes show (heads they cannot), or None."""
    def shape(key):
        return tuple(np.shape(arrays[key])) if key in arrays else None

    src, tgt, pos = (shape("encoder.embedding_layer.weight"), shape("decoder.embedding_layer.weight"),
                     shape("encoder.positional_encoding.weight"))
    if not (src and tgt and pos and len(src) == len(tgt) == len(pos) == 2):
        return None
    ffn = shape("encoder.transformer_layers.0.fc.0.weight")
    return dict(embed=src[1], layers=engine.layer_depths(arrays).get("encoder.transformer_layers"),
                ffn=ffn[0] if ffn else None, max_len=pos[0], vocabs=(src[0], tgt[0]), heads=None)


def _with_ties(model_config, file_config):
    """The run's ``model_config`` with the ties of the file's model (``file_config``), where it
    can take them: the file's parameters then convert to every torch key its model has, and the
    run's own ties decide what fits (a tied file into an untied run: its tables start equal)."""
    try:
        return model_config.replace(tie_embeddings=file_config.tie_embeddings)
    except ValueError:  # "all" with the run's two vocabulary sizes: the sizes' misfit is named instead
        return model_config


def _sizes_of_config(c):
    return dict(embed=c.embed_size, layers=c.num_layers, ffn=c.feed_forward_width, max_len=c.max_len,
                vocabs=(c.source_vocab_size, c.target_vocab_size), heads=c.heads)


def _recorded_torch_config(path):
    """What a torch ``.safetensors`` that ``parity convert`` wrote records in its metadata (docs/
    porting.md, section 9): (settings, assumed names), or (None, ()) for any other file."""
    try:
        return read_recorded_config(path)
    except ValueError as e:  # CheckpointError: metadata that is not what parity writes
        raise InitFromError(f"{OPTION} {_first_line(e)}") from None


def _recorded_config_notes(path, config, recorded):
    """The settings a file's metadata records (``recorded``: (settings, assumed names), either
    layout) against the run's. Heads recorded as the model's (not assumed) and not the run's
    are refused: the weights fit any count that divides the width, but only the model's own
    computes its outputs. An assumed count, or another padding id, is a note."""
    settings, assumed = recorded
    if not settings:
        return []
    m, notes = config.model, []
    heads = settings.get("heads")
    if heads is not None and heads != m.heads:
        if "heads" not in assumed:
            raise InitFromError(f"{OPTION} {path}: its metadata records a model of {heads} heads, and this run's has "
                                f"{m.heads} (--heads, --preset): the weights fit both, but only {heads} computes the "
                                f"model's outputs. Train with --heads {heads}")
        notes.append(f"note: {OPTION} {path}: its metadata marks {heads} heads as assumed by parity convert (not "
                     f"known); this run uses {m.heads}: give --heads the number the model was trained with")
    tie = settings.get("tie_embeddings")
    if tie != m.tie_embeddings:  # the weights fitted (a refused tie is an error before this)
        rank = {None: 0, "decoder": 1, "all": 2}  # each tie holds the one before it
        fewer = rank.get(tie, 0) > rank[m.tie_embeddings]
        notes.append(f"note: {OPTION} {path}: its model's tie_embeddings is {tie!r}, this run's {m.tie_embeddings!r} "
                     f"(--tie-embeddings): " + ("the tables its model tied start equal here and train apart" if fewer
                                                else "its tables were equal bit for bit, so they load as one"))
    pad = settings.get("src_pad_idx")
    if pad is not None and pad != m.src_pad_idx:
        notes.append(f"note: {OPTION} {path}: its model masked source id {pad} as padding; "
                     f"flaxformer-mini's padding id is {m.src_pad_idx}")
    return notes


def _first_line(error, limit=300):
    """An error's first line, cut to ``limit`` characters (orbax's carry several kB of spec)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _listed(items):
    items = list(items)
    shown = ", ".join(items[:_SHOWN])
    return shown + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def _does_not_fit(path, error, config: RunConfig, preset, sizes):
    """One line: the offending keys (both shapes), the run's sizes and the options that set
    them, and what the file's own shapes would need."""
    problems = [f"{key!r} is {got} in the file, {want} in the run's model"
                for key, (got, want) in error.mismatched.items()]
    problems += [f"{key!r} is missing from the file" for key in error.missing]
    problems += [f"{key!r} in the file has no place in the run's model" for key in error.unexpected]
    problems += [f"{key!r}: {why}" for key, why in error.invalid.items()]
    m, data = config.model, config.data
    if sizes and sizes["layers"] and sizes["layers"] != m.num_layers:  # said once, not as every key of a layer
        problems.insert(0, f"{sizes['layers']} + {sizes['layers']} layers in the file, {m.num_layers} + "
                           f"{m.num_layers} in the run's model")
    if data.kind == "synthetic":
        vocab = f"--vocab-size {data.vocab_size}"
    elif data.tokenizer_from:
        vocab = (f"the tokenizers of --tokenizer-from {data.tokenizer_from} ({m.source_vocab_size} source, "
                 f"{m.target_vocab_size} target tokens)")
    else:
        vocab = (f"the vocabularies built from --data ({m.source_vocab_size} source, {m.target_vocab_size} target "
                 f"tokens; --tokenizer {data.tokenizer}, --vocab-size, --shared-vocab)")
    tied = f", embeddings tied ({m.tie_embeddings!r})" if m.tie_embeddings else ""
    line = (f"{OPTION} {path} does not fit the run's model: {_listed(problems)}. The run's model: width "
            f"{m.embed_size}, {m.heads} heads, {m.num_layers} + {m.num_layers} layers, feed-forward "
            f"{m.feed_forward_width}, max_len {m.max_len}, vocabularies {m.source_vocab_size}/{m.target_vocab_size}"
            f"{tied}, set by --preset{f' {preset}' if preset else ''}, --embed-size, --heads, --layers, --ffn-dim, "
            f"--max-len{', --tie-embeddings' if tied else ''} and {vocab}")
    if sizes:
        # --max-len is the model's max_len for text, one less (the EOS) for a synthetic task.
        max_len = sizes["max_len"] - 1 if data.kind == "synthetic" else sizes["max_len"]
        wanted = (f"--embed-size {sizes['embed']}" + (f" --layers {sizes['layers']}" if sizes["layers"] else "")
                  + (f" --ffn-dim {sizes['ffn']}" if sizes["ffn"] else "")
                  + (f" --heads {sizes['heads']}" if sizes["heads"] else "") + f" --max-len {max_len}")
        src, tgt = sizes["vocabs"]
        if data.kind == "synthetic":
            wanted += f" --vocab-size {src}" if src == tgt else f" (vocabularies {src}/{tgt}: a task has one)"
            vocab_remark = ""
        elif not data.tokenizer_from:
            vocab_remark = (f" with vocabularies of {src} source and {tgt} target tokens; a torch model's vocabulary "
                            f"is its own, and this run's are built from --data, so they must number the same tokens "
                            f"to share the weights (--tokenizer-from RUN takes a text run's)")
        elif (src, tgt) != (m.source_vocab_size, m.target_vocab_size):
            vocab_remark = (f" with vocabularies of {src} source and {tgt} target tokens, so the --tokenizer-from "
                            f"run's are not the ones these weights were trained with")
        else:  # the vocabularies fit: the other sizes are the misfit
            vocab_remark = ""
        line += f". The file's weights are for {wanted}" + vocab_remark
        if not sizes["heads"]:
            line += " (heads: the weights do not say)"
    return line + ". Nothing was written."
