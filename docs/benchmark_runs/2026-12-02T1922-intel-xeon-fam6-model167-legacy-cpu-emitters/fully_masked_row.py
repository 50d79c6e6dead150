"""A model whose source row is all padding (every attention weight masked), run once under
the caller's XLA_FLAGS: prints whether every logit is finite. From the repository root:
`XLA_FLAGS="--xla_backend_optimization_level=0 [--xla_cpu_use_fusion_emitters=false]" PYTHONPATH=. python THIS`."""
import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

import flaxformer_mini as fm

config = fm.ModelConfig(src_pad_idx=0, source_vocab_size=2, target_vocab_size=2, max_len=2,
                        embed_size=2, heads=1, num_layers=1, dropout=0.0)
model = fm.Transformer.from_config(config, rngs=nnx.Rngs(0))
model.eval()
logits = np.asarray(nnx.jit(lambda m, s, t: m(s, t))(model, jnp.asarray([[0, 0]]), jnp.asarray([[0]])))
print(f"{os.environ.get('XLA_FLAGS')}: logits {logits.ravel().tolist()} finite {bool(np.isfinite(logits).all())}")
