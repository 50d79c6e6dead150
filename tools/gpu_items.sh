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
#     bash tools/gpu_items.sh check     # `parity check --torch-device cuda` (the command) on the GPU
#     bash tools/gpu_items.sh profile   # where the large train step's time goes (tools.xla_profile)
#     bash tools/gpu_items.sh ablations # what each part of it costs (tools.ablations)
#     bash tools/gpu_items.sh ablate    # issue 48's ablations of the large train step (tools.ablations, budgeted)
#     bash tools/gpu_items.sh bfloat16  # the Flax twin in bfloat16 against torch in float32, by layer (parity.bfloat16)
#     bash tools/gpu_items.sh determinism  # exact resume on a GPU: the resume tests with and without XLA:GPU's
#                                          # deterministic ops, and what they cost the large train step
# or several in one call, each under its own time limit (the tool lends 15 minutes of device
# time in all, the machine's start included, so one call of under 10 minutes is the safe plan):
#     bash tools/gpu_items.sh all       # train, parity, bench (Flax and torch eager), bench_decode,
#                                       # bench_compile (torch.compile)
#     GPU_ITEMS="profile ablations" LIMIT_ABLATIONS=300 bash tools/gpu_items.sh all  # what is still open
#     GPU_ITEMS="parity bench" bash tools/gpu_items.sh all   # some of them
# Issue 48 in one call of about 7-9 minutes (docs/benchmarks.md, "Running the GPU items": the
# exact `run` call), JAX's persistent compilation cache shared by its items and their processes:
#     bash tools/gpu_items.sh decide    # = GPU_ITEMS="ablate bfloat16 check" all
#     ABLATE_VARIANTS="default batch_x2 batch_x4 unscanned" bash tools/gpu_items.sh decide  # what a first call left
# Everything each writes is under $OUT (or ./gpu_out where OUT is unset), logs included; `all`
# puts each item's files in one archive there (the tool brings back at most 8 files).
set -euo pipefail
cd "$(dirname "$0")/.."
item=${1:?usage: bash tools/gpu_items.sh wheels|parity|bench|train|check|profile|ablations|ablate|bfloat16|determinism|all|decide}
case "$item" in
wheels | parity | bench | train | check | profile | ablations | ablate | bfloat16 | determinism | all | decide) ;;
*) echo "unknown item $item: wheels, parity, bench, train, check, profile, ablations, ablate, bfloat16, determinism, all or decide" >&2
    exit 2 ;;
esac
if [ "$item" = decide ]; then
    # Issue 48's items, each under its own limit (seconds): the ablations (their own budget inside,
    # ABLATE_BUDGET, is 120 s shorter: a group may finish its compile and its timing after it),
    # the bfloat16 parity by layer, then the parity command. One compilation cache for the whole
    # call: the ablations' groups compile `default` once between them, and XLA's GEMM autotuning
    # results are kept there too (jax_persistent_cache_enable_xla_caches).
    export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/gpu_items_jax_cache}
    export GPU_ITEMS=${GPU_ITEMS:-ablate bfloat16 check}
    exec bash "$0" all
fi
if [ "$item" = all ]; then
    # Checked before any setup or clean-up: a misspelt item would otherwise end the call after
    # the items before it ran, and `timeout 0` means no limit at all.
    for name in ${GPU_ITEMS:-}; do
        case "$name" in
        train | parity | bench | bench_scan | bench_decode | bench_compile | bench_train | check | profile | ablations \
            | ablate | bfloat16 | determinism) ;;
        *) echo "GPU_ITEMS: unknown item $name (known: train parity bench bench_scan bench_decode bench_compile" \
            "bench_train check profile ablations ablate bfloat16 determinism)" >&2
            exit 2 ;;
        esac
    done
    # A misspelt limit (LIMIT_TRAN) would be ignored and its item run under the default.
    known_limits="LIMIT_TRAIN LIMIT_PARITY LIMIT_BENCH LIMIT_SCAN LIMIT_DECODE LIMIT_COMPILE LIMIT_TRAIN_STEP LIMIT_CHECK"
    known_limits="$known_limits LIMIT_PROFILE LIMIT_ABLATIONS LIMIT_ABLATE LIMIT_BFLOAT16 LIMIT_DETERMINISM"
    for var in $(compgen -v LIMIT_); do
        if ! [[ " $known_limits " == *" $var "* ]]; then
            echo "$var: unknown limit (known: $known_limits)" >&2
            exit 2
        fi
        if ! [[ ${!var} =~ ^[1-9][0-9]*$ ]]; then
            echo "$var=${!var}: must be a positive whole number of seconds" >&2
            exit 2
        fi
    done
