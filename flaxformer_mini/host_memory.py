"""Keep freed host memory in the process, so XLA:CPU's per-call temporaries stop page-faulting.

XLA:CPU allocates a compiled call's temporaries afresh on every execution: 645 MB for the
base preset's train step (``benchmarks/``). glibc's malloc serves a block that large with
``mmap`` and hands it back to the kernel with ``munmap`` on ``free``, and XLA's executor
threads each get their own malloc arena, which ``mmap``s too. So every train step touched
~175,000 fresh 4 KiB pages, and on this 2-core VM the kernel time that cost was 200-650 ms
per step (the ``sys ms`` column of ``python -m benchmarks``).

``keep_freed_memory()`` tells glibc, through ``mallopt``, to serve every block from one
``brk`` heap and never to shrink it: the second step reuses the first step's pages. The
process's resident memory then stays at its peak (the train step's temporaries: about the
size of the model's state again), which a training process reaches anyway.

The price is one malloc arena for every thread: allocations that threads used to make in
arenas of their own now take turns on one lock. For small models, whose steps are many
short XLA calls, that costs more than the page faults it saves: the README's main job
(width 64, 3000 steps) took 75 s with it and 47 s without (measured 2026-11-21, this
2-core CPU). The base preset's train step (645 MB of temporaries) went from 917 to
733-743 ms per step with it. Hence opt-in: ``flaxformer-mini train --keep-freed-memory``,
or a call first thing in your own script; ``python -m benchmarks`` calls it (its
``environment`` line says so). ``FLAXFORMER_MINI_KEEP_FREED_MEMORY=0`` turns it off
everywhere. One arena is the setting that matters: a thread arena ``mmap``s any block
beyond its 64 MB heap whatever the settings, and with glibc's default number of arenas,
or with 4, the base train step still page-faulted in some runs (320-470 ms of kernel
time per step).

It is the in-process equivalent of starting Python with
``GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.arena_max=1:glibc.malloc.trim_threshold=2147483647``
and a lighter alternative to preloading tcmalloc or jemalloc, which PyPI does not ship.
Call it at start-up, before the first JAX computation starts XLA's threads (the arena
limit applies to threads that have not allocated yet). A library import never changes the
allocator by itself.
"""

import ctypes
import ctypes.util
import os

# mallopt parameter numbers, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8

ENV_SWITCH = "FLAXFORMER_MINI_KEEP_FREED_MEMORY"
_INT_MAX = 2**31 - 1

_applied = None


def keep_freed_memory():
    """Configure glibc malloc to reuse freed memory. Returns True if applied, False where it
    does not apply (not glibc, e.g. macOS or musl; or turned off by the environment)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name)
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False  # mallopt's parameters are glibc's; other C libraries differ or lack it
    settings = (
        (M_MMAP_MAX, 0),  # no mmap'd blocks: large blocks come from the heap and stay there
        (M_ARENA_MAX, 1),  # one arena: thread arenas would mmap their own heaps
        (M_TRIM_THRESHOLD, _INT_MAX),  # never give the top of the heap back to the kernel
    )
    # mallopt returns 1 on success and 0 on error.
    _applied = all(libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1 for param, value in settings)
    return _applied


def applied():
    """Whether ``keep_freed_memory()`` has changed this process's allocator."""
    return bool(_applied)
