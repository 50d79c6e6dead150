"""The einsum attention's two layouts, interleaved in one process: "mixed" (queries
(B, T, H, K) against head-first keys and values, the output in (B, T, H, K): the package's
SelfAttention.attend) and "head_first" (every operand (B, H, ., K)), both written out here.
The train step of `Trainer` (the README's CMUdict recipe's optimizer: cosine, label
smoothing 0.1, EMA 0.999; dropout 0) and greedy decoding of a batch.

PYTHONPATH=. python attention_layout.py D L F B S T  (heads 4)"""
import sys, time, numpy as np, jax, jax.numpy as jnp
from flax import nnx
import flaxformer_mini as fm
from flaxformer_mini.model import attention as A
from flaxformer_mini.model.config import ModelConfig
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer
from flaxformer_mini.decode.search import greedy_decode
from flaxformer_mini.data import Batch

def attend(self, query, k, v, mask):
    B, T, _ = query.shape
    H, K = self.heads, self.head_dim
    q = self.W_q(query).reshape(B, T, H, K)
    if self.attention_impl == "mixed":
        scores = jnp.einsum("BTHK,BHSK->BHTS", q, k, preferred_element_type=A._scores_dtype(q, k))
        weights = A._softmax_f32(A.masked_fill(scores, mask) / (K**0.5))
        out = jnp.einsum("BHTS,BHSK->BTHK", weights.astype(v.dtype), v)
    else:  # head-first: the queries transposed first, the output back once
        q = q.transpose(0, 2, 1, 3)
        scores = jnp.einsum("BHTK,BHSK->BHTS", q, k, preferred_element_type=A._scores_dtype(q, k))
        weights = A._softmax_f32(A.masked_fill(scores, mask) / (K**0.5))
        out = jnp.einsum("BHTS,BHSK->BHTK", weights.astype(v.dtype), v).transpose(0, 2, 1, 3)
    return self.fc(out.reshape(B, T, H * K))


A.SelfAttention.attend = attend
D, L, F, B, S, T = (int(x) for x in sys.argv[1:7])
cfg = ModelConfig(src_pad_idx=0, source_vocab_size=32, target_vocab_size=44, max_len=max(S, T) + 1, embed_size=D,
                  heads=4, num_layers=L, dropout=0.0, ffn_dim=F)
rng = np.random.default_rng(0)


def batch():
    src = rng.integers(4, 32, (B, S)).astype(np.int32)
    tgt = rng.integers(4, 44, (B, T + 1)).astype(np.int32)
    return Batch(src, tgt[:, :-1], tgt[:, 1:])


runs = {}
for impl in ("mixed", "head_first"):
    model = fm.Transformer.from_config(cfg, rngs=nnx.Rngs(0))
    for _, m in nnx.iter_modules(model):
        if isinstance(m, A.SelfAttention):
            m.attention_impl = impl
    tr = Trainer(model, TrainConfig(schedule="cosine", learning_rate=2e-3, warmup_steps=800, decay_steps=6000,
                                    label_smoothing=0.1, ema_decay=0.999))
    st = tr.init_state()
    st, m = tr.step(st, batch())
    jax.block_until_ready(m)
    src = jnp.asarray(batch().source)
    jax.block_until_ready(greedy_decode(model, src, T))
    runs[impl] = dict(trainer=tr, state=st, model=model, src=src, step=[], decode=[])
for rnd in range(8):
    for impl, r in runs.items():
        for i in range(5):
            b = batch()
            t0 = time.perf_counter()
            r["state"], m = r["trainer"].step(r["state"], b)
            jax.block_until_ready(m)
            r["step"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        jax.block_until_ready(greedy_decode(r["model"], r["src"], T))
        r["decode"].append(time.perf_counter() - t0)
ms = {impl: {k: 1000 * float(np.median(r[k])) for k in ("step", "decode")} for impl, r in runs.items()}
print(f"D={D} heads 4 L={L}+{L} F={F}, batch B={B} S={S} T={T}; medians of 40 steps and 8 decodes per layout")
for k in ("step", "decode"):
    print(f"  {k}: mixed {ms['mixed'][k]:.1f} ms, head-first {ms['head_first'][k]:.1f} ms, "
          f"mixed / head-first {ms['mixed'][k] / ms['head_first'][k]:.3f}")
