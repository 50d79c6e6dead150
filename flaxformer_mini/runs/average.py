"""``average`` of a run's last checkpoints: their parameters' mean, written as a run directory.

fairseq's ``scripts/average_checkpoints.py --num-epoch-checkpoints N`` averages the parameters of
the last N checkpoints (their mean, element by element) and keeps the rest of the newest one; so
does this, into a run directory that ``evaluate``, ``generate`` and ``parity convert`` read as any
run: RUN's config (with ``averaged``: the source run and the steps), RUN's tokenizer files, and one
checkpoint at the newest averaged step holding the mean parameters and that step's optimizer
state. ``train`` refuses to continue it (``RunDir.start_or_resume``): its optimizer state belongs
to other parameters.
"""

import dataclasses
import os
import shutil
from pathlib import Path

import jax
import numpy as np

from flaxformer_mini.files import naming, placing, write_atomic
from flaxformer_mini.runs.config import Averaged, RunConfigError
from flaxformer_mini.runs.directory import CONFIG_CHECKSUM, RunDir
from flaxformer_mini.runs.run import Run
from flaxformer_mini.train import checkpoint


def average_run(source, last, out, *, placed=None):
    """Average the parameters of the newest ``last`` checkpoints of the run in ``source`` into a
    new run directory ``out`` (absent, or an empty directory); returns the averaged steps.
    Written beside ``out`` and renamed into place: a failure leaves no half-made run.
    ``placed`` (a list): ``files.placing``'s record that ``out`` is in place."""
    run = Run.open(source)
    if run.best:
        raise RunConfigError(f"{source}: the best checkpoint is one state; average reads a run's rotating checkpoints "
                             f"(give {run.path})")
    out = Path(out)
    _check_out(out, Path(run.path))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a directory that is not empty" if out.is_dir() else "a file, not a directory"
        raise RunConfigError(f"--out {out}: exists and is {what}; give a new directory for the average "
                             f"(nothing was written)")
    steps = sorted(run.checkpoints().all_steps()) if run.dir.checkpoints.is_dir() else []
    if len(steps) < last:
        held = f"{len(steps)} checkpoint(s)" + (f" (steps {', '.join(map(str, steps))})" if steps else "")
        raise RunConfigError(f"--last {last}: {source} holds {held}; train --keep N keeps the newest N, "
                             f"--save-every sets how often they are saved")
    chosen = steps[-last:]
    manager, template = run.checkpoints(), run.trainer.state_template()
    total = newest = None
    for step in chosen:  # one state at a time, summed on the host in float64 (then rounded once to float32)
        newest = checkpoint.restore_readable(manager, template, step)
        # The parameters, and with --ema their moving average too (what evaluate and generate read).
        trees = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float64), (newest.params, newest.ema))
        total = trees if total is None else jax.tree.map(np.add, total, trees)
    params, ema = jax.tree.map(lambda s, p: jax.device_put((s / last).astype(p.dtype), p.sharding), total,
                               (newest.params, newest.ema))
    averaged = newest.replace(params=params, ema=ema)
    config = dataclasses.replace(run.config, averaged=Averaged(run=str(Path(run.path).absolute()), steps=tuple(chosen)))
    _write(run, config, averaged, out, placed)
    return chosen


def _check_out(out, source):
    """Refuse an ``out`` the average cannot be renamed onto, or one inside the run it reads."""
    if out.is_symlink():
        raise RunConfigError(f"--out {out}: a symbolic link; give the directory itself, or a new one "
                             f"(nothing was written)")
    here = out.resolve()
    if here == Path.cwd().resolve():
        raise RunConfigError(f"--out {out}: the working directory; give a new directory for the average "
                             f"(nothing was written)")
    run_root = source.resolve()
    if here == run_root or run_root in here.parents:
        # OUT/checkpoints/N would be a checkpoint the run never saved, OUT/best its best one.
        raise RunConfigError(f"--out {out}: inside the run it averages ({source}); give a directory outside it "
                             f"(nothing was written)")


def _write(run, config, state, out, placed):
    """The averaged run's directory: made beside ``out``, renamed into place when whole."""
    staging = out.parent / f".{out.name}.averaging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        # The source's recorded sha256s (tokenizer and data files) carry over with its files; the
        # config's own is recomputed for the config with `averaged`.
        checksums = {k: v for k, v in run.dir.recorded_checksums().items() if k != CONFIG_CHECKSUM}
        _, lock, _ = RunDir(staging).start_or_resume(config, checksums)
        try:
            if config.data.kind == "tsv":
                for _, path in run.dir.tokenizer_files(config.data):
                    content = path.read_bytes()
                    run.dir.verify(path, content)  # the files the run recorded, or an error naming one
                    write_atomic(staging / path.name, content)
            checkpoint.save(checkpoint.open_manager(RunDir(staging).checkpoints.absolute(), max_to_keep=1), state)
        finally:
            lock.release()
        # rename(2) puts a directory in the place of an empty one: OUT, if there, is never
        # removed first (one filled meanwhile by another program refuses the rename, and stays).
        with placing(out, placed), naming(out, " (nothing was written)"):
            os.rename(staging, out)
    except BaseException:  # after the rename (StoppedAfterWriting) there is no staging left to remove
        shutil.rmtree(staging, ignore_errors=True)
        raise