fi
out=${OUT:-gpu_out}
mkdir -p "$out"

if [ "$item" = wheels ]; then
    # The versions this project is tested with; the machine's Python is 3.12 (device KINDS.md).
    mkdir -p .git/info .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    # (with the project's virtual environment active: its versions are the ones copied)
    for pkg in tensorboardX rapidfuzz; do
        version=$(python3 -m pip show "$pkg" | awk '/^Version:/ {print $2}')
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d .whl "$pkg==$version"
    done
    ls -l .whl
    exit 0
fi


if [ -z "${SKIP_MACHINE:-}" ]; then  # once: an `all` call's items inherit the environment
    mkdir -p /tmp/site
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    fi
    # The project's entry points (pyproject.toml: parity's weight reader for --init-from), which
    # `pip install` registers and a checkout on PYTHONPATH does not: a dist-info holding them.
    python3 - <<'EOF_ENTRY_POINTS'
import pathlib, tomllib
groups = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]["entry-points"]
info = pathlib.Path("/tmp/site/flaxformer_mini_entry_points-0.dist-info")
info.mkdir(exist_ok=True)
(info / "METADATA").write_text("Metadata-Version: 2.1\nName: flaxformer-mini-entry-points\nVersion: 0\n")
(info / "entry_points.txt").write_text(
    "".join(f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in entries.items())
            for group, entries in groups.items()))
EOF_ENTRY_POINTS
    export PYTHONPATH=".:/tmp/site" PYTHONUNBUFFERED=1
fi
if [ -z "${SKIP_MACHINE:-}" ]; then {
    date -u
    echo "code: commit ${FLAXFORMER_MINI_COMMIT:-not given (set FLAXFORMER_MINI_COMMIT to the commit copied here)}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    python3 -c 'import jax, flax, optax, torch; print("jax", jax.__version__, jax.devices(), "| flax", flax.__version__,
"| optax", optax.__version__, "| torch", torch.__version__, "cuda", torch.version.cuda)'
} 2>&1 | tee "$out/machine.txt"; fi

if [ "$item" = all ]; then
    # Seconds for each, in the order a short lease loses least: the main job (about a minute),
    # the parity suite, the large preset's Flax and torch eager paths, then torch.compile's
    # (inductor's compile of 24 layers is the slowest part and the least needed). timeout's
    # SIGINT lets pytest print its summary; `tee -i` keeps each log to its end.
    work=/tmp/gpu_all
    export SKIP_MACHINE=1  # written once, above
    rm -rf "$work" && mkdir -p "$work" && cp "$out/machine.txt" "$work/"
    run_item() {
        local name=$1 limit=$2 rc=0
        shift 2
        local started=$SECONDS
        OUT="$work/$name" timeout -s INT -k 20 "$limit" env "$@" bash "$0" "${name%%_*}" || rc=$?
        echo "$name: exit $rc after $((SECONDS - started)) s (limit $limit s)" | tee -a "$work/summary.txt"
        worst=$((rc > worst ? rc : worst))
        # Collected after each item, so a call cut short still brings back what ran.
        cp "$work/summary.txt" "$out/"
        for file in ${logs[$name]}; do  # (names without spaces: word-split on purpose)
            if [ -f "$work/$name/$file" ]; then cp "$work/$name/$file" "$out/${name}_$file"; fi
        done
        tar czf "$out/gpu_items.tar.gz" -C "$work" .
    }
    worst=0
    declare -A logs=([train]=train.log [parity]=parity.log [bench]=large.log [bench_scan]=large.log
        [bench_decode]=large.log [bench_compile]=large.log [bench_train]=large.log [check]=check.log
        [profile]=profile.log [ablations]=ablations.log [ablate]="ablations.json ablations.log" [bfloat16]=bfloat16.log
        [determinism]="determinism.log ablations.json ablations.log")
    # GPU_ITEMS: which, in this order (default all); LIMIT_*: their seconds.
    for name in ${GPU_ITEMS:-train parity bench bench_decode bench_compile}; do
        case "$name" in
        train) run_item train "${LIMIT_TRAIN:-120}" ;;
        # XLA:GPU's deterministic kernels: the suite's resume tests compare runs bit for bit (determinism).
        parity) run_item parity "${LIMIT_PARITY:-185}" XLA_PYTHON_CLIENT_PREALLOCATE=false PARITY_WORKERS=12 PARITY_MAXFAIL=30 \
            XLA_FLAGS=--xla_gpu_deterministic_ops=true ;;
        # Decoding apart: a failure there must not lose the training step's figures.
        bench) run_item bench "${LIMIT_BENCH:-120}" BENCH_ARGS="--paths flax_jit torch_eager --ops forward train_step" ;;
        # The same with the Flax layers scanned: XLA compiles one block, not 24 (on the H200 the
        # unscanned train step's compile outlasted 80 s; scanned 24+24 compiled in 5.3 s against
        # 60.1 s unscanned on an Intel Xeon CPU, docs/benchmarks.md "Scaling").
        bench_scan) run_item bench_scan "${LIMIT_SCAN:-150}" BENCH_ARGS="--paths flax_jit torch_eager --scan-layers --ops train_step forward" ;;
        bench_decode) run_item bench_decode "${LIMIT_DECODE:-70}" BENCH_ARGS="--paths flax_jit torch_eager --ops decode_cached" ;;
        # The train step alone: inductor's compile of its backward is the slow part (the forward's
        # compile, 35.8 s on the H200, and its time are in docs/benchmarks.md already).
        bench_compile) run_item bench_compile "${LIMIT_COMPILE:-85}" BENCH_ARGS="--paths torch_compile --ops train_step" ;;
        # Flax (scanned), torch eager and torch.compile's train steps in one process: the figures
        # of 2026-11-26 had torch.compile's from another process.
        bench_train) run_item bench_train "${LIMIT_TRAIN_STEP:-220}" BENCH_ARGS="--scan-layers --ops train_step" ;;
        check) run_item check "${LIMIT_CHECK:-90}" ;;
        profile) run_item profile "${LIMIT_PROFILE:-150}" ;;
        ablations) run_item ablations "${LIMIT_ABLATIONS:-300}" ;;
        # Its JSON (every variant, measured or not, and why) and log come back beside the archive.
        ablate) run_item ablate "${LIMIT_ABLATE:-360}" ;;
        bfloat16) run_item bfloat16 "${LIMIT_BFLOAT16:-100}" ;;
        determinism) run_item determinism "${LIMIT_DETERMINISM:-360}" XLA_PYTHON_CLIENT_PREALLOCATE=false ;;
        *) echo "unknown GPU_ITEMS entry $name" >&2; exit 2 ;;
        esac
    done
    exit "$worst"  # the largest item's exit code (124: a timeout), so a failed item fails the call
