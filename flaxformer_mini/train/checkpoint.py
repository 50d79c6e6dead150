"""Rotating orbax checkpoints of the train state.

What is saved: the step, the parameters, the optimizer state and, with ``--ema``, the
parameters' moving average. The dropout RNG state is not: every step reseeds it from (seed,
step), so it carries no information.

orbax writes each checkpoint into a temporary directory and renames it when complete, so a
run killed mid-save (even with ``kill -9``) leaves the previous checkpoints intact and no
half-written one that a restore could pick up.
"""

import contextlib
import errno
import logging
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from flaxformer_mini.model import memory
from flaxformer_mini.model.paths import path_name
from flaxformer_mini.train.state import TrainState, check_state, default_device, fresh_streams, on_default_device

# orbax logs every save at INFO through absl; the progress bar already says what happens.
logging.getLogger("absl").setLevel(logging.WARNING)


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the model it is restored into (another size or structure)."""


class CheckpointError(ValueError):
    """No checkpoint of a run could be read (every one is damaged)."""


def _saved(state: TrainState):
    saved = {"step": state.step, "params": state.params, "opt_state": state.opt_state}
    if state.ema is not None:  # a run without --ema keeps the layout of checkpoints written before it
        saved["ema"] = state.ema
    return saved


def open_manager(directory, max_to_keep=3):
    """The rotating checkpoints in ``directory`` (made if absent), for ``save`` and ``restore``,
    the newest ``max_to_keep`` kept. A relative path is taken from the working directory: orbax
    refuses one at the first save."""
    directory = Path(directory).absolute()
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "a checkpoint directory must be a directory, not a file", str(directory))
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True)
    # One item, named by the handler up front: left to infer it, orbax takes it from the first
    # step it reads, and a step missing its "default" item turns the manager to several items,
    # after which no step reads ("Must provide `args` of type `Composite`").
    return ocp.CheckpointManager(directory, options=options, item_handlers=ocp.StandardCheckpointHandler())


def _check_manager(manager):
    """A checkpoint manager (what ``save``'s and ``restore``'s callers pass), or a TypeError
    naming what came instead: orbax's own errors name neither."""
    if not isinstance(manager, ocp.CheckpointManager):
        raise TypeError(f"expected a checkpoint manager (checkpoint.open_manager(directory)), got "
                        f"{type(manager).__name__} {manager!r}")


def save(manager, state: TrainState):
    """Save ``state`` as checkpoint ``state.step``, and return that step. A full disk raises ``OSError(ENOSPC)``
    after removing the half-written temporary directory (the earlier checkpoints are intact:
    orbax renames a checkpoint into place only once it is complete)."""
    _check_manager(manager)
    check_state(state, "checkpoint.save's state")
    step = int(jax.device_get(state.step))
    # Before the save, not after its failure: orbax's threads report a full disk while the
    # save is still failing, before the error reaches this function, and after it.
    silence_orbax_aftermath()
    try:
        with quiet_orbax_logs():
            manager.save(step, args=ocp.args.StandardSave(_saved(state)), force=True)
            manager.wait_until_finished()
    except Exception as e:
        if not _is_disk_full(e):
            raise
        _remove_partial(Path(manager.directory), step)
        raise OSError(errno.ENOSPC, f"No space left on device saving checkpoint {step}",
                      str(manager.directory)) from None
    return step


def _remove_partial(directory, step, settle_s=5.0):
    """Remove the half-written ``step.orbax-checkpoint-tmp*``. orbax's background writer may
    still create files in it for a moment after the failure surfaced (seen under load: the
    directory was back after one removal), so remove until it stays gone, for at most
    ``settle_s`` seconds: bounded, never a wait on orbax itself."""
    deadline = time.monotonic() + settle_s
    while True:
        partials = list(directory.glob(f"{step}.orbax-checkpoint-tmp*"))
        for partial in partials:
            shutil.rmtree(partial, ignore_errors=True)
        if time.monotonic() > deadline:
            return
        time.sleep(0.25)
        if not partials and not list(directory.glob(f"{step}.orbax-checkpoint-tmp*")):
            return


def _is_disk_full(error):
    """orbax reports a full disk as TensorStore's RESOURCE_EXHAUSTED ValueError (errno 28 in
    the text), or as an OSError, possibly wrapped: look through the chain."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(error) or "os_error_code='28'" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _shapes(tree):
    """{'encoder/embedding_layer/embedding': shape} for a params tree, whether it is an
    nnx.State or orbax's stored metadata (string keys, leaves under 'value')."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))
    return {
        path_name(path): tuple(leaf.shape)
        for path, leaf in flat
        if hasattr(leaf, "shape")
    }


