#!/bin/bash
# In turn: one CLI-heavy test file with ml_dtypes 0.7.0 first on PYTHONPATH (inherited by
# every process the tests start), then with the virtual environment's 0.6.0; three pairs.
cd /work/main && . .venv/bin/activate
for i in 1 2 3; do
  for arm in 0.7.0 0.6.0; do
    if [ $arm = 0.7.0 ]; then export PYTHONPATH=/tmp/mld07; else unset PYTHONPATH; fi
    /usr/bin/time -f "ml_dtypes $arm: %e s wall %U user %S sys" python -m pytest -q -n 0 -p no:cacheprovider tests/test_multiprocess_faults.py 2>&1 | grep -E "passed|failed|ml_dtypes"
  done
done
