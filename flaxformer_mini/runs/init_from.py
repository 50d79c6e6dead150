"""``flaxformer-mini train --init-from FILE``: a new run whose step 0 holds weights trained
elsewhere (fine-tuning), with a fresh optimizer.

FILE is one of
- a torch state dict of ``torch_ref.Transformer`` (the seed's keys): ``.safetensors``, read
  with safetensors' numpy API (no torch needed), or ``.pt``/``.pth``/``.bin``, read by
  ``parity`` with ``torch.load(weights_only=True)`` (needs torch);
- Flax parameters written by ``parity convert`` (``.safetensors`` with parity's metadata, or
  an orbax directory).

The run's model comes from its options and data as always; FILE must fit it exactly. Reading
and converting FILE is parity's work (``parity.init_weights``: its strict conversion, every
key and shape named), found here through the packaging entry point below, so that
``flaxformer_mini`` never imports parity (docs/design.md's import rule). This module keeps what
the run records of FILE (path and sha256) and the resume rules.
"""

import hashlib
import os
from importlib.metadata import entry_points
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_mini.runs.config import InitFrom, RunConfig, RunConfigError
from flaxformer_mini.runs.directory import data_file_sha256
from flaxformer_mini.train.state import fresh_streams, is_abstract

OPTION = "--init-from"
# The entry-point group of weight readers: a module with read_params(path, config, preset)
# and params_into_model(params, model). flaxformer-mini's own, parity's, is named "parity"
# (pyproject.toml, [project.entry-points."flaxformer_mini.weight_readers"]).
READERS = "flaxformer_mini.weight_readers"


class InitFromError(RunConfigError):
    """An --init-from file that cannot start the run (unreadable, or not fitting its model)."""


def record(path) -> InitFrom:
    """What config.json records of ``path``: its absolute path and sha256 (a directory's:
    ``digest``). An error naming the option when nothing is there."""
    absolute = os.path.abspath(path)
    if not os.path.exists(absolute):
        raise InitFromError(f"{OPTION} {path}: no such file")
    return InitFrom(path=absolute, sha256=digest(absolute))


def for_resume(recorded: InitFrom | None, path, echo) -> InitFrom:
    """What a resumed run's ``--init-from path`` stands for, against what the run recorded: the
    run's parameters are in its checkpoints, so the file is only checked where it is. Missing:
    the record (a note says so). At the recorded path: its contents now (a changed file is
    refused by the config check). Elsewhere with the recorded contents: moved, the record (a
    note). Elsewhere with other contents, or a run that started from a random init: what is
    there, which the config check then refuses by name."""
    absolute = os.path.abspath(path)
    if recorded is None or (not os.path.exists(absolute) and absolute != recorded.path):
        return record(path)  # no such file, or refused as a run from a random init
    if not os.path.exists(absolute):
        echo(f"note: {OPTION} {path} is gone; the run resumes from its checkpoints, which hold its parameters")
        return recorded
    now = InitFrom(path=absolute, sha256=digest(absolute))
    if absolute != recorded.path and now.sha256 == recorded.sha256:
        echo(f"note: {OPTION} {path} holds what the run started from (recorded at {recorded.path})")
        return recorded
    return now


def digest(path):
    """sha256 of a file, or of an orbax directory: of each file's relative path and sha256,
    in sorted order (a file added, removed, renamed or changed changes it). Each file is read
    once per process (``data_file_sha256``'s cache): a start digests it for the options check
    and again for the record."""
    if not os.path.isdir(path):
        return data_file_sha256(path)
    h = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(f"{file.relative_to(path).as_posix()}\0{data_file_sha256(file)}\n".encode())
    return h.hexdigest()


def read_params(path, config: RunConfig, preset=None):
    """({Flax path: numpy array} in the run's own layout, [notes]) from ``path``, for the model
    of ``config``, by the installed weight reader; InitFromError naming every offending key with
    both shapes, and the options that set the model's sizes, when the file does not fit.
    Nothing is written."""
    return weight_reader().read_params(path, config, preset)


