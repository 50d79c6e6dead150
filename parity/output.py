"""parity's outputs are written all at once or not at all, and never over a file unasked.

Files (``.safetensors``, ``.pt``, the ``--json`` report, the ``--plot`` image) are serialised in
memory, then written by ``flaxformer_mini.files.write_atomic`` (a temporary file beside the
output, fsync, rename): a failure at any byte (a full disk, Ctrl-C, a crash) leaves the old
file, or none, and no temporary file. The price is a second copy of the file in memory while
it is written (the serialised bytes beside the arrays): for the models this project converts
(transformer-base: ~250 MB of float32) that is affordable, and it keeps one atomic writer.

An orbax directory is written into a temporary directory beside the output and renamed into
place once orbax has finished; with ``overwrite``, the old directory is moved aside first and
removed only after the new one is in place.
"""

import contextlib
import functools
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from flaxformer_mini import files


# What parity's orbax directories hold (flax_io's two items and orbax's own records): a
# directory holding only these (or nothing) is a parity output that --force may replace;
# anything else may be someone's data, and is never removed.
ORBAX_ENTRIES = frozenset({"params", "config", "_CHECKPOINT_METADATA", "commit_success.txt"})


def write_files_atomic(outputs, replace=False, on_written=None):
    """Write each ``(path, data)`` of ``outputs`` with ``flaxformer_mini.files.write_atomic`` (the
    project's one atomic writer of files), all of them or none: when
    one fails (a full disk, a file that appeared without ``replace``, Ctrl-C), those written
    before it are removed, and a file that ``replace`` put aside goes back, so one command's
    outputs are never half there. ``on_written()``, if given, is called once they are all in
    place and nothing is left aside, before a signal held meanwhile is delivered: a caller says
    what it wrote even when Ctrl-C then stops it.

    Each output (putting the file at its path aside, writing it, counting it written) and the
    end (removing the files aside, ``on_written``) are one step for Ctrl-C and SIGTERM
    (``_signals_deferred``): a signal held in one is delivered once it is done. Cut short, a
    step would leave the user's file under its hidden name, or a new file in place but not
    counted, which the clean-up would keep while it removes the others. A signal held while an
    output is written takes them all back, as any failure does; one held at the end comes once
    they are all in place. The outputs are small (a report, an image): a signal waits for the
    write of one."""
    aside = []  # (path, the file it replaced, moved aside beside it, or None); the last perhaps not written
    written = 0  # how many of them were
    with contextlib.ExitStack() as end:
        try:
            for path, data in outputs:
                path = Path(path)
                with _signals_deferred():
                    aside.append((path, _set_aside(path) if replace else None))
                    files.write_atomic(path, data, replace=replace)
                    written += 1
            # Held from inside the try: a signal after the last output and before the hold
            # takes them back, as any failure does, instead of leaving the files aside.
            end.enter_context(_signals_deferred())
        except BaseException:
            with _signals_deferred():
                for i, (path, old) in reversed(list(enumerate(aside))):
                    if old is not None:
                        os.replace(old, path)
                    elif i < written:  # one not written may be another process's file (replace=False)
                        path.unlink(missing_ok=True)
            raise
        for _, old in aside:
            if old is not None:
                os.unlink(old)
        if on_written is not None:
            on_written()


def _set_aside(path):
    """Rename the file at ``path`` (if any) to a hidden temporary name beside it; that name, or None."""
    if not os.path.lexists(path):
        return None
    fd, aside = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old")
    os.close(fd)
    try:
        os.replace(path, aside)
    except BaseException:
        os.unlink(aside)
        raise
    return aside


class OutputExistsError(ValueError):
    """The output path exists and replacing it was not asked for (``--force``)."""


def refuse_existing(path, what="OUT"):
    """Raise OutputExistsError naming ``path`` if anything (a file, a directory, a link) is
    there: ``flaxformer_mini.files.refuse_existing``'s check and words, as parity's error."""
    try:
        files.refuse_existing(path, what)
    except ValueError as e:
        raise OutputExistsError(str(e)) from None


def _replaceable_directory(path):
    return {p.name for p in path.iterdir()} <= ORBAX_ENTRIES


def _signals_deferred(staging=None):
    """``flaxformer_mini.files.signals_held``: Ctrl-C and SIGTERM held until the block is done,
    then delivered to the handlers they would have reached. Around orbax's write into
    ``staging``: orbax writes from threads of its own (TensorStore's): interrupted in the
    middle, they go on writing into the staging directory after it is removed, and an
    interrupt raised inside its C++ wait can abort the process, so the staging directory is
    left behind either way. There a second signal while one is held is the user insisting: the
    process ends at once (``_stop_at_once``). Without ``staging`` (a few renames that must all
    happen, or a file is left under a hidden name), every signal is held."""
    return files.signals_held(None if staging is None else functools.partial(_stop_at_once, staging=staging))


def _stop_at_once(signum, staging):
    """End the process at once, with exit 130 (the shell's code for SIGINT, as parity's commands
    exit on Ctrl-C) and one line, removing ``staging``. orbax's threads may write into it while
    it goes, so a directory still there is named for the user to remove."""
    shutil.rmtree(staging, ignore_errors=True)
    left = (f"{staging} is left, orbax's threads were writing into it: remove it" if os.path.lexists(staging)
            else "no output was left half-written")
    by = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    print(f"\nparity: stopped at once by a second {by} while orbax was writing; {left}", file=sys.stderr)
    sys.stderr.flush()
    os._exit(130)  # no unwinding: the main thread would wait for orbax's threads again


def write_directory_atomic(path, write, overwrite=False):
    """Call ``write(tmp)`` to create the directory ``tmp`` (which does not exist yet; orbax
    creates its own), then rename it to ``path``. On any failure nothing is left but what was
    at ``path`` before. An existing ``path`` (but an empty directory) is refused unless
    ``overwrite``; even then only a directory parity wrote is replaced, never another file or
    directory."""
    path = Path(path).absolute()
    if os.path.lexists(path) and not (path.is_dir() and not path.is_symlink() and not any(path.iterdir())):
        if not overwrite:
            raise OutputExistsError(f"{path}: already exists; orbax writes a new directory (remove it or choose another)")
        if not path.is_dir() or path.is_symlink() or not _replaceable_directory(path):
            raise OutputExistsError(f"{path}: exists and is not a directory of Flax parameters written by "
                                    f"`parity convert`; not replaced, even with --force")
    if not path.parent.is_dir():
        raise FileNotFoundError(2, "its parent directory does not exist", str(path))
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        new, old = staging / "new", staging / "old"
        with _signals_deferred(staging):
            write(new)
        if os.path.lexists(path):
            os.rename(path, old)  # aside, within the same directory: atomic, and undone below
            try:
                os.rename(new, path)
            except BaseException:
                os.rename(old, path)
                raise
        else:
            os.rename(new, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
