"""The tiny preset's one-layer train step lowered and compiled in a fresh process, with the
suite's XLA_FLAGS set by the caller: `python train_step_compile.py` from the repository root.
Prints the compile's CPU time and a hash of the step's outputs (equal under every flag tried)."""
import os, time
import jax, jax.numpy as jnp
from flax import nnx
import flaxformer_mini as fm
from flaxformer_mini.train.trainer import Trainer
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train import step as S
from flaxformer_mini.data.batches import Batch
import numpy as np
cfg = fm.get_preset("tiny").replace(num_layers=1, source_vocab_size=13, target_vocab_size=13, max_len=7)
model = fm.Transformer.from_config(cfg, rngs=nnx.Rngs(0))
tr = Trainer(model, TrainConfig(warmup_steps=5))
state = tr.init_state()
B, L = 8, 6
src = jnp.asarray(np.random.default_rng(0).integers(1, 13, (B, L)), jnp.int32)
batch = Batch(source=src, target_in=src, target_out=src)
c0 = time.process_time(); w0=time.time()
low = jax.jit(S.train_step).lower(state, batch)
c1 = time.process_time()
comp = low.compile()
c2 = time.process_time(); w2=time.time()
out = comp(state, batch)
print(f"{os.environ.get('XLA_FLAGS')}: lower {c1-c0:.2f}s compile cpu {c2-c1:.2f}s wall {w2-w0:.2f} loss {float(out[1]['loss']) if isinstance(out, tuple) and isinstance(out[1], dict) else ''}", flush=True)
import hashlib
h=hashlib.sha256()
for leaf in jax.tree_util.tree_leaves(out):
    try: h.update(np.asarray(leaf).tobytes())
    except Exception: pass
print("hash", h.hexdigest()[:16])