def _read_stored_shapes(manager, step):
    """``_shapes`` of checkpoint ``step``'s stored parameters, or None where its metadata
    cannot be read (the restore's own error then says what is wrong). orbax's metadata read
    opens every stored array, as long as a small model's restore: ``_read`` says when."""
    try:
        meta = ocp.StandardCheckpointHandler().metadata(Path(manager.directory) / str(step) / "default")
    except Exception:  # noqa: BLE001 - no readable metadata: the restore's own error stands
        return None
    tree = getattr(meta, "tree", meta)
    try:
        return _shapes(tree["params"])
    except (KeyError, TypeError):
        return None


def _unindexed(path):
    # 'encoder/transformer_layers/0/norm1/scale' -> 'encoder/transformer_layers/norm1/scale':
    # a per-layer path as the stacked (scanned) model names the same parameter.
    return re.sub(r"/\d+/", "/", path, count=1)


def _layout_hint(have, want):
    """Where a checkpoint and a model differ only in their layer layout, say so first."""
    if {_unindexed(k) for k in want} == set(have) != set(want):
        return "it holds scanned (stacked) layers and the model one module per layer (scan_layers differs); "
    if {_unindexed(k) for k in have} == set(want) != set(have):
        return "it holds one module per layer and the model scanned (stacked) layers (scan_layers differs); "
    return ""


def _target(leaf):
    """What orbax restores ``leaf`` as: its shape, dtype and sharding. Shapes without one go
    to this process's default device: left to orbax, they would get the shardings recorded
    at the save, which name the saving run's devices (refused on any other mesh)."""
    target = ocp.utils.to_shape_dtype_struct(leaf)
    if getattr(target, "sharding", None) is None:
        target = jax.ShapeDtypeStruct(target.shape, target.dtype,
                                      sharding=jax.sharding.SingleDeviceSharding(default_device()))
    return target


def _unplaced(tree):
    """Whether ``tree`` is shapes without a sharding (``Trainer.state_template()``)."""
    return all(getattr(x, "sharding", None) is None for x in jax.tree.leaves(tree))


# A restore through host arrays holds a state's bytes on the host and on the devices at once, so
# its memory peak is higher than orbax placing each array (docs/benchmarks.md, "A checkpoint's
# restore"): host arrays only for a state at most this fraction of the memory free, so that the
# difference stays within a tenth of it.
HOST_READ_MAX_SHARE = 1 / 8


def _read(manager, step, target, wanted):
    """Checkpoint ``step`` read into ``target``'s shapes, dtypes and shardings, or a
    ``CheckpointMismatchError`` naming the parameters whose shapes differ from ``wanted``'s.

    Where this process holds every device of every sharding and the state is small beside the
    memory free (HOST_READ_MAX_SHARE), orbax reads host arrays and ``jax.device_put`` places
    them: faster than orbax placing each array itself (docs/benchmarks.md), and orbax's metadata
    (which opens every stored array) is read only when orbax refuses the tree. orbax returns a host
    array in its stored shape, not the target's: compared here with ``wanted``'s. Otherwise
    orbax places each array, each process its own shards, once the stored shapes are checked:
    refusing another shape itself, it leaves reads that report errors of their own as they are
    collected."""
    shardings = jax.tree.map(lambda t: t.sharding, target)
    state_bytes = sum(t.size * t.dtype.itemsize for t in jax.tree.leaves(target))
    available = memory.host_available()
    if (not all(s.is_fully_addressable for s in jax.tree.leaves(shardings)) or available is None
            or state_bytes > HOST_READ_MAX_SHARE * available):
        _refuse_another_model(manager, step, _read_stored_shapes(manager, step), wanted)
        try:
            return manager.restore(step, args=ocp.args.StandardRestore(target))
        except ValueError as e:
            _refuse_another_training_state(manager, step, e)
            raise
    try:
        on_host = manager.restore(step, args=ocp.args.StandardRestore(jax.tree.map(lambda t: np.empty(t.shape, t.dtype), target)))
    except Exception as e:
        # orbax refuses another tree (another depth, scanned layers) before reading an array.
        _refuse_another_model(manager, step, _read_stored_shapes(manager, step), wanted)
        _refuse_another_training_state(manager, step, e)
        raise
    _refuse_another_model(manager, step, _shapes(on_host["params"]), wanted)
    return jax.device_put(on_host, shardings)


