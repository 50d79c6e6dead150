"""A 2-process CLI run of tests/helpers.py's EVERY_STEP_TINY_RUN (12 steps, a checkpoint every 6), each
process under /usr/bin/time, with an empty compilation cache and JAX_LOG_COMPILES: what each
process compiled and its CPU. `python two_process_run.py` from the repository root."""
import os, sys, time, tempfile, re, collections
sys.path.insert(0, "tests")  # run from the repository root
os.environ["XLA_FLAGS"] = "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"
os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp()
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_LOG_COMPILES"] = "1"
import helpers
out = tempfile.mkdtemp() + "/run"
argv = helpers.train_cli(out, 2)
cmd = lambda i: ["/usr/bin/time", "-f", "TIMEPROC user %U sys %S"] + argv(i) + ["--steps", "12", "--save-every", "6"]
t0=time.time()
res = helpers.finish(helpers.start_processes(cmd, 2))
print([c for c,_,_ in res], time.time()-t0)
for i,(c,o,e) in enumerate(res):
    fin = re.findall(r"Finished XLA compilation of (\S+) in ([0-9.e-]+) sec", e)
    tot=collections.Counter(); cnt=collections.Counter()
    for n,s in fin: tot[n]+=float(s); cnt[n]+=1
    print("process", i, len(fin), "compiles", round(sum(tot.values()),1), "s")
    for n,s in tot.most_common(12): print(f"   {s:6.2f} {cnt[n]:3d} {n}")
    open(f"/tmp/mp3_{i}.err","w").write(e)
