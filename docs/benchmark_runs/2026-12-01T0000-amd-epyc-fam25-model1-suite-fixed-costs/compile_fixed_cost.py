"""The fixed cost of one XLA:CPU compilation: a jitted one-add program lowered and compiled at
40 new shapes, in a fresh process under the suite's XLA_FLAGS plus the flag given
(`python compile_fixed_cost.py [--xla_flag=value]`), and one eager multiply at 40 new shapes
(its jnp.ones included)."""
import os, sys, time
os.environ["XLA_FLAGS"] = "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false " + (sys.argv[1] if len(sys.argv) > 1 else "")
import jax, jax.numpy as jnp
x = jnp.ones((3,)); x + x  # warm
lo=co=0
for n in range(4, 44):
    a = jnp.ones((n,)); f = jax.jit(lambda a: a + a)
    t0 = time.process_time(); l = f.lower(a); t1 = time.process_time(); l.compile(); t2 = time.process_time()
    lo += t1-t0; co += t2-t1
print(f"{sys.argv[1:]}: lower {1000*lo/40:.1f} ms, compile {1000*co/40:.1f} ms per add")
# eager op dispatch incl compile
t0=time.process_time()
for n in range(100, 140): jnp.ones((n,)) * 2.0
print(f"eager multiply new shape incl ones: {1000*(time.process_time()-t0)/40:.1f} ms")