# orbax's words for a restore target whose tree is not the stored one's; its report lists each
# differing path on a line of its own ("opt_state[1]:", "ema:").
_TREES_DIFFER = "tree structures do not match"


def _refuse_another_training_state(manager, step, error):
    """A ``CheckpointMismatchError`` when orbax refused ``error``'s restore for a tree other
    than the stored one's where the parameters agree: the optimizer state or the moving average
    differs, which the TrainConfig decides. Left to orbax, the message suggests an option
    ``restore`` does not take and prints the target's uninitialised arrays."""
    if _TREES_DIFFER not in str(error):
        return
    parts = sorted({m.group(1) for m in re.finditer(r"^(\w+)[\[:]", str(error), re.MULTILINE)} - {"params"})
    raise CheckpointMismatchError(
        f"checkpoint {step} in {manager.directory} holds this model's parameters but another training state"
        + (f" (in {', '.join(parts)})" if parts else "") + ": the TrainConfig decides what the optimizer state "
        "and the moving average hold (weight_decay above 0 or not, clip_norm or None, ema_decay or None); restore it "
        "into a Trainer of the TrainConfig it was saved with") from None


def _refuse_another_model(manager, step, have, wanted):
    """A ``CheckpointMismatchError`` naming what differs between the stored parameter shapes
    ``have`` and ``wanted``'s; nothing when nothing does, or ``have`` is unknown."""
    if have is None:
        return
    want = _shapes(wanted["params"])
    bad = sorted(k for k in want if k in have and have[k] != want[k])
    missing = sorted(set(want) - set(have))
    if not (bad or missing):
        return
    details = [f"{k}: checkpoint {have[k]}, model {want[k]}" for k in bad[:10]]
    details += [f"{k}: not in the checkpoint" for k in missing[:10]]
    more = len(bad) + len(missing) - len(details)
    raise CheckpointMismatchError(
        f"checkpoint {step} in {manager.directory} is from a different model: " + _layout_hint(have, want)
        + "; ".join(details) + (f"; and {more} more" if more > 0 else "")
    ) from None


def restore(manager, template: TrainState, step=None) -> TrainState:
    """Restore checkpoint ``step`` (default: the latest) into the structure of ``template``:
    a state, or its shapes alone (``Trainer.state_template()``), laid out as its arrays are
    (sharded where they are) or, for shapes, on the default device. The dropout streams that
    a template of shapes lacks are made on the default device (``state.fresh_streams``):
    on a mesh, lay them out as the rest (``Run.restore_or_init``: ``place(state.other)``).

    Raises CheckpointMismatchError naming the parameters whose shapes differ when the
    checkpoint comes from a model of another size.
    """
    _check_manager(manager)
    check_state(template, "checkpoint.restore's template", made_by="Trainer.state_template()")
    if step is None:
        step = manager.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {manager.directory}")
    elif step not in (steps := manager.all_steps(read=True)):  # read: another process may have saved it
        raise FileNotFoundError(f"no checkpoint {step} in {manager.directory} (its steps: "
                                f"{', '.join(map(str, steps)) or 'none'})")
    wanted = _saved(template)
    target = jax.tree.map(_target, wanted)
    restored = _read(manager, step, target, wanted)
    # A template of shapes (Trainer.state_template()) has shapes for dropout streams too: not
    # saved, their values carry nothing (the module's docstring), made here; for shapes with no
    # sharding, committed to the default device as the rest is (_target): laid out as a fresh
    # state (state.on_default_device says why).
    other = fresh_streams(template.other, template.config.seed)
    other = on_default_device(other) if _unplaced(template.params) else other
    return template.replace(step=restored["step"], params=restored["params"], opt_state=restored["opt_state"],
                            other=other, ema=restored.get("ema"))



