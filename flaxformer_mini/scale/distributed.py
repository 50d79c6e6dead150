"""JAX's multi-controller runtime for ``flaxformer-mini train``: one process per host, every
process the same program (``jax.distributed``).

    started = start_runtime("10.0.0.1:1234", num_processes=2, process_id=0)  # before any device use
    agree_on(run_identity(config, steps, ...))  # refuse processes started with other options
    if is_main(): write the run's files           # process 0 alone writes config, metrics, plot

On CPU the processes' collectives go over gloo (TCP), so several processes on one machine
run the whole multi-host path: that is how tests/test_multiprocess.py checks it.

A process that dies mid-run: the others' next collective fails at once (gloo reads a closed
socket: "Connection reset by peer"), or, when they were not in one, JAX's coordination service
misses its heartbeats for ``timeout_s`` and stops them. Either way nothing waits forever.
"""

import contextlib
import functools
import hashlib
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

try:  # JAX's registry of the clusters it detects by itself: private, so a jax without it is allowed
    from jax._src.clusters import ClusterEnv
except ImportError:  # then only explicit options start the runtime
    ClusterEnv = None

from flaxformer_mini.files import file_sha256
from flaxformer_mini.model.paths import path_name
from flaxformer_mini.process_exit import exit_now
from flaxformer_mini.scale import host_guards
from flaxformer_mini.scale.errors import DistributedError, ProcessLostError

# Our own environment variables for the process count and index: jax.distributed reads
# JAX_COORDINATOR_ADDRESS itself but (0.10) not these two.
ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
DEFAULT_TIMEOUT_S = 300  # jax.distributed's own initialization timeout
# jax's own initialization timeout runs this much past ours, so that our watchdog
# (_give_up_after) always ends a start-up that waits too long, with a message, before jax's
# C++ client does with SIGABRT.
JAX_INIT_GRACE_S = 10
EXIT_UNUSABLE = 2  # the CLI's exit code for processes that cannot start together


# What XLA's errors say when a peer is gone: gloo's closed sockets, the coordination service.
_LOST_MARKERS = ("gloo", "connection reset", "connection closed", "coordination", "heartbeat", "barrier", "unavailable")


def as_lost_process(error):
    """``error`` as a ProcessLostError when it says another process is gone, else None."""
    text = str(error)
    if not is_multiprocess() or not any(m in text.lower() for m in _LOST_MARKERS):
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return ProcessLostError(f"process {jax.process_index()} lost contact with another process of the run (it stopped "
                            f"or was killed): {first}")


def _cluster_detected():
    """Whether JAX's own cluster detection (SLURM, Open MPI, Cloud TPU, Kubernetes) would find
    a cluster. jax exposes no public call for this question; its ClusterEnv registry answers it.
    Without a cluster, ``jax.distributed.initialize()`` raises, and a lone process must not."""
    return bool(os.environ.get(ENV_COORDINATOR)) or _batch_cluster_detected()


def _batch_cluster_detected():
    """Whether a cluster JAX detects by itself (SLURM, ...) is present: it then fills in the
    process count and index that the options and variables leave unset."""
    if ClusterEnv is None:
        return False
    return any(not env.opt_in_only_method and env.is_env_present() for env in ClusterEnv._cluster_types)


def _env_int(name):
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"{name}={value!r} is not an integer") from None


