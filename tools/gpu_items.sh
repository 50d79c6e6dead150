#!/usr/bin/env bash
# The GPU items of issue 14, one command each, for a machine lent through the `device` tool
# (docs/benchmarks.md, "GPU": what each item measures and where its results go).
#
# Here, once, before the first run (the image lacks these two; nothing can be fetched there):
#     bash tools/gpu_items.sh wheels
# Then, on the GPU machine, one call each (each well inside the tool's 10 minutes a call),
# with `.whl` in the call's carry:
#     bash tools/gpu_items.sh parity    # (a) the parity suite, torch CUDA against JAX GPU, TF32 off
#     bash tools/gpu_items.sh bench     # (b) the `large` preset in bfloat16, cuDNN attention
#     bash tools/gpu_items.sh train     # (c) the main job in bfloat16
# Everything each writes is under $OUT (or ./gpu_out where OUT is unset), logs included.
set -euo pipefail
cd "$(dirname "$0")/.."
item=${1:?usage: bash tools/gpu_items.sh wheels|parity|bench|train}
case "$item" in wheels | parity | bench | train) ;; *) echo "unknown item $item: wheels, parity, bench or train" >&2; exit 2 ;; esac
out=${OUT:-gpu_out}
mkdir -p "$out"

if [ "$item" = wheels ]; then
    # The versions this project is tested with; the machine's Python is 3.12 (device KINDS.md).
    mkdir -p .git/info .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    for pkg in tensorboardX rapidfuzz; do
        version=$(python3 -m pip show "$pkg" | awk '/^Version:/ {print $2}')
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d .whl "$pkg==$version"
    done
    ls -l .whl
    exit 0
fi

if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    python3 -c 'import jax, flax, optax, torch; print("jax", jax.__version__, jax.devices(), "| flax", flax.__version__,
"| optax", optax.__version__, "| torch", torch.__version__, "cuda", torch.version.cuda)'
} 2>&1 | tee "$out/machine.txt"

case "$item" in
parity)
    # -p no:cacheprovider: nothing written into the tree; -x: the first failure is the one to read.
    python3 -m pytest -m parity --torch-device cuda -p no:cacheprovider -x -q \
        --junitxml="$out/parity.xml" 2>&1 | tee "$out/parity.log"
    ;;
bench)
    python3 -m benchmarks --preset large --json "$out/large.json" 2>&1 | tee "$out/large.log"
    ;;
train)
    rm -rf /tmp/gpu_reverse
    { time python3 -m flaxformer_mini train --task reverse --dtype bfloat16 --out /tmp/gpu_reverse; } \
        2>&1 | tee "$out/train.log"
    cp /tmp/gpu_reverse/metrics.jsonl /tmp/gpu_reverse/config.json /tmp/gpu_reverse/loss.png "$out/"
    ;;
esac
