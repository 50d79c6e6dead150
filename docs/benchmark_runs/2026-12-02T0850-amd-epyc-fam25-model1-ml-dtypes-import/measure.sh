#!/bin/bash
# Paired, in turn: a process's imports of the CLI's libraries and JAX's CPU backend, with
# ml_dtypes 0.7.0 (installed to /tmp/mld07, put first on PYTHONPATH) and 0.6.0 (the venv's).
cd /tmp
. /work/main/.venv/bin/activate
S='import time; t=time.perf_counter(); import ml_dtypes; m=time.perf_counter()-t; import jax, flax.nnx, optax, orbax.checkpoint, tokenizers; jax.devices(); import resource; r=resource.getrusage(resource.RUSAGE_SELF); print(f"ml_dtypes {ml_dtypes.__version__} import {m:.3f} s; whole start {time.perf_counter()-t:.3f} s wall, {r.ru_utime+r.ru_stime:.3f} s CPU")'
for i in 1 2 3 4 5; do
  PYTHONPATH=/tmp/mld07 python -c "$S"
  python -c "$S"
done