def start_runtime(coordinator=None, num_processes=None, process_id=None, timeout_s=DEFAULT_TIMEOUT_S,
                  program="flaxformer_mini"):
    """Start ``jax.distributed`` when this is a multi-process run; call it before anything
    touches a device. Returns True when the runtime was started.

    Explicit arguments win; then ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
    ``JAX_PROCESS_ID``; then JAX's cluster detection (SLURM, Open MPI, Cloud TPU). With none of
    them, a single process: nothing is started. ``timeout_s`` bounds both the wait for the
    coordinator and the heartbeat after which a silent process counts as lost.

    A process whose peers do not all connect within ``timeout_s`` prints
    ``{program}: error: ...`` naming the coordinator and the process count, and exits with code 2:
    that wait happens inside jax's C++ client, where no Python exception can reach it.

    Before the runtime starts, two guards against what jax's coordination service cannot
    survive (it aborts every process of a run when a task registers twice): this host's lock on
    (coordinator, process id) (``host_guards.hold_process_slot``) and, on process 0, a plain
    bind of the coordinator's port (``host_guards.check_port_free``).
    """
    # Each value is named as the user gave it: the option, or the variable jax reads itself.
    count_given = "--num-processes" if num_processes is not None else ENV_NUM_PROCESSES
    id_given = "--process-id" if process_id is not None else ENV_PROCESS_ID
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    explicit = coordinator is not None or num_processes is not None or process_id is not None
    if not explicit and not _cluster_detected():
        return False
    if num_processes is not None and num_processes < 1:
        raise DistributedError(f"{count_given} must be >= 1, got {num_processes}")
    if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
        raise DistributedError(f"{id_given} {process_id} is out of range for {count_given} {num_processes} "
                               f"(0 to {num_processes - 1})")
    if timeout_s < 1:
        raise DistributedError(f"--distributed-timeout must be >= 1 second, got {timeout_s}")
    given = "--coordinator" if coordinator is not None else ENV_COORDINATOR
    address = coordinator if coordinator is not None else os.environ.get(ENV_COORDINATOR)
    if address is not None and (address or explicit):  # an empty variable alone is no coordinator
        host_guards.host_port(address, given)  # HOST:PORT with a usable port, before any wait
    if not _batch_cluster_detected():
        # jax would say "Number of processes must be defined." or "coordinator_address should be
        # defined." without naming the option or variable.
        if address:
            missing = [name for name, value in (("--num-processes (or JAX_NUM_PROCESSES)", num_processes),
                                                ("--process-id (or JAX_PROCESS_ID)", process_id)) if value is None]
            if missing:
                raise DistributedError(f"{given} {address} starts a multi-process run, which also needs "
                                       f"{' and '.join(missing)} on every process")
        else:
            set_ = [f"{name} {value}" for name, value in ((count_given, num_processes), (id_given, process_id))
                    if value is not None]
            raise DistributedError(f"{' and '.join(set_)} start{'s' if len(set_) == 1 else ''} a multi-process run, "
                                   f"which also needs --coordinator HOST:PORT (or {ENV_COORDINATOR}) on every process")
    if address and process_id is not None:
        host_guards.hold_process_slot(address, process_id, given)
    if address and process_id == 0:
        host_guards.check_port_free(address, given)
    if address and process_id not in (None, 0):
        _wait_for_coordinator(address, timeout_s, given)
    # CPU collectives across processes need an implementation (gloo, over TCP); the GPU and TPU
    # backends bring their own. This setting changes nothing on those.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # SIGTERM is ours (stop.StopRequests, installed by `train` before this call, then fit.py's
    # all-reduces of the stop flag before the first step and at each step boundary, read one
    # boundary later: every process saves the same step). JAX's preemption service would
    # install its own SIGTERM notifier, which can take the signal from Python's handler.
    jax.config.update("jax_enable_preemption_service", False)
    address = address or "(found by JAX's cluster detection)"
    everyone = f"the run's {num_processes} processes" if num_processes else "the run's processes"
    late = (f"{program}: error: {everyone} did not all connect to the coordinator {address} within {timeout_s}s "
            f"(--distributed-timeout){'' if process_id is None else f' (this is process {process_id})'}. Start every "
            f"process with the same --coordinator and --num-processes, each with its own --process-id, or give "
            f"them longer with --distributed-timeout.")
    try:
        with _give_up_after(timeout_s, late):
            jax.distributed.initialize(coordinator, num_processes, process_id,
                                       initialization_timeout=int(timeout_s) + JAX_INIT_GRACE_S,
                                       heartbeat_timeout_seconds=int(timeout_s),
                                       # the exit barrier (every process waits for the others to end):
                                       # bounded like the rest, not jax's default 5 minutes
                                       shutdown_timeout_seconds=int(timeout_s))
    except (RuntimeError, ValueError, TypeError) as e:  # XlaRuntimeError is a RuntimeError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        # Most failures here are not timeouts (a port jax could not bind, a refused option):
        # the time limit is named only when jax says it ran out of time.
        timed_out = any(w in first.lower() for w in ("deadline", "timed out", "timeout"))
        raise DistributedError(f"could not start the multi-process runtime with the coordinator {address}"
                               + (f" within {timeout_s}s (--distributed-timeout)" if timed_out else "")
                               + f": {first}") from None
    _check_equal_device_counts()
    return True


