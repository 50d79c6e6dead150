#!/bin/bash
cd /tmp/readmeZ
echo "commit $(git log --oneline -1)"; date -u
/usr/bin/time -f "setup+main: %e s wall %U user %S sys" bash -c 'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e ".[dev]" && flaxformer-mini train --task reverse --schedule cosine --out runs/reverse' > /tmp/readmeZ_setup.log 2>&1
echo "setup rc $?"; tail -5 /tmp/readmeZ_setup.log
. .venv/bin/activate
pip list 2>/dev/null | grep -i ml.dtypes
echo "5 3 9 2 7" | flaxformer-mini generate --checkpoint runs/reverse 2>&1 | tail -2
date -u
/usr/bin/time -f "tests: %e s wall %U user %S sys" python -m pytest -n 2 2>&1 | tail -6
echo "tests rc $?"; date -u
