cd /work/main && . .venv/bin/activate
B="--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"
for extra in "" "--xla_cpu_use_fusion_emitters=false" "--xla_cpu_disable_new_fusion_emitters=true" "--xla_cpu_disable_tiled_emitter=true" "--xla_cpu_disable_loop_unrolling=true" "--xla_cpu_optimize_for_size=true" "--xla_cpu_use_thunk_runtime=false" "" ; do
  for i in 1 2; do
  XLA_FLAGS="$B $extra" PYTHONPATH=. python docs/benchmark_runs/2026-12-02T1054-amd-epyc-fam25-model1-suite-profile-and-xla-compile/train_step_compile.py 2>&1 | grep -E "compile|hash|rror" | tr '\n' ' ' | sed "s|$B||"; echo
  done
done