fi

case "$item" in
parity)
    # -p no:cacheprovider: nothing written into the tree; --maxfail 1: the first failure is the one
    # to read (PARITY_MAXFAIL=N: up to N)
    # (PARITY_WORKERS=N: N pytest-xdist workers on the one GPU; set XLA_PYTHON_CLIENT_PREALLOCATE=false
    # with it, or the first worker's JAX takes three quarters of the GPU's memory).
    python3 -m pytest -m parity --torch-device cuda -p no:cacheprovider --maxfail="${PARITY_MAXFAIL:-1}" -q \
        ${PARITY_WORKERS:+-n "$PARITY_WORKERS"} --junitxml="$out/parity.xml" 2>&1 | tee -i "$out/parity.log"
    ;;
bench)
    # BENCH_ARGS: more options, e.g. "--paths flax_jit torch_eager" (word-split on purpose).
    # shellcheck disable=SC2086
    python3 -m benchmarks --preset large --json "$out/large.json" ${BENCH_ARGS:-} 2>&1 | tee -i "$out/large.log"
    ;;
check)
    # The command a porter runs: the seed preset, torch on CUDA, gradients and 9 decoded tokens
    # compared too; float32 and TF32 off on both sides (parity_numerics), the default 1e-5. (9: the
    # seed preset's max_len is 10, the BOS included.)
    python3 -m parity check --torch-device cuda --grads --decode 9 --json "$out/check.json" 2>&1 | tee -i "$out/check.log"
    ;;
ablate)
    # The large train step's variants (tools/ablation_variants.py), most telling first: in one
    # process with `default` (`main`), then the larger batches, while the budget lasts; what it
    # leaves is listed as not run in the JSON. The XLA:GPU flags (each in its own process; a flag
    # this XLA does not know ends that process alone and is reported as refused), the PRNG
    # implementations and the unscanned step were measured on an H200 (docs/benchmarks.md) and
    # are left out. ABLATE_VARIANTS: another list (word-split on purpose).
    # shellcheck disable=SC2086
    # (ABLATE_PRESET=tiny ABLATE_REPS=1: the same plumbing on a CPU, in minutes)
    python3 -m tools.ablations --preset "${ABLATE_PRESET:-large}" --scan-layers --reps "${ABLATE_REPS:-10}" \
        --budget-s "${ABLATE_BUDGET:-240}" --json "$out/ablations.json" --variants ${ABLATE_VARIANTS:-default \
        layer_norm_autodiff layer_norm_recomputed remat_dots remat_nothing no_dropout fused_loss batch_x2 batch_x4} \
        2>&1 | tee -i "$out/ablations.log"
    ;;
