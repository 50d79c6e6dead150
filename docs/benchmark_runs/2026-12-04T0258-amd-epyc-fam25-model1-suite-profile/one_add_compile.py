import os, time
os.environ.setdefault("XLA_FLAGS","--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false")
import jax, jax.numpy as jnp
x = jnp.ones(3)
ts=[]
for i in range(5):
    f = jax.jit(lambda a, i=i: a + i)
    t=time.perf_counter(); f.lower(x).compile(); ts.append(time.perf_counter()-t)
print("one-add compile ms:", [round(t*1000,1) for t in ts])
