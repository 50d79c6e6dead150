"""One benchmark run: environment, matmul peaks, then each operation's paths, interleaved.

``run(preset, ...)`` returns the report as a dict (the ``--json`` document); the models of
one operation are built just before it is measured and dropped after, so the memory each
operation reports is not mixed with another's.
"""

import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time

import jax

from benchmarks import flax_bench, machine, matmul_peak, report
from benchmarks.code_version import code_version
from benchmarks.inputs import make_batch
from benchmarks.measure import log, measure
from flaxformer_mini import malloc_tunables

OPS = ("forward", "train_step", "decode_cached", "decode_uncached")
# Uncached decoding (seed 001's inference: the whole prefix again for every token) takes
# seconds a call and is not how anyone decodes; it runs on request (--ops).
DEFAULT_OPS = ("forward", "train_step", "decode_cached")
VARIANTS = ("torch_eager", "torch_compile", "flax_jit")
TORCH_VARIANTS = ("torch_eager", "torch_compile")


def environment():
    """The machine (benchmarks.machine), the code (``code_version``) and the settings that
    change the numbers."""
    env = {
        "date_utc": machine.date_utc(),
        "machine": machine.describe(),
        "code": code_version(),
        # glibc's allocator: without the tunables the Flax train step page-faults its
        # temporaries in on every call (flaxformer_mini/malloc_tunables.py).
        "keep_freed_memory": malloc_tunables.keeping_freed_memory(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", ""),
        "JAX_DEFAULT_PRNG_IMPL": os.environ.get("JAX_DEFAULT_PRNG_IMPL", ""),
        "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", ""),
    }
    return env


def share_gpu_with_torch(preset, torch_variants):
    """Keep JAX from taking three quarters of the GPU's memory when torch runs beside it.

    JAX's GPU client preallocates 75% of the device's memory when its backend starts (torch's
    caching allocator takes memory as it needs it). With both libraries in one process, the
    torch paths get the quarter left: on an 80 GB H100 the `large` preset's torch eager train
    step (about 21 GB) ran out of memory behind JAX's 60 GB. XLA_PYTHON_CLIENT_PREALLOCATE=false
    makes JAX allocate as it goes; it is read once, when the backend starts, so it is set
    before anything here touches a device. A value the user set is kept.
    """
    if preset.device != "gpu" or not torch_variants or "XLA_PYTHON_CLIENT_PREALLOCATE" in os.environ:
        return
    from jax._src import xla_bridge  # no public API says whether the backends have started

    if getattr(xla_bridge, "backends_are_initialized", lambda: False)():
        log("warning: JAX's backend started before the benchmark and may hold 75% of the GPU's memory; "
            "set XLA_PYTHON_CLIENT_PREALLOCATE=false to leave the torch paths theirs")
        return
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def check_device(preset, force):
    if preset.device != "gpu":
        return
    if jax.default_backend() != "gpu" and not force:
        raise SystemExit(f"preset {preset.name!r} is for a GPU and JAX sees none ({jax.default_backend()}); "
                         "--force runs it anyway")


@contextlib.contextmanager
def fresh_compile_caches(enabled=True):
    """An empty inductor cache for this run, removed afterwards.

    torch.compile keeps compiled graphs on disk (/tmp/torchinductor_$USER) and reuses them
    across processes: a second run of the same model compiles in a fraction of the time.
    The first-call times here are those of a first run, as a user meets them. (JAX keeps
    no persistent compilation cache unless ``jax_compilation_cache_dir`` is set.)
    """
    if not enabled:
        yield None
        return
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    path = tempfile.mkdtemp(prefix="benchmarks-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
        shutil.rmtree(path, ignore_errors=True)


def run(preset, ops=DEFAULT_OPS, variants=VARIANTS, force=False, fresh_caches=True, progress=None):
    """The whole benchmark of ``preset``; see the package docstring. ``fresh_caches=False``
    lets torch.compile reuse what earlier runs left in its on-disk cache. ``progress(report)``,
    if given, gets the report so far (``"complete": False``) after each operation: a run cut
    short (a GPU lent for minutes, a compile that outlasts them) keeps what it measured."""
    with fresh_compile_caches(fresh_caches):
        return _run(preset, ops, variants, force, fresh_caches, progress)


def _run(preset, ops, variants, force, fresh_caches, progress):
    ops = [op for op in OPS if op in ops]
    variants = [v for v in VARIANTS if v in variants]
    torch_variants = [v for v in variants if v in TORCH_VARIANTS]
    share_gpu_with_torch(preset, torch_variants)
    check_device(preset, force)
    started = time.perf_counter()
    load = {"start": _loadavg()}
    log(f"preset {preset.summary()}; load average {load['start']}")

    if torch_variants:
        from benchmarks import torch_bench  # torch is optional: a Flax-only run needs none

        torch_bench.setup_threads()
    env = environment()
    env["torch_compile_cache"] = "fresh (empty) for this run" if fresh_caches else "reused from earlier runs"
    env["jax_compilation_cache_dir"] = jax.config.jax_compilation_cache_dir
    batch = make_batch(preset)

    peaks = {}
    if torch_variants:
        peaks["torch"] = matmul_peak.torch_peak(preset.matmul_size, preset.dtype,
                                                "cuda" if preset.device == "gpu" else "cpu")
    if "flax_jit" in variants:
        peaks["jax"] = matmul_peak.jax_peak(preset.matmul_size, preset.dtype)

    results = []
    for op in ops:
        decoding = op.startswith("decode")
        reps, warmup = (preset.decode_reps, preset.decode_warmup) if decoding else (preset.reps, preset.warmup)
        paths = []
        if torch_variants:
            paths += torch_bench.make_paths(preset, batch, [op], torch_variants)
        if "flax_jit" in variants:
            paths += flax_bench.make_paths(preset, batch, [op])
        if not paths:
            continue
        results += measure(paths, reps=reps, warmup=warmup)
        del paths
        gc.collect()
        load[f"after_{op}"] = _loadavg()
        log(f"{op} done; load average {load[f'after_{op}']}")
        if progress is not None:
            progress(report.build(preset, env, peaks, results, dict(load), time.perf_counter() - started,
                                  argv=sys.argv, complete=False))

    load["end"] = _loadavg()
    wall = time.perf_counter() - started
    return report.build(preset, env, peaks, results, load, wall, argv=sys.argv)
