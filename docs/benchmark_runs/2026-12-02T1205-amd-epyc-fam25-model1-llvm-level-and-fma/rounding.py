"""jax.random's numbers at XLA:CPU's LLVM optimisation level 0 (the test suite's) and at the
default level (a user's): run from the repository root,

    python docs/benchmark_runs/2026-12-02T1205-amd-epyc-fam25-model1-llvm-level-and-fma/rounding.py

Each level runs in a process of its own (XLA reads XLA_FLAGS once). For the scaled uniform, both
roundings of ``x * (hi - lo) + lo`` are computed in numpy from the unscaled draws (equal at both
levels): one rounding per operation, or one for the whole expression (a fused multiply-add).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

DRAW = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
k = jax.random.key(0)
np.save(sys.argv[1], np.stack([np.asarray(jax.random.uniform(k, (1000,), jnp.float32)),
                               np.asarray(jax.random.uniform(k, (1000,), jnp.float32, -0.1, 0.1)),
                               np.asarray(jax.random.normal(k, (1000,), jnp.float32))]))
"""


def draws(xla_flags):
    path = os.path.join(tempfile.mkdtemp(), "draws.npy")
    subprocess.run([sys.executable, "-c", DRAW, path], check=True, env=dict(os.environ, XLA_FLAGS=xla_flags))
    return np.load(path)


def main():
    level0, default = draws("--xla_backend_optimization_level=0"), draws("")
    names = ["uniform [0, 1)", "uniform [-0.1, 0.1)", "normal"]
    for name, a, b in zip(names, level0, default):
        differ = a != b
        print(f"{name}: {differ.sum()} of {a.size} values differ between level 0 and the default level, "
              f"largest difference {np.abs(a - b).max():.3g}")
    x, lo, hi = level0[0], np.float32(-0.1), np.float32(0.1)
    separate = (x * (hi - lo)).astype(np.float32) + lo
    fused = (x.astype(np.float64) * np.float64(hi - lo) + np.float64(lo)).astype(np.float32)
    for label, values in (("level 0", level0[1]), ("default level", default[1])):
        print(f"uniform [-0.1, 0.1) at {label}: {np.mean(values == separate):.2f} equal to a rounding per "
              f"operation, {np.mean(values == fused):.2f} to a fused multiply-add")


if __name__ == "__main__":
    main()
