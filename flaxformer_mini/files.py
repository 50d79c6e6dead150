"""Writing run files so that a kill, a crash or a full disk never leaves half of one."""

import contextlib
import errno
import hashlib
import os
import signal
import tempfile
import threading
from pathlib import Path


def write_atomic(path, data, replace=True):
    """Write ``data`` (str or bytes) to ``path`` all at once or not at all.

    The bytes go to a temporary file beside ``path``, are flushed to disk (fsync), then
    renamed over ``path``: a rename within one directory is atomic, so a reader (or a resumed
    run) sees the old file or the new one, never a truncated one. A failed write (disk full)
    removes the temporary file and leaves the old ``path`` as it was.

    With ``replace=False`` an existing ``path`` is never replaced, even one created after the
    caller checked (``refuse_existing``) and before this write: the temporary file is linked
    to ``path``, which fails if anything is there (FileExistsError naming ``path``).

    Ctrl-C or SIGTERM cuts the write of the bytes short, but not the rename (or link) and the
    removal of the temporary file (``signals_held``): one arriving there comes once the file
    is in place and the temporary gone, so its KeyboardInterrupt may come with the new file
    written. A caller that must know whether it was (files written all or none) holds signals
    around the call.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide a run's files from its other readers
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        with signals_held():  # a link and its temporary's removal: cut between them, the temporary stays
            if replace:
                os.replace(tmp, path)
            else:
                _link_new(tmp, path)
    except BaseException:
        with signals_held():  # a second Ctrl-C here would leave the temporary file
            Path(tmp).unlink(missing_ok=True)
        raise


class StoppedAfterWriting(KeyboardInterrupt):
    """Ctrl-C or SIGTERM answered once the output (its path: ``str(e)``) was in place: held
    through the renames that put it there, it reaches the caller after them."""


@contextlib.contextmanager
def placing(path, placed=None):
    """Hold Ctrl-C and SIGTERM through the block that puts ``path`` in place (its renames): one
    held there is answered after it as ``StoppedAfterWriting(path)``, so that the caller can say
    the output was written; one that ends the block early stays a KeyboardInterrupt.

    ``placed``, a list the caller keeps, gets ``str(path)`` appended as the block ends, while
    signals are still held: a Ctrl-C or SIGTERM that comes later (held by the caller's clean-up,
    or landing on its way out) is a plain KeyboardInterrupt, and the list still says that the
    output was written."""
    done = False
    try:
        with signals_held():
            yield
            done = True
            if placed is not None:
                placed.append(str(path))
    except KeyboardInterrupt:
        if done:
            raise StoppedAfterWriting(str(path)) from None
        raise


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Within the block SIGTERM raises KeyboardInterrupt, as Ctrl-C does: a command's clean-up runs
    (a staging directory, a temporary file), where SIGTERM's default action ends the process
    mid-write. Python lets only the main thread set a handler; a SIGTERM the process ignores
    stays ignored."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) in (
            signal.SIG_IGN, None):
        yield None
        return

    inside, late = [True], []

    def interrupt(signum, _frame):
        if inside[0]:
            raise KeyboardInterrupt
        late.append(signum)  # past the block, before the restore: the previous handler's to answer

    previous = signal.getsignal(signal.SIGTERM)
    try:  # installed inside the try: a SIGTERM the moment it is in still restores the previous one
        signal.signal(signal.SIGTERM, interrupt)
        yield None
    finally:
        # Nested, so that a KeyboardInterrupt raised as the block ends still restores the handler.
        try:
            inside[0] = False
        finally:
            signal.signal(signal.SIGTERM, previous)
        if late:
            signal.raise_signal(signal.SIGTERM)


@contextlib.contextmanager
def signals_held(on_repeat=None):
    """Hold Ctrl-C (SIGINT) and SIGTERM until the block is done, then hand each to the handler
    it would have reached (Python's default raises KeyboardInterrupt there): around steps that
    must all happen once begun, as a rename and the removal of what it leaves behind.

    ``on_repeat(signum)`` is called for each further signal while one is held (a long block
    lets a user who insists end it); without it every signal is held. Blocks nest: an inner
    one hands what it held to the outer one. Outside the main thread, where Python allows no
    handler, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []

    def hold(signum, frame):
        if held and on_repeat is not None:
            on_repeat(signum)
        held.append(signum)

    previous = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            # A signal the process ignores (SIGINT in a shell script's background job) stays
            # ignored: held, a second one would reach ``on_repeat``, which may end the process
            # that was started not to be stopped by it. A handler Python did not install (None:
            # C code's) could not be put back.
            if signal.getsignal(signum) not in (signal.SIG_IGN, None):
                previous[signum] = signal.signal(signum, hold)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        raised = None
        for signum in dict.fromkeys(held):
            handler = previous[signum]
            # Each held signal reaches its handler, in the order they came, though an earlier
            # one raised (KeyboardInterrupt); the first exception is the one that propagates.
            try:
                # Called, not raised again: a handler that watches signal's wakeup descriptor
                # (train.stop) would see one signal twice.
                if callable(handler):
                    handler(signum, None)
                else:
                    signal.raise_signal(signum)  # SIG_DFL: the default action, which ends the process
            except BaseException as e:
                raised = raised or e
        if raised is not None:
            raise raised


def _link_new(tmp, path):
    """Give the finished temporary file the name ``path`` unless something has it: a hard
    link fails with EEXIST where rename would replace. A file system without hard links
    falls back to a check just before the rename."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "already exists; nothing was written", str(path)) from None
    except OSError:
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "already exists; nothing was written", str(path)) from None
        os.replace(tmp, path)
    else:
        os.unlink(tmp)


def refuse_existing(path, option):
    """Before the work whose result goes to ``path``: a ValueError naming ``option`` and
    ``path`` if anything (a file, a directory, a link) is there. The caller skips it for
    ``--force`` (as ``parity``'s outputs)."""
    if os.path.lexists(path):
        kind = "a directory" if os.path.isdir(path) else "a file"
        raise ValueError(f"{option} {path}: already exists ({kind}); nothing was written. "
                         f"Give --force to replace it, or choose another path")


def check_writable(path, option):
    """Before the work whose result goes to the file ``path``: a ValueError naming ``option``
    and ``path`` when it cannot be written there (a directory, a missing or read-only parent),
    so a long computation is not lost to a typo, and no temporary file's name is ever shown."""
    if Path(path).is_dir():
        raise ValueError(f"{option} {path}: is a directory; give a file name")
    check_parent_writable(path, option)


def check_parent_writable(path, option):
    """``check_writable`` for a ``path`` that may be a file or a directory: its parent must be
    an existing directory this process may write in (write_atomic's temporary goes there)."""
    parent = Path(path).absolute().parent
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: no permission to write in the directory {parent}")


def file_sha256(path):
    """Hex sha256 of a file's bytes, read in 1 MiB chunks (a corpus need not fit in memory
    twice): the one digest of files here (data files agreed across processes or recorded by
    a run, tokenizer files)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def same_file(a, b):
    """Whether paths ``a`` and ``b`` name one existing file (a link, another spelling)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


_OS_ERROR_HINTS = {errno.EISDIR: "give a file, not a directory", errno.EACCES: "check its permissions",
                   errno.ENOENT: "check the path", errno.ENOTDIR: "a part of the path is a file, not a directory"}


@contextlib.contextmanager
def naming(path, detail=""):
    """An OSError raised within names ``path`` (``detail`` added to its reason): a write error
    (ENOSPC, EFBIG) carries no file name of its own, and a staging directory's name, which the
    user never gave, is not shown."""
    try:
        yield
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror}{detail}", str(path)) from None


def describe_os_error(error):
    """``'FILE: reason (hint)'``: one line for an OSError that names its file, the wording every
    command line of the project uses."""
    reason = error.strerror or type(error).__name__
    hint = _OS_ERROR_HINTS.get(error.errno)
    return f"{error.filename}: {reason}" + (f" ({hint})" if hint else "")
