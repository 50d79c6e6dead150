"""The one-layer tiny train step and its parts, traced, lowered and compiled alone in a fresh
process: `python train_step_compile_parts.py full|nodrop|grad|fwd|opt` from the repository root."""
import os, sys, time
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false")
import jax, jax.numpy as jnp, optax
from flax import nnx
import flaxformer_mini as fm
from flaxformer_mini.train.trainer import Trainer
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train import step as S

variant = sys.argv[1]
cfg = fm.get_preset("tiny").replace(num_layers=1, source_vocab_size=13, target_vocab_size=13, max_len=7,
                                    dropout=0.0 if variant == "nodrop" else 0.1)
model = fm.Transformer.from_config(cfg, rngs=nnx.Rngs(0))
tr = Trainer(model, TrainConfig(warmup_steps=5))
state = tr.init_state()
import numpy as np
B, L = 8, 6
rng = np.random.default_rng(0)
src = jnp.asarray(rng.integers(1, 13, (B, L)), jnp.int32)
from flaxformer_mini.data.batches import Batch
batch = Batch(source=src, target_in=src, target_out=src)
def t(name, f, *a):
    c0 = time.process_time()
    low = jax.jit(f).lower(*a)
    c1 = time.process_time()
    low.compile()
    c2 = time.process_time()
    n = low.as_text().count("\n")
    print(f"{variant:8s} {name:10s} lower {c1-c0:.2f}s compile {c2-c1:.2f}s  hlo-lines {n}", flush=True)
if variant in ("full", "nodrop"):
    t("step", S.train_step, state, batch)
elif variant == "grad":
    def g(state, batch):
        model = nnx.merge(state.graphdef, state.params, state.other)
        key = jax.random.fold_in(jax.random.key(0), state.step)
        S.reseed_dropout(model, key)
        (loss, aux), grads = nnx.value_and_grad(S._loss, has_aux=True)(model, batch, 0.0)
        return loss, grads
    t("grad", g, state, batch)
elif variant == "fwd":
    def f(state, batch):
        model = nnx.merge(state.graphdef, state.params, state.other)
        key = jax.random.fold_in(jax.random.key(0), state.step)
        S.reseed_dropout(model, key)
        return S._loss(model, batch, 0.0)[0]
    t("fwd", f, state, batch)
elif variant == "opt":
    def o(state, grads):
        with jax.numpy_dtype_promotion("standard"):
            u, s = state.tx.update(grads, state.opt_state, state.params)
            return optax.apply_updates(state.params, u), s
    t("opt", o, state, state.params)
