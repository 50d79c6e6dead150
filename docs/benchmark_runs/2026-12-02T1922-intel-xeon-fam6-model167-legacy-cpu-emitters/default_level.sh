# The tiny train step compiled under four settings, twice each in turn, in fresh processes.
cd /work/main && . .venv/bin/activate
python docs/benchmark_runs/2026-12-01T0000-amd-epyc-fam25-model1-suite-fixed-costs/compile_fixed_cost.py 2>&1 | grep "per add"
E="--xla_cpu_multi_thread_eigen=false"
for i in 1 2; do for B in "--xla_backend_optimization_level=0" "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false" "--xla_cpu_use_fusion_emitters=false" ""; do
  echo -n "[$B] "; XLA_FLAGS="$B $E" PYTHONPATH=. python docs/benchmark_runs/2026-12-02T1054-amd-epyc-fam25-model1-suite-profile-and-xla-compile/train_step_compile.py 2>&1 | grep -E "compile|hash|rror" | tr '\n' ' '; echo
done; done