class _give_up_after:
    """Within the block, end the process with ``message`` and exit code 2 once ``timeout_s``
    have passed.

    Hand-written for ``jax.distributed.initialize``: when the peers do not all connect within
    its timeout, jax's C++ client ends the process with a fatal log and SIGABRT (exit 134, a C++
    stack trace, no Python error to catch). The client releases the GIL while it waits, so a
    thread can still speak and leave first (``os._exit``: the main thread is inside C++ and
    nothing has been written yet, see the CLI's start-up order)."""

    def __init__(self, timeout_s, message):
        self.timeout_s, self.message = timeout_s, message
        self._done = threading.Event()

    def _watch(self):
        if not self._done.wait(self.timeout_s):
            print(self.message, file=sys.stderr, flush=True)
            exit_now(EXIT_UNUSABLE)

    def __enter__(self):
        threading.Thread(target=self._watch, name="distributed-start-watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        return False


@contextlib.contextmanager
def stdout_for_results():
    """Within the block, whatever is written to file descriptor 1 goes to stderr; yields the
    file the results go to: the original stdout. gloo (C++, std::cout) prints "[Gloo] Rank 0 is
    connected to 1 peer ranks..." on stdout, once per communicator, which broke ``train ... | jq``
    (stdout is for results). When ``sys.stdout`` is not file descriptor 1 (a caller's redirect,
    as in-process tests do), nothing is redirected and ``sys.stdout`` is yielded."""
    try:
        real = sys.stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        real = False
    if not real:
        yield sys.stdout
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    results = os.fdopen(saved, "w", closefd=False, encoding=sys.stdout.encoding, errors=sys.stdout.errors)
    try:
        yield results
    finally:
        results.flush()
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def devices_by_process():
    """``{process index: its devices by id}``, in process order. ``jax.devices()`` lists every
    process's devices on each process, so every process builds the same table, without a
    collective."""
    by_process = {}
    for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(d.process_index, []).append(d)
    return by_process


def describe_device_counts(by_process):
    """``'process 0: 2, process 1: 1'``: for the errors that name each process's count."""
    return ", ".join(f"process {p}: {len(devices)}" for p, devices in by_process.items())


def _check_equal_device_counts():
    """Refuse processes with different numbers of devices, on each process alone, before any
    collective: jax's ``process_allgather`` (``allgather_bytes``, so every start-up check) and
    the meshes take the same count from every process, and with unequal counts the first
    collective fails with a bare reshape error. Every process reads the same table
    (``devices_by_process``), finds the same mismatch and stops with the same message."""
    by_process = devices_by_process()
    if len({len(devices) for devices in by_process.values()}) > 1:
        said = describe_device_counts(by_process)
        platform = jax.devices()[0].platform
        how = ("XLA_FLAGS=--xla_force_host_platform_device_count=N" if platform == "cpu"
               else "CUDA_VISIBLE_DEVICES" if platform == "gpu" else "the hosts' accelerators")
        raise DistributedError(f"the processes have different numbers of {platform} devices ({said}); every process "
                               f"needs as many (set by {how})")


def _wait_for_coordinator(address, timeout_s, given="--coordinator"):
    """Wait until ``address`` (process 0's coordination service) accepts a TCP connection.

    Hand-written because jax.distributed cannot say it: a client that cannot register within
    its timeout ends the process with a C++ fatal log (SIGABRT), no Python error to catch."""
    host, port = host_guards.host_port(address, given)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout_s)):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise DistributedError(f"the coordinator {address} ({given}) could not be reached within {timeout_s}s "
                                       f"(--distributed-timeout): {e.strerror or e}. Start process 0 "
                                       f"(--process-id 0) with the same {given}, and check the address "
                                       f"and port are reachable from this host.") from None
            time.sleep(0.2)


