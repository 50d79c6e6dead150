import numpy as np, torch, jax, jax.numpy as jnp
jax.config.update("jax_default_matmul_precision", "highest")
torch.set_num_threads(1)
rng = np.random.default_rng(0)
for K in (64, 512, 2048):
    x = rng.normal(size=(640, K)).astype(np.float32); w = (rng.normal(size=(K, 512)) / np.sqrt(K)).astype(np.float32)
    ex = x.astype(np.float64) @ w.astype(np.float64)
    t = (torch.tensor(x) @ torch.tensor(w)).numpy()
    j = np.asarray(jnp.asarray(x) @ jnp.asarray(w))
    j2 = np.asarray(jax.jit(lambda a, b: jnp.einsum("bk,kn->bn", a, b))(x, w))
    npy = x @ w
    def rms(a): return np.sqrt(np.mean((a - ex) ** 2))
    print(f"K={K}: torch {rms(t):.3e} jax {rms(j):.3e} jit-einsum {rms(j2):.3e} numpy {rms(npy):.3e}; ratio jax/torch {rms(j)/rms(t):.2f}")
