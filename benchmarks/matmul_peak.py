"""The machine's matmul throughput, measured with each library: square n x n products.

A large square matmul is about the best case for either library's GEMM (on CPU: MKL for
torch, XLA's CPU GEMM (YNNPACK) for JAX), so its rate is the ceiling a model's achieved
FLOP/s is compared with. "Same library": a torch path is compared with torch's peak, a
JAX path with JAX's, because the two GEMMs differ a lot on some CPUs (docs/benchmarks.md,
"Machines measured"); the report also gives each path's share of the better library's peak.

Two sizes, n/2 and n: on some CPUs the rate drops between them (the operands leave the
caches; docs/benchmarks.md has the figures), and the model's own GEMMs (1024 x 512 x 512)
run at the higher rate, so n alone would understate the ceiling and flatter every path's
fraction of it. The peak is the best of ``reps`` timed products at the best size (the
medians are reported too): a peak is a ceiling, and on a loaded machine the best
repetition is the least disturbed one.
"""

import statistics
import time

from benchmarks.measure import log


def sizes(n):
    return sorted({max(n // 2, 1), n})


def _summary(library, n, dtype, times):
    flop = 2.0 * n**3
    return {
        "library": library, "n": n, "dtype": dtype,
        "best_gflops": flop / min(times) / 1e9,
        "median_gflops": flop / statistics.median(times) / 1e9,
        "times_s": times,
    }


def _best(library, dtype, per_size):
    best = max(per_size, key=lambda r: r["best_gflops"])
    log(f"matmul peak {library} {dtype}: " + ", ".join(f"{r['n']}^2 {r['best_gflops']:.0f}" for r in per_size)
        + " GFLOP/s")
    return {**best, "sizes": per_size}


def torch_peak(n, dtype="float32", device="cpu", reps=5):
    return _best("torch", dtype, [_torch_one(m, dtype, device, reps) for m in sizes(n)])


def jax_peak(n, dtype="float32", reps=5):
    return _best("jax", dtype, [_jax_one(m, dtype, reps) for m in sizes(n)])


def _torch_one(n, dtype, device, reps):
    import torch

    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=torch_dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=torch_dtype)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    with torch.no_grad():
        torch.mm(a, b)  # warm-up: thread pool, workspace
        sync()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            torch.mm(a, b)
            sync()
            times.append(time.perf_counter() - start)
    return _summary("torch", n, dtype, times)


def _jax_one(n, dtype, reps):
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.random.normal(k1, (n, n), getattr(jnp, dtype))
    b = jax.random.normal(k2, (n, n), getattr(jnp, dtype))
    mm = jax.jit(jnp.matmul)
    mm(a, b).block_until_ready()  # compile + warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        mm(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return _summary("jax", n, dtype, times)