@contextlib.contextmanager
def quiet_orbax_logs():
    """orbax and its event loop log every failed read with a traceback (dozens for one bad
    file); the caller reports one line per checkpoint instead."""
    loggers = [logging.getLogger(name) for name in ("absl", "orbax", "asyncio", "tensorstore")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def error_summary(error):
    """One line for a failed restore: the innermost cause's first line (orbax wraps the
    informative TensorStore error in generic ones)."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= 300 else text[:297] + "..."


def silence_orbax_aftermath():
    """After a failed read, or a save that hit a full disk, orbax's writer threads and
    abandoned futures go on failing for a while and report it again through four channels,
    each with a traceback: the "absl" logger (its signalling threads), the "asyncio" logger
    ("exception was never retrieved", often at exit), ``sys.unraisablehook`` (TensorStore's
    threads calling ``call_soon_threadsafe`` on orbax's closed event loop, seen from its
    "Dummy" threads; collected futures), ``sys.excepthook`` and ``threading.excepthook``.
    They carry nothing the caller's one-line summary has not said. Installed once, before the
    first save and before the first restore (not in an ``except`` after a failure: the
    threads report while the error is still propagating): it drops only the closed-event-loop
    error, records of a full disk and asyncio's "never retrieved" records of TensorStore reads
    (``_drop_reported_failures``), and passes every other record and error on. Idempotent;
    ``parity.flax_io`` calls it too (keep its name and signature)."""
    if getattr(sys.unraisablehook, "_flaxformer_mini", False):
        return
    previous_unraisable, previous_except = sys.unraisablehook, sys.excepthook

    def unraisable(info):
        if not _is_closed_loop(info.exc_value):
            previous_unraisable(info)

    def excepthook(kind, value, traceback):
        if not _is_closed_loop(value):
            previous_except(kind, value, traceback)

    def thread_excepthook(args):  # a writer thread's own uncaught error, after the save's was reported
        if not (_is_closed_loop(args.exc_value) or _is_disk_full(args.exc_value) or _is_removed_partial(args.exc_value)):
            previous_thread(args)

    previous_thread = threading.excepthook
    unraisable._flaxformer_mini = excepthook._flaxformer_mini = True
    sys.unraisablehook, sys.excepthook, threading.excepthook = unraisable, excepthook, thread_excepthook
    for name in ("absl", "asyncio"):
        logging.getLogger(name).addFilter(_drop_reported_failures)


def _drop_reported_failures(record):
    """A logging filter: False (drop) for a record of a full disk, of a save's temporary
    directory gone (``save`` removes a full disk's half-written one while orbax's signalling
    threads may still write into it), or of a TensorStore read whose failure the caller has
    reported: asyncio logs "Task exception was never retrieved" for each of orbax's abandoned
    reads when the task is collected, which may be after the loggers were quieted (seen in 1
    of 2 suite runs of test_parity_faults' five reads)."""
    error = record.exc_info[1] if record.exc_info else None
    if _is_disk_full(error) or "No space left on device" in record.getMessage():
        return False
    if _is_removed_partial(error) or (_PARTIAL in record.getMessage() and "No such file" in record.getMessage()):
        return False
    abandoned = "exception was never retrieved" in record.getMessage()
    return not (abandoned and "tensorstore_spec" in str(error))


_PARTIAL = ".orbax-checkpoint-tmp"  # orbax's name for a checkpoint being written


def _is_removed_partial(error):
    """Whether ``error`` (through its chain) is a file missing under a checkpoint that was being
    written: what orbax's threads report after ``_remove_partial``."""
    while error is not None:
        if isinstance(error, FileNotFoundError) and _PARTIAL in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _is_closed_loop(error):
    return isinstance(error, RuntimeError) and "Event loop is closed" in str(error)


def restore_readable(manager, template: TrainState, step):
    """``restore`` of checkpoint ``step``; one that cannot be read is a ``CheckpointError`` naming
    it and why (a checkpoint of another model still raises ``CheckpointMismatchError``)."""
    silence_orbax_aftermath()  # before the read: restore_latest_intact says why
    try:
        with quiet_orbax_logs():
            return restore(manager, template, step)
    except CheckpointMismatchError:
        raise
    except Exception as e:  # noqa: BLE001 - any read failure means this step is damaged
        raise CheckpointError(f"checkpoint {step} in {manager.directory} cannot be read ({error_summary(e)})") from None


def restore_latest_intact(manager, template: TrainState):
    """(state, skipped): the newest checkpoint that restores, and [(step, why)] for each newer
    one that did not (a damaged file, a half-copied directory). A checkpoint of another model
    is not damage: ``CheckpointMismatchError`` propagates. ``CheckpointError`` when none
    restores."""
    # Before the first read, not after its failure: TensorStore's threads report a damaged
    # file's failed reads into orbax's closed event loop while the error is still on its way up
    # (under load, dozens of them landed before an `except` here could install the silencer).
    silence_orbax_aftermath()
    skipped = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            with quiet_orbax_logs():
                return restore(manager, template, step), skipped
        except CheckpointMismatchError:
            raise
        except Exception as e:  # noqa: BLE001 - any read failure means this step is damaged
            skipped.append((step, error_summary(e)))
    details = "; ".join(f"step {step}: {why}" for step, why in skipped)
    raise CheckpointError(f"no checkpoint in {manager.directory} can be read ({details})")