def recorded_tokenizers(path):
    """{file name: sha256} of the tokenizer files the weights in ``path`` were trained with, as
    the file records them (``parity convert`` of a text run), or None where it does not say (or
    the installed reader cannot tell)."""
    reader = weight_reader()
    return reader.recorded_tokenizers(path) if callable(getattr(reader, "recorded_tokenizers", None)) else None


def check_tokenizers(path, recorded, ours, tokenizer_from, train_path, echo):
    """A text run's tokenizers (``ours``, {file name: sha256} as the run saves them) against
    those the weights record (``recorded``, or None): another run's given with --tokenizer-from
    is an InitFromError; tokenizers trained on --data get a warning unless they are the ones
    recorded (the same corpus and settings train the same bpe, char and word files)."""
    if recorded is not None and recorded == ours:
        return
    if recorded is not None and tokenizer_from is not None:
        raise InitFromError(
            f"{OPTION} {path}: its weights were trained with other tokenizers than those of --tokenizer-from "
            f"{tokenizer_from} (the file records {_digests(recorded)}; that run's are {_digests(ours)}): give "
            f"--tokenizer-from the run these weights were exported from. Nothing was written.")
    if recorded is not None:
        echo(f"warning: {OPTION} {path} records the tokenizers its weights were trained with ({_digests(recorded)}), "
             f"and this run's, trained on {train_path}, are others: each embedding row now stands for another "
             f"token; --tokenizer-from RUN takes the tokenizers of the run the weights were exported from")
    elif tokenizer_from is None:
        echo(f"warning: this run's tokenizers are trained on {train_path}: unless they number tokens as the "
             f"vocabulary the {OPTION} weights were trained with did, each embedding row now stands for another "
             f"token; --tokenizer-from RUN takes a text run's tokenizers")


def _digests(checksums):
    return ", ".join(f"{name} {digest[:12]}..." for name, digest in sorted(checksums.items()))


def load_into_state(state, params):
    """``state`` (a fresh TrainState, or its shapes: ``Trainer.state_template()``) at step 0
    with ``params`` (``read_params``) as its parameters, a fresh optimizer state for them, and
    dropout streams (``state.fresh_streams``: made where ``state`` has shapes for them)."""
    model = state.model(train=True)
    reader = weight_reader()
    reader.params_into_model(params, model)
    new = nnx.state(model, nnx.Param)
    left = [path for path, v in nnx.to_flat_state(new) if is_abstract(v.get_value())]
    if left:  # a reader that skips parameters instead of refusing the file
        name = getattr(reader, "__name__", reader)
        raise InitFromError(f"{OPTION}: the weight reader {name} left {len(left)} parameter(s) without values, "
                            f"e.g. {'/'.join(map(str, left[0]))}")
    return state.replace(step=jnp.zeros((), jnp.int32), params=new, opt_state=state.tx.init(new),
                         other=fresh_streams(state.other, state.config.seed),
                         ema=None if state.ema is None else jax.tree.map(jnp.copy, new))  # --ema starts at them


def weight_reader():
    """The installed weight reader, parity's (named "parity" in the group; another is used only
    where parity's is not installed), or an InitFromError saying how to install one."""
    found = entry_points(group=READERS)
    if not found:
        raise InitFromError(
            f"{OPTION} needs a weight reader, and none is installed: flaxformer-mini's parity package provides "
            f"one, registered (entry point group {READERS!r}) when flaxformer-mini is installed with pip: run "
            f"`pip install -e .` in a checkout (again, if it was installed before this entry point existed); a "
            f"checkout on PYTHONPATH alone registers none")
    entry = found["parity"] if "parity" in found.names else next(iter(found))
    try:
        reader = entry.load()
    except Exception as e:  # noqa: BLE001 - any failure to import it: name the entry point, not a traceback
        raise InitFromError(f"{OPTION}: the weight reader {entry.name} = {entry.value} cannot be loaded: "
                            f"{type(e).__name__}: {e}") from None
    missing = [name for name in ("read_params", "params_into_model") if not callable(getattr(reader, name, None))]
    if missing:
        raise InitFromError(f"{OPTION}: the weight reader {entry.name} = {entry.value} lacks {' and '.join(missing)}")
    return reader
