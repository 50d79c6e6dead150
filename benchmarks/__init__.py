"""Side-by-side speed of torch_ref (eager and torch.compile) and flaxformer_mini (jax.jit).

``python -m benchmarks [--preset base] [--json OUT]`` times, in one process, after warm-up,
the median of several repetitions of the forward pass (eval mode), the training step
(forward, backward, Adam) and greedy decoding of N new tokens, for every path on the same
configuration and the same seeded inputs; measures this machine's matmul peak with each
library; and prints achieved FLOP/s, the fraction of that peak, first-call (compile)
overhead and peak memory, then the torch/Flax ratios of the run. ``docs/benchmarks.md``
holds the runs, the machines they ran on and the targets.

One concept per module:

    presets.py      named settings (base, tiny, large)
    inputs.py       the seeded batch both libraries read
    flops.py        analytic FLOP counts (the formula is documented there)
    matmul_peak.py  the machine's matmul throughput per library
    measure.py      timing protocol (interleaved repetitions, median) and memory probes
    torch_bench.py  torch_ref paths: eager and torch.compile
    flax_bench.py   flaxformer_mini paths: jax.jit
    runner.py       one run: environment, peaks, every operation
    report.py       JSON document, printed table, targets
    machine.py      where a figure holds: CPU, ISA extensions, cores, versions, GEMM backends
    scaling.py      ``python -m benchmarks.scaling``: cost against length, batch and depth
    train_parity.py ``python -m benchmarks.train_parity``: whole training runs of both twins, from
                    the same weights on the same batches: curves, held-out WER, time to target

Investigation scripts (an XLA profile, ablations) are in ``tools/``, outside the product.

Benchmarks are not tests: nothing here asserts a speed. ``tests/test_benchmarks.py`` only
checks that a tiny run completes and reports well-formed numbers.
"""
