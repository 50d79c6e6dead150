"""Python's cyclic garbage collector, run rarely while a command works.

Tracing, lowering and compiling a JAX program allocate container objects by the hundred
thousand, most of them freed by reference counting alone. At CPython's default thresholds
(700, 10, 10) the collector still walks the survivors hundreds of times while a run starts
and compiles (docs/benchmarks.md, "Python's collector in a command"). Training frameworks
manage the collector too (torchtitan's ``gc_freq``, OLMo-core's garbage-collector callback);
here the thresholds are raised for the command's duration: garbage in cycles is still
collected, later, and everything else is freed by reference counting at once.
"""

import contextlib
import gc

# A young collection every 100,000 net allocations instead of 700; the older generations keep
# their relative pace. The pytest workers run at the same thresholds (tests/conftest.py).
THRESHOLDS = (100_000, 50, 100)


@contextlib.contextmanager
def collecting_rarely():
    """Raise the collector's thresholds to at least ``THRESHOLDS`` inside the block, and give
    back the caller's on the way out (a command run inside a notebook or a test process leaves
    that process's collector as it was)."""
    kept = gc.get_threshold()
    gc.set_threshold(*(max(now, rare) for now, rare in zip(kept, THRESHOLDS)))
    try:
        yield
    finally:
        gc.set_threshold(*kept)
