cd /tmp/readmeZ
date -u
/usr/bin/time -f "setup+main: %e s wall %U user %S sys" bash -c 'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e ".[dev]" && flaxformer-mini train --task reverse --schedule cosine --out runs/reverse'
echo "rc1 $?"
. .venv/bin/activate
/usr/bin/time -f "tests: %e s wall %U user %S sys" python -m pytest -n 2
echo "rc2 $?"
date -u
