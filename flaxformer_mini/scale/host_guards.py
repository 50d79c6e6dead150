"""Guards a process takes on its own host before joining a multi-process run, against what
jax's coordination service cannot survive: it aborts every process of a run (SIGABRT, the
steps since the last save lost) when a second run's process registers with it, or when a
process id registers twice. ``distributed.start_runtime`` calls both before jax starts.
"""

import atexit
import contextlib
import errno
import os
import socket
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no per-host lock (hold_process_slot)
    fcntl = None

from flaxformer_mini.process_exit import before_exit_now
from flaxformer_mini.scale.errors import DistributedError


def host_port(address, given="--coordinator"):
    """(host, port) of a HOST:PORT coordinator address ([IPv6]:PORT too), or DistributedError
    naming the option or variable it came from."""
    host, port = _split(address)
    if host is None:
        raise DistributedError(f"{given} {address!r} is not HOST:PORT")
    # Port 0 asks the system for any port, which the other processes cannot know; a port past
    # 65535 is wrapped by getaddrinfo and jax to another one (70000 -> 4464).
    if not 1 <= port <= 65535:
        raise DistributedError(f"{given} {address!r}: port {port} is not in 1..65535")
    return host, port


def _split(address):
    host, _, port = address.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else (None, None)


def check_port_free(address, given="--coordinator"):
    """Refuse to start process 0 when the coordinator's port is already taken on this host.

    jax's coordination service (gRPC) binds its port with SO_REUSEPORT: a second run's process
    0 on the same port binds it too, without an error, and the second run's other processes then
    register with the *first* run's service, which aborts every process of the first run
    (SIGABRT, the steps since its last save lost). A plain bind (SO_REUSEADDR, which only lets
    it past connections in TIME_WAIT, as a restarted run's own are; no SO_REUSEPORT) fails with
    EADDRINUSE while anything listens there: another run's coordinator or another program. The
    socket is closed before jax binds. On the coordinator's address, then on every address (jax
    binds ``[::]:PORT``); other errors (an address not local to this host) prove nothing."""
    host, port = host_port(address, given)
    for bind_host in (host, ""):
        try:
            infos = socket.getaddrinfo(bind_host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror:
            continue
        family, kind, proto, _, where = infos[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(where)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise DistributedError(f"{given} {address}: port {port} is already in use on this host: another run "
                                   f"or program holds it. Choose another --coordinator port (the same on every "
                                   f"process of this run)") from None


# The per-host locks of hold_process_slot by lock file, kept open (and so held) for the process's life.
_SLOTS = {}


def _slot_path(address, process_id):
    """The lock file of (coordinator, process id). A coordinator on this host is keyed by its
    port alone: 127.0.0.1:P, localhost:P and HOSTNAME:P reach the same service, so two processes
    that name it differently must still meet on one lock."""
    host, port = _split(address)
    if host is None:  # refused by host_port elsewhere; a key all the same
        host, port = address, ""
    key = f"{host.lower()}_{port}"
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.bind(where)  # only an address of this host can be bound
        key = f"local_{port}"
    except OSError:  # socket.gaierror too: another host's address, or a name this host cannot resolve
        pass
    safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in key)
    return Path(tempfile.gettempdir()) / f"flaxformer-mini-{safe}-process-{process_id}.lock"


def hold_process_slot(address, process_id, given="--coordinator"):
    """Take this host's lock on (coordinator, process id) for the rest of the process's life,
    or refuse: a second process with an id already in use would register with the run's
    coordination service as that task restarted, and the service aborts every process of the
    run (SIGABRT). Only processes on this host are seen (a lock file in the temp directory);
    the same id on another host is not (docs/scale-out.md, known limits).

    The file is removed at exit, also at an exit that skips Python's shutdown
    (``process_exit.exit_now``); the lock is re-taken when the file was replaced meanwhile (the inode
    check), so a removal never lets two holders in. A process killed outright leaves its file:
    the next process with that coordinator and id takes the lock in it."""
    if fcntl is None:
        return
    path = _slot_path(address, process_id)
    if path in _SLOTS:  # held by this process already: a start-up retried after a later failure
        return
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError:
            return  # a temp directory we cannot write (or another user's file): no guard
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise DistributedError(f"a process with --process-id {process_id} and {given} {address} is already running on "
                           f"this host (pid {holder}): a second one with the same id would abort that run. Give "
                           f"each process its own --process-id, or choose another --coordinator port for another "
                           f"run") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file as we opened it: take the new one
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    if not _SLOTS:  # the first lock this process holds: one release of all of them, at either exit
        atexit.register(release_slots)
        before_exit_now(release_slots)
    _SLOTS[path] = fd


def release_slots():
    """Remove and release every lock file this process holds: at Python's exit (``atexit``)
    and at ``process_exit.exit_now``, which runs no ``atexit`` handler."""
    for path, fd in list(_SLOTS.items()):
        _release_slot(path, fd)


def _release_slot(path, fd):
    """Remove the lock file, if it is still this process's (a temp cleaner may have removed it
    and another process made its own), then close it; each step on its own."""
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            os.unlink(path)  # while still held: a newcomer that opened it re-checks the inode
    with contextlib.suppress(OSError):
        os.close(fd)
    _SLOTS.pop(path, None)
