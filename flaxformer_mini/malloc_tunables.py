"""Restart the process with glibc's malloc tunables set so freed host memory is kept.

XLA:CPU allocates a compiled call's temporaries afresh on every execution (hundreds of MB for
the base benchmark's train step: docs/benchmarks.md). glibc serves blocks that large with ``mmap`` and returns
them with ``munmap``, so every step page-faults them in again. glibc's documented tunables
(glibc manual, "Memory Allocation Tunables") turn that off:

- ``glibc.malloc.mmap_max=0``: no mmap'd blocks; large blocks come from the heap;
- ``glibc.malloc.arena_max=1``: one arena, so XLA's threads do not mmap heaps of their own;
- ``glibc.malloc.trim_threshold=<2**31-1>``: never shrink the heap.

Tunables are read once, when the process starts, so ``restart_keeping_freed_memory()``
re-executes the current command line with ``GLIBC_TUNABLES`` set (once: an environment
marker stops a second restart). ``flaxformer-mini train`` takes it with ``--keep-freed-memory``
(one arena for every thread costs small models more than the page faults it saves: figures in
docs/benchmarks.md); ``python -m benchmarks`` and ``python -m benchmarks.scaling`` take it unless
``FLAXFORMER_MINI_KEEP_FREED_MEMORY=0``. Or start Python with the variable set
yourself: ``GLIBC_TUNABLES=$(python -c "from flaxformer_mini.malloc_tunables import
KEEP_FREED_MEMORY; print(KEEP_FREED_MEMORY)") python ...``.
"""

import os
import sys

KEEP_FREED_MEMORY = "glibc.malloc.mmap_max=0:glibc.malloc.arena_max=1:glibc.malloc.trim_threshold=2147483647"
ENV_SWITCH = "FLAXFORMER_MINI_KEEP_FREED_MEMORY"  # "0" turns the restart off everywhere
_RESTARTED = "FLAXFORMER_MINI_MALLOC_RESTARTED"


def keeping_freed_memory():
    """Whether this process started with the tunables of ``KEEP_FREED_MEMORY``."""
    current = os.environ.get("GLIBC_TUNABLES", "").split(":")
    return all(setting in current for setting in KEEP_FREED_MEMORY.split(":"))


def restart_keeping_freed_memory():
    """Re-execute this command with ``GLIBC_TUNABLES`` extended by ``KEEP_FREED_MEMORY``.

    Returns (without restarting) True if the tunables are already in force, False where they
    do not apply: not Linux/glibc, turned off by ``FLAXFORMER_MINI_KEEP_FREED_MEMORY=0``, or
    already restarted once. Call it first thing: the process is replaced, output not yet
    flushed is lost.
    """
    if keeping_freed_memory():
        return True
    if (not sys.platform.startswith("linux") or os.environ.get(ENV_SWITCH, "1") == "0"
            or os.environ.get(_RESTARTED) or not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")):
        return False
    env = dict(os.environ, **{_RESTARTED: "1"})
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES"), KEEP_FREED_MEMORY]))
    sys.stdout.flush()
    sys.stderr.flush()
    # sys.orig_argv is the interpreter's own command line (-m module, script, options).
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
