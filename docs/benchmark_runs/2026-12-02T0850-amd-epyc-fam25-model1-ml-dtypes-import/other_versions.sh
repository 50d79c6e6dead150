#!/bin/bash
# ml_dtypes' import alone (numpy imported before the timing) in a separate virtual environment
# (/tmp/mldv: numpy and ml_dtypes only), for three ml_dtypes releases and two numpy releases.
S='import time, numpy; t=time.perf_counter(); import ml_dtypes; print(f"numpy {numpy.__version__} ml_dtypes {ml_dtypes.__version__}: {time.perf_counter()-t:.4f} s")'
for np in 2.4.6 2.3.5; do
  /tmp/mldv/bin/pip install -q "numpy==$np"
  for v in 0.5.4 0.6.0 0.7.0; do
    /tmp/mldv/bin/pip install -q --no-deps /tmp/mld/ml_dtypes-$v-*.whl
    /tmp/mldv/bin/python -c "$S"; /tmp/mldv/bin/python -c "$S"
  done
done
