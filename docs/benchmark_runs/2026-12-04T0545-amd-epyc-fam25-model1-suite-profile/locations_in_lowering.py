import sys, time, jax, jax.numpy as jnp, numpy as np
from flax import nnx
import flaxformer_mini as fm
from flaxformer_mini.train.trainer import Trainer
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train import step as S
from flaxformer_mini.data.batches import Batch
if sys.argv[1] == "off":
    jax.config.update("jax_include_full_tracebacks_in_locations", False)
depth = int(sys.argv[2])
cfg = fm.get_preset("tiny").replace(num_layers=1, source_vocab_size=13, target_vocab_size=13, max_len=7)
model = fm.Transformer.from_config(cfg, rngs=nnx.Rngs(0))
tr = Trainer(model, TrainConfig(warmup_steps=5))
state = tr.init_state()
src = jnp.asarray(np.random.default_rng(0).integers(1, 13, (8, 6)), jnp.int32)
batch = Batch(source=src, target_in=src, target_out=src)
def deep(n):
    if n: return deep(n - 1)
    out = []
    for i in range(3):
        f = jax.jit(lambda s, b, i=i: S.train_step(s, b))
        t0 = time.process_time(); tr_ = f.trace(state, batch); t1 = time.process_time(); tr_.lower(); t2 = time.process_time()
        out.append((t1 - t0, t2 - t1))
    return out
r = deep(depth)
print(sys.argv[1:], " ".join(f"trace {a:.2f} lower {b:.2f}" for a, b in r))