def is_main():
    """Process 0: the one that writes the run's config, metrics, plot and vocabularies."""
    return jax.process_index() == 0


def process_index():
    return jax.process_index()


def is_multiprocess():
    return jax.process_count() > 1


# ----------------------------------------------------------------------------- agreement


# sha256 of a file's bytes: two processes reading different data files disagree on it.
file_digest = file_sha256


def allgather_bytes(payload: bytes):
    """Every process's ``payload``, in process order. Two ``process_allgather`` calls (the
    lengths, then the bytes padded to the longest): the public multihost API, no side channel."""
    lengths = np.asarray(multihost_utils.process_allgather(np.array([len(payload)], np.int32))).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: len(payload)] = np.frombuffer(payload, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
    return [bytes(row[:n]) for row, n in zip(rows, lengths)]


def agree_on(identity: dict):
    """Refuse to run when the processes were started with different options.

    ``identity`` maps an option's name to its value on this process (JSON-able). Each process
    hashes it; when the hashes differ, the options themselves are gathered so the error names
    each differing option with process 0's value and the other's. Every process raises the same
    error, so none is left waiting for the others.
    """
    if not is_multiprocess():
        return
    text = json.dumps(identity, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).digest()
    digests = allgather_bytes(digest)
    if all(d == digests[0] for d in digests):
        return
    refuse_differences([json.loads(t) for t in allgather_bytes(text.encode())],
                       "the processes were started with different options", "Start every process with the same command.")


def refuse_differences(everyone, problem, remedy):
    """Raise DistributedError naming each key whose value on a process differs from process
    0's, from ``everyone`` (every process's dict, in process order, already gathered: every
    process raises the same error); nothing when all agree."""
    reference = everyone[0]
    problems = []
    for i, other in enumerate(everyone[1:], 1):
        for key in sorted(set(reference) | set(other)):
            if reference.get(key) != other.get(key):
                problems.append(f"{key}: {reference.get(key)!r} on process 0, {other.get(key)!r} on process {i}")
    if problems:
        raise DistributedError(f"{problem}: " + "; ".join(problems) + f". {remedy}")


def agree_on_values(tree, what):
    """Refuse to go on when the processes hold different values in ``tree`` (host arrays), and
    name the first leaf that differs. One digest per leaf, gathered in one ``allgather_bytes``:
    ``jax.device_put`` of a host value onto devices of several processes makes the same check
    with a collective (and a compilation) per leaf, which is what ``sharding.shard_state``
    replaces with this. Values can differ when the processes' data or seeds do (refused
    earlier, by ``agree_on``) or when hosts of different CPU types round an initializer apart."""
    if not is_multiprocess():
        return
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    digests = [hashlib.sha256(np.ascontiguousarray(x).reshape(-1).view(np.uint8)).digest() for _, x in flat]
    everyone = allgather_bytes(b"".join(digests))
    first = everyone[0]
    for i, other in enumerate(everyone[1:], 1):
        differing = [k for k in range(len(digests)) if other[32 * k: 32 * k + 32] != first[32 * k: 32 * k + 32]]
        if differing:
            raise DistributedError(f"{what} differs between process 0 and process {i}, first at "
                                   f"{path_name(flat[differing[0]][0]) or 'its root'} ({len(differing)} array(s) differ): "
                                   "every process must hold the same values")


def barrier(name: str):
    """Every process waits here until all have arrived (no-op in one process)."""
    if is_multiprocess():
        multihost_utils.sync_global_devices(name)


def any_process(flag: bool, devices=None) -> bool:
    """True on every process when ``flag`` is True on any: the all-reduce before the first
    step that makes a SIGTERM seen by one process stop all of them (the step boundaries use
    ``any_process_later``). Waits for the devices to finish the work queued before it.
    ``devices``: the run's, see ``any_process_later``."""
    return _queued_vote(flag, devices)()


@functools.cache
def _vote_program(devices):
    """The layout of one int32 vote per process over ``devices`` (a tuple, in any order; None:
    every device), one row of the mesh per process, and the compiled max over the votes.

    A vote over devices the run leaves out (``--devices N`` below a host's count) queues
    collectives on them beside the train step's on the others; XLA:CPU's gloo collectives then
    receive one program's data for another's and abort ("collective mismatch"): the votes run
    on the run's devices and no other."""
    ordered = sorted(jax.devices() if devices is None else devices, key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(ordered, dtype=object).reshape(jax.process_count(), -1), ("processes", "local"))
    return NamedSharding(mesh, P("processes")), jax.jit(jnp.max, out_shardings=NamedSharding(mesh, P()))


def any_process_later(flag: bool, devices=None):
    """``any_process`` without the wait: the all-reduce is queued now, behind the work already
    queued on the devices, and the function returned reads its result (True on every process
    when ``flag`` was True on any). ``any_process`` returns only when the devices have finished
    everything queued before it, so at every step boundary it kept the host from preparing the
    next step while the devices ran this one. Every process must call it at the same points,
    with the same ``devices``: the run's, as a tuple (``tuple(mesh.devices.flat)``, made once
    per run: the vote's program is cached by it); None: every device."""
    return _queued_vote(flag, devices)


def _queued_vote(flag, devices=None):
    """The all-reduce of ``flag`` over the processes, queued; returns its reader."""
    if not is_multiprocess():
        value = bool(flag)
        return lambda: value
    votes, anyone = _vote_program(devices)
    result = anyone(jax.make_array_from_process_local_data(votes, np.array([int(flag)], np.int32)))
    return lambda: bool(np.asarray(result.addressable_data(0)))


SHARED_CHECK_NAME = ".shared-directory-check"


def agree_on_shared_directory(path):
    """Refuse to train when ``path`` (--out) is not one directory that every process sees.

    orbax writes a checkpoint from every process into one directory and waits (10 minutes,
    beyond --distributed-timeout) for all of them: with a directory per host the first save
    hangs, then aborts every process, and the steps before it are lost. Process 0 writes a
    random token there; every process reads it back; all refuse together, naming the
    processes that did not see it."""
    if not is_multiprocess():
        return
    probe = Path(path) / SHARED_CHECK_NAME
    token = b""
    if is_main():
        token = os.urandom(16).hex().encode()
        probe.write_bytes(token)
    written = allgather_bytes(token)[0]  # also a barrier: process 0 has written the token
    try:
        seen = probe.read_bytes()
    except OSError:
        seen = b""
    verdicts = allgather_bytes(b"1" if seen == written else b"0")
    if is_main():
        probe.unlink(missing_ok=True)
    blind = [str(i) for i, v in enumerate(verdicts) if v != b"1"]
    if blind:
        raise DistributedError(f"--out {path}: process(es) {', '.join(blind)} do not see the run directory that "
                               f"process 0 writes: --out must be one directory shared by every process (a shared "
                               f"file system), or no checkpoint could complete")


def all_started(error: Exception | None):
    """A barrier where each process brings its start-up error, if any (its options or files,
    then process 0's writing or refusing the run directory): when any process failed, every
    process raises, so none waits alone in a collective that never completes."""
    if not is_multiprocess():
        if error is not None:
            raise error
        return
    failed = np.asarray(allgather_bytes(b"1" if error is not None else b"0")) == b"1"
    if error is not None:
        raise error
    if failed.any():
        who = ", ".join(str(i) for i in np.flatnonzero(failed))
        raise DistributedError(f"process(es) {who} could not start the run (see their error); stopping")
