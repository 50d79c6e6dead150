"""Recipe train step (d128x3, ffn 512, dropout 0, ls 0.1, ema 0.999), source (128, 14), target (128, 16),
steady-state ms/step under the XLA_FLAGS of the environment."""
import os, time
import numpy as np, jax
from flax import nnx
import flaxformer_mini as fm
from flaxformer_mini.model.config import ModelConfig
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer
from flaxformer_mini.data import Batch
cfg = ModelConfig(src_pad_idx=0, source_vocab_size=32, target_vocab_size=44, max_len=32, embed_size=128, heads=4, num_layers=3, dropout=0.0, ffn_dim=512)
model = fm.Transformer.from_config(cfg, rngs=nnx.Rngs(0))
tr = Trainer(model, TrainConfig(schedule="cosine", learning_rate=2e-3, warmup_steps=800, decay_steps=6000, label_smoothing=0.1, ema_decay=0.999))
rng = np.random.default_rng(0)
B, S, T = 128, 14, 16
def batch():
    src = rng.integers(4, 32, (B, S)).astype(np.int32); tgt = rng.integers(4, 44, (B, T+1)).astype(np.int32)
    return Batch(src, tgt[:, :-1], tgt[:, 1:])
st = tr.init_state(); b = batch()
t0 = time.perf_counter(); st, m = tr.step(st, b); jax.block_until_ready(m); c = time.perf_counter() - t0
ts = []
for i in range(60):
    b = batch(); t0 = time.perf_counter(); st, m = tr.step(st, b); jax.block_until_ready(m); ts.append(time.perf_counter() - t0)
ts = np.array(ts[10:]) * 1000
print(f"{os.environ.get('XLA_FLAGS','')!r}: first {c:.1f} s, median {np.median(ts):.1f} ms, min {ts.min():.1f} ms, tok/s {B*T/np.median(ts)*1000:.0f}", flush=True)