bfloat16)
    # The bfloat16 policy by layer (docs/design.md, "Parity policy"): the table and JSON of the
    # tiny and seed presets, then its tests, torch in float32 on CUDA (TF32 off), JAX's GPU in bfloat16.
    rc=0
    # (TORCH_DEVICE=cpu: the same on a machine without one)
    python3 -m parity.bfloat16 --torch-device "${TORCH_DEVICE:-cuda}" --json "$out/bfloat16.json" --force 2>&1 \
        | tee -i "$out/bfloat16.log" || rc=$?
    python3 -m pytest tests/test_parity_bfloat16.py --torch-device "${TORCH_DEVICE:-cuda}" -p no:cacheprovider -q \
        2>&1 | tee -i -a "$out/bfloat16.log" || rc=$?
    exit "$rc"
    ;;
determinism)
    # Exact resume on a GPU (docs/design.md, "Runs"). XLA:GPU's scatter-adds (the embeddings'
    # gradients) use atomics, whose order varies from run to run; JAX's remedy is
    # --xla_gpu_deterministic_ops. The resume tests (kill -9, SIGTERM, Ctrl-C, a Trainer stopped
    # and resumed, an averaged run, a tied one; test_ema.py whole: the average's own test too)
    # under XLA's defaults, then under that flag, then the flag's cost on the large train step
    # (its own process: XLA reads its flags once).
    rc=0
    resume_tests=(tests/test_train_cli.py::test_ctrl_c_sigterm_and_kill_9_each_resume_to_the_uninterrupted_run_bit_for_bit
        tests/test_training.py::test_stopping_and_resuming_gives_the_uninterrupted_parameters_bit_for_bit
        tests/test_ema.py
        tests/test_tied_embeddings.py::test_a_tied_run_records_its_tie_and_resumes_after_kill_9_bit_for_bit)
    for flags in "" "--xla_gpu_deterministic_ops=true"; do
        echo "== XLA_FLAGS='$flags'" | tee -i -a "$out/determinism.log"
        XLA_FLAGS="$flags" python3 -m pytest "${resume_tests[@]}" --torch-device "${TORCH_DEVICE:-cuda}" -p no:cacheprovider -q -n 4 \
            2>&1 | tee -i -a "$out/determinism.log" || rc=$?
    done
    # The ablate item with the flag's group (ablations.json and ablations.log beside this log).
    # (TORCH_DEVICE=cpu DETERMINISM_PRESET=tiny: the same plumbing on a CPU)
    JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/gpu_items_jax_cache} SKIP_MACHINE=1 OUT="$out" \
        ABLATE_PRESET="${DETERMINISM_PRESET:-large}" ABLATE_BUDGET="${DETERMINISM_BUDGET:-150}" \
        ABLATE_VARIANTS="default xla_deterministic_ops" bash "$0" ablate || rc=$?
    exit "$rc"
    ;;
train)
    rm -rf /tmp/gpu_reverse
    { time python3 -m flaxformer_mini train --task reverse --dtype bfloat16 --out /tmp/gpu_reverse; } \
        2>&1 | tee -i "$out/train.log"
    cp /tmp/gpu_reverse/metrics.jsonl /tmp/gpu_reverse/config.json /tmp/gpu_reverse/loss.png "$out/"
    ;;
profile | ablations)
    # The scanned large train step (its unscanned compile outlasted 80 s on the H200; scanned
    # it took 50 s on the H100). A compilation cache shared by the two items: JAX keeps XLA's
    # GEMM autotuning results in it too (jax_persistent_cache_enable_xla_caches), so the
    # ablations' variants, whose GEMMs are all the same, autotune them once.
    export JAX_COMPILATION_CACHE_DIR=/tmp/gpu_items_jax_cache
    if [ "$item" = profile ]; then
        # (the tool turns XLA's CUDA graphs off itself, so that the trace shows each kernel)
        python3 -m tools.xla_profile --preset large --scan-layers --top 25 --json "$out/profile.json" \
            2>&1 | tee -i "$out/profile.log"
    else
        python3 -m tools.ablations --preset large --scan-layers --reps 10 \
            --variants default layer_norm_recomputed layer_norm_recomputed_cse eval_forward_x3 \
            2>&1 | tee -i "$out/ablations.log"
    fi
    ;;
esac
