"""How every path is timed and how its memory is read, the same way for torch and JAX.

A ``Path`` is one thing to time (an operation run by one library in one mode), given as a
``run()`` callable that returns only when the work is done: JAX paths end with
``block_until_ready``, torch paths with a value read back on the host (``loss.item()``)
or, on a GPU, ``torch.cuda.synchronize()``.

``measure(paths, ...)``, for the paths of one operation:

1. first call: ``prepare()`` (compilation ahead of time, where the path has one) and one
   ``run()``, timed together with ``time.perf_counter``. Its excess over the steady-state
   median is reported as the first-call overhead (tracing, compilation, autotuning, cold
   caches);
2. ``warmup`` untimed calls;
3. ``reps`` rounds; each round runs every path once, in a rotating order, after a short
   pause. Interleaving makes the ratios between paths robust to a slow drift of the
   machine's load (other processes): each path sees the same mix of quiet and busy moments;
4. one untimed call with memory measurement (``probe``); for calls of seconds, the last
   timed repetition is measured instead (see ``LONG_CALL_S``).

After every round but the last, the medians so far go to the log (stderr): a run stopped by
a time limit (a lent GPU's minutes) leaves what it had measured.

The median of the timed calls is the reported time; the fastest one is reported too (on a
machine shared with other work it is the least disturbed call).
"""

import ctypes
import dataclasses
import gc
import os
import resource
import statistics
import sys
import time
from typing import Callable

# Between two timed calls: lets the previous call's worker threads (OpenMP, XLA's Eigen pool)
# stop spinning before the next path starts, so one path does not run while the other's
# threads still hold the cores.
PAUSE_S = 0.05
# Calls longer than this (decoding without a cache: seconds) get their memory read during
# their last timed repetition rather than in a call of their own, which would cost the run
# tens of seconds.
LONG_CALL_S = 3.0


@dataclasses.dataclass
class Path:
    op: str  # "forward", "train_step", "decode_cached", "decode_uncached"
    variant: str  # "torch_eager", "torch_compile", "flax_jit"
    library: str  # "torch" or "jax": whose matmul peak the path is compared with
    run: Callable[[], object]
    flops: float  # FLOPs one call executes (benchmarks.flops)
    prepare: Callable[[], object] | None = None  # once, before the first run, timed with it
    probe: Callable[[Callable[[], object]], dict] | None = None  # memory of one run()
    notes: list = dataclasses.field(default_factory=list)
    info: dict = dataclasses.field(default_factory=dict)  # anything else for the JSON
    after: Callable[[], dict] | None = None  # called after the timed calls, merged into info
    check: Callable[[object], None] | None = None  # raises if the first call's output is unusable


@dataclasses.dataclass
class Result:
    op: str
    variant: str
    library: str
    flops: float
    first_call_s: float
    times_s: list
    memory: dict
    notes: list
    info: dict

    @property
    def median_s(self):
        return statistics.median(self.times_s)

    @property
    def best_s(self):
        return min(self.times_s)

    @property
    def first_call_overhead_s(self):
        return max(self.first_call_s - self.median_s, 0.0)

    @property
    def gflops_per_s(self):
        return self.flops / self.median_s / 1e9


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure(paths, reps, warmup, pause_s=PAUSE_S):
    """Results of ``paths`` (see the module docstring), in the order given."""
    first = {}
    for p in paths:
        gc.collect()
        log(f"{p.op}: {p.variant}: first call (compiles where it compiles) ...")
        start = time.perf_counter()
        if p.prepare is not None:
            p.prepare()
        out = p.run()
        first[id(p)] = time.perf_counter() - start
        if p.check is not None:
            p.check(out)
        log(f"{p.op}: {p.variant}: first call {first[id(p)]:.2f} s")
        for _ in range(warmup):
            p.run()

    times = {id(p): [] for p in paths}
    cpu = {id(p): [] for p in paths}
    faults = {id(p): [] for p in paths}  # (minor page faults, system CPU seconds) per call
    memory = {}

    def median_ms(p):
        return statistics.median(times[id(p)]) * 1e3

    # A long call's memory is read during its last timed repetition instead of an extra call
    # (the probe's gc and malloc_trim run before the timer starts; what remains is the page
    # faults of memory handed back, well under 1% of a call of seconds).
    def long_call(p):
        so_far = times[id(p)] or [first[id(p)]]
        return statistics.median(so_far) > LONG_CALL_S

    for r in range(reps):
        k = r % len(paths)
        for p in paths[k:] + paths[:k]:

            def timed(p=p):
                usage = resource.getrusage(resource.RUSAGE_SELF)
                start, start_cpu = time.perf_counter(), time.process_time()
                out = p.run()
                times[id(p)].append(time.perf_counter() - start)
                cpu[id(p)].append(time.process_time() - start_cpu)
                after = resource.getrusage(resource.RUSAGE_SELF)
                faults[id(p)].append((after.ru_minflt - usage.ru_minflt, after.ru_stime - usage.ru_stime))
                return out

            time.sleep(pause_s)
            if r == reps - 1 and long_call(p):
                memory[id(p)] = (p.probe or rss_probe)(timed)
            else:
                timed()
        if r < reps - 1:
            log(f"round {r + 1}/{reps}, medians so far: "
                + ", ".join(f"{p.op} {p.variant} {median_ms(p):.1f} ms" for p in paths))
    for p in paths:
        log(f"{p.op}: {p.variant}: median {median_ms(p):.1f} ms over {reps}")

    results = []
    for p in paths:
        if id(p) not in memory:
            memory[id(p)] = (p.probe or rss_probe)(p.run)
        info = dict(p.info)
        if p.after is not None:
            info.update(p.after())
        # cores kept busy: process CPU time / wall time of each timed call (threads that
        # spin-wait count as busy). Well below the core count on an idle machine: the path
        # leaves cores unused; on a loaded one: it was starved.
        info["cores_busy"] = statistics.median(c / t for c, t in zip(cpu[id(p)], times[id(p)]))
        # Page faults: memory the call touched for the first time (fresh allocations the
        # allocator got from the kernel). System time: the kernel's share (mostly those faults).
        info["minor_faults_per_call"] = statistics.median(f for f, _ in faults[id(p)])
        info["system_ms_per_call"] = statistics.median(s for _, s in faults[id(p)]) * 1e3
        results.append(Result(p.op, p.variant, p.library, p.flops, first[id(p)], times[id(p)], memory[id(p)],
                              list(p.notes), info))
    return results


# --- memory --------------------------------------------------------------------------------

def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss():
    """Reset the kernel's high-water mark of this process's resident set (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _malloc_trim():
    # Hand freed heap memory back to the OS, so that what a call needs shows up as new
    # resident memory instead of being served from pages an earlier call left behind.
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_probe(run):
    """Peak resident memory of one call above the resident memory just before it.

    That is the call's transient working memory (activations, gradients, temporaries,
    workspace), not the parameters and optimizer state it keeps between calls (those are
    resident already; a path reports them as ``state_mb``). Linux only: reads VmHWM after
    resetting it through /proc/self/clear_refs; where that is not possible, None.
    """
    gc.collect()
    _malloc_trim()
    if not os.path.exists("/proc/self/status") or not _reset_peak_rss():
        run()
        return {"peak_rss_delta_mb": None, "method": "unavailable (needs Linux /proc/self/clear_refs)"}
    before = _status_kb("VmRSS")
    run()
    peak = _status_kb("VmHWM")
    return {"peak_rss_delta_mb": (peak - before) / 1024, "rss_before_mb": before / 1024,
            "method": "VmHWM during one call - VmRSS before it, after malloc_trim"}
