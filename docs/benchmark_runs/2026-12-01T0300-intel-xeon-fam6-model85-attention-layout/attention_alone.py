"""One attention's softmax(q k^T / sqrt(K)) v, forward and gradients (q, k, v), jitted, at the
CMUdict recipe's shapes (B 128, H 4, T = S = 16, K 32), 15 interleaved rounds in one process:
"mixed" (queries (B, T, H, K), the seed's layout), "head_first" (queries transposed first, the
output transposed back) and one batch axis of B * H (jnp.matmul)."""
import time, numpy as np, jax, jax.numpy as jnp
B, H, T, S, K = 128, 4, 16, 16, 32
r = np.random.default_rng(0)
q = jnp.asarray(r.standard_normal((B, T, H, K)), jnp.float32)
k = jnp.asarray(r.standard_normal((B, H, S, K)), jnp.float32)
v = jnp.asarray(r.standard_normal((B, H, S, K)), jnp.float32)
mask = jnp.asarray(r.random((B, 1, 1, S)) > 0.1)
def fill(s): return jnp.where(~mask, -1e20, s)
def mixed(q, k, v):
    s = jnp.einsum("BTHK,BHSK->BHTS", q, k); w = jax.nn.softmax(fill(s) / K**0.5)
    return jnp.einsum("BHTS,BHSK->BTHK", w, v)
def head_first(q, k, v):
    qh = q.transpose(0, 2, 1, 3)
    s = jnp.einsum("BHTK,BHSK->BHTS", qh, k); w = jax.nn.softmax(fill(s) / K**0.5)
    return jnp.einsum("BHTS,BHSK->BHTK", w, v).transpose(0, 2, 1, 3)
def one_batch_axis(q, k, v):
    qh = q.transpose(0, 2, 1, 3).reshape(B * H, T, K)
    s = jnp.matmul(qh, k.reshape(B * H, S, K).swapaxes(1, 2)).reshape(B, H, T, S); w = jax.nn.softmax(fill(s) / K**0.5)
    return jnp.matmul(w.reshape(B * H, T, S), v.reshape(B * H, S, K)).reshape(B, H, T, K).transpose(0, 2, 1, 3)
g = jax.random.normal(jax.random.key(1), (B, T, H, K))
fns = {}
for name, f in dict(mixed=mixed, head_first=head_first, one_batch_axis=one_batch_axis).items():
    def loss(q, k, v, f=f): return (f(q, k, v) * g).sum()
    fns[name] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    jax.block_until_ready(fns[name](q, k, v))
ref = fns["mixed"](q, k, v)
res = {n: [] for n in fns}
for rnd in range(15):
    for n, f in fns.items():
        t0 = time.perf_counter(); jax.block_until_ready(f(q, k, v)); res[n].append(time.perf_counter() - t0)
for n in fns:
    d = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(fns[n](q, k, v)), jax.tree.leaves(ref)))
    print(f"{n}: median {1000 * np.median(res[n]):.2f} ms, largest difference from mixed {d:.2e}")
