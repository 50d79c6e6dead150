"""Compile-time split of the tiny one-layer train step: forward, forward+backward, full step; dropout on/off."""
import sys, time, re
import jax, jax.numpy as jnp
from flax import nnx
import numpy as np
import flaxformer_mini as fm
from flaxformer_mini.train.trainer import Trainer
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train import step as S
from flaxformer_mini.data.batches import Batch

which = sys.argv[1]
dropout = float(sys.argv[2])
cfg = fm.get_preset("tiny").replace(num_layers=1, source_vocab_size=13, target_vocab_size=13, max_len=7, dropout=dropout)
model = fm.Transformer.from_config(cfg, rngs=nnx.Rngs(0))
tr = Trainer(model, TrainConfig(warmup_steps=5))
state = tr.init_state()
B, L = 8, 6
src = jnp.asarray(np.random.default_rng(0).integers(1, 13, (B, L)), jnp.int32)
batch = Batch(source=src, target_in=src, target_out=src)
if which == "step":
    f = S.train_step
    args = (state, batch)
elif which == "grad":
    def f(state, batch):
        model = nnx.merge(state.graphdef, state.params, state.other)
        key = jax.random.fold_in(jax.random.key(state.config.seed), state.step)
        S.reseed_dropout(model, key)
        (loss, aux), grads = nnx.value_and_grad(S._loss, has_aux=True)(model, batch, 0.0)
        return loss, grads
    args = (state, batch)
elif which == "fwd":
    def f(state, batch):
        model = nnx.merge(state.graphdef, state.params, state.other)
        key = jax.random.fold_in(jax.random.key(state.config.seed), state.step)
        S.reseed_dropout(model, key)
        return S._loss(model, batch, 0.0)[0]
    args = (state, batch)
c0 = time.process_time()
low = jax.jit(f).lower(*args)
c1 = time.process_time()
comp = low.compile()
c2 = time.process_time()
txt = comp.as_text()
nfus = len(re.findall(r"^\s*(ROOT )?%?\S+ = .* fusion\(", txt, re.M))
ninstr = len(re.findall(r" = ", txt))
print(f"{which} dropout={dropout}: lower {c1-c0:.2f}s compile {c2-c1:.2f}s fusions {nfus} instrs {ninstr}", flush=True)

if which == "step":
    import optax
    def ravel(tree):
        return jnp.concatenate([x.ravel() for x in jax.tree.leaves(tree)])
    def unravel(vec, like):
        leaves, treedef = jax.tree.flatten(like)
        out, i = [], 0
        for l in leaves:
            out.append(vec[i:i + l.size].reshape(l.shape)); i += l.size
        return jax.tree.unflatten(treedef, out)
    pdef = jax.tree.structure(state.params)
    def is_p(x):
        try: return jax.tree.structure(x) == pdef
        except Exception: return False
    def flat_step(state, batch):
        model = nnx.merge(state.graphdef, state.params, state.other)
        key = jax.random.fold_in(jax.random.key(state.config.seed), state.step)
        S.reseed_dropout(model, key)
        (loss, aux), grads = nnx.value_and_grad(S._loss, has_aux=True)(model, batch, 0.0)
        fp = {"all": ravel(state.params)}
        fo = jax.tree.map(lambda t: {"all": ravel(t)} if is_p(t) else t, state.opt_state, is_leaf=is_p)
        with jax.numpy_dtype_promotion("standard"):
            up, no = state.tx.update({"all": ravel(grads)}, fo, fp)
            newp = optax.apply_updates(fp, up)
        params = unravel(newp["all"], state.params)
        opt = jax.tree.map(lambda t, o: unravel(t["all"], o) if is_p(o) else t, no, state.opt_state, is_leaf=lambda x: isinstance(x, dict) and set(x) == {"all"})
        return params, opt, loss
    c1 = time.process_time()
    comp2 = jax.jit(flat_step).lower(state, batch).compile()
    c2 = time.process_time()
    txt = comp2.as_text()
    nfus = len(re.findall(r"^\s*(ROOT )?%?\S+ = .* fusion\(", txt, re.M))
    print(f"flat step: compile {c2-c1:.2f}s fusions {nfus} leaves {len(jax.tree.leaves(state.params))}")
    a = comp(state, batch); b = comp2(state, batch)
    d = jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a[0].params, b[0])
    print("max param diff", max(jax.tree.leaves(d)), "loss", a[1]["loss"], b[2])
