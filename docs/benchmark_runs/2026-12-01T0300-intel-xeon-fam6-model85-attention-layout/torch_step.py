"""torch_ref's train step on the recipe's model, B 128, S 14, T 16 (random tokens), 50 timed steps after 10: python torch_step.py THREADS"""
import sys, time, numpy as np, torch
from types import SimpleNamespace
from torch_ref.model import Transformer
from torch_ref.training import make_optimizer, train_step
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
torch.manual_seed(0)
m = Transformer(0, 32, 44, 32, 128, 4, 3, 0.0, ffn_dim=512); m.train()
opt, sch = make_optimizer(m, schedule="cosine", learning_rate=2e-3, warmup_steps=800, decay_steps=6000)
rng = np.random.default_rng(0); B, S, T = 128, 14, 16
def batch():
    src = rng.integers(4, 32, (B, S)).astype(np.int64); tgt = rng.integers(4, 44, (B, T+1)).astype(np.int64)
    return SimpleNamespace(source=src, target_in=tgt[:, :-1], target_out=tgt[:, 1:])
ts = []
for i in range(60):
    b = batch(); t0 = time.perf_counter(); train_step(m, opt, sch, b, label_smoothing=0.1); ts.append(time.perf_counter() - t0)
ts = np.array(ts[10:]) * 1000
print(f"torch {torch.get_num_threads()} threads: median {np.median(ts):.1f} ms, min {ts.min():.1f} ms, tok/s {B*T/np.median(ts)*1000:.0f}")
