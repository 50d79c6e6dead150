"""One timing run per host at a time: two benchmarks sharing a machine's cores each measure
the other's load, and neither report could say so (its load average, read at the start, lags
by a minute). ``python -m benchmarks``, ``python -m benchmarks.scaling`` and the tools take
this host's lock before they time anything, or stop with one line naming the run that holds
it. A lock file in the temp directory, held (flock) for the process's life and released by
the kernel when it ends, however it ends; the file itself stays, holding the last pid.
"""

import os
import sys
import tempfile

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None

LOCK_NAME = "flaxformer-mini-benchmark.lock"
_HELD = []  # the open file descriptor, kept for the process's life


class BusyError(RuntimeError):
    """Another timing run holds this host's lock."""


def hold_the_machine(directory=None):
    """Take this host's benchmark lock for the rest of the process, or raise BusyError naming
    the pid that holds it. Does nothing where files cannot be locked (not POSIX, a temp
    directory we cannot write)."""
    if fcntl is None or _HELD:
        return
    path = os.path.join(directory or tempfile.gettempdir(), LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise BusyError(f"another benchmark is timing on this host (pid {holder}): two at once would each measure "
                        f"the other's load. Wait for it to end ({path} is locked while it runs)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD.append(fd)


def hold_the_machine_or_exit(prog):
    """``hold_the_machine()`` for a command: a busy host ends it with exit code 2 and one line."""
    try:
        hold_the_machine()
    except BusyError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
