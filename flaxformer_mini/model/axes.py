"""Logical axis names: what each axis of a parameter *is*, named where the parameter is made.

Every parameter is created with the logical names of its axes (``primitives.py`` stores them in
NNX's sharding metadata), so the model says what an axis is and never where it goes: a Q/K/V
kernel is ``('embed', 'heads')``, the attention output projection ``('heads', 'embed')``.
Where each name goes on a device mesh is one rules table, ``scale/partitioning.py``, as in
flaxformer and t5x (``docs/usage/partitioning.md``). Shape legend: D width, H heads, K head
width, F feed-forward width, V vocabulary, P max_len (the position table's rows).

| logical name | axis of                                                       | size |
| ------------ | ------------------------------------------------------------- | ---- |
| ``vocab``    | token embeddings' rows, the output projection's columns       | V    |
| ``embed``    | the model width everywhere (LayerNorm, residual side)         | D    |
| ``heads``    | the joined heads: Q/K/V outputs, the attention output's input | H*K  |
| ``kv``       | one head (seed 003's per-head K x K projections)              | K    |
| ``mlp``      | the feed-forward hidden units                                 | F    |
| ``length``   | the learned position table's rows                             | P    |
"""

VOCAB, EMBED, HEADS, KV, MLP, LENGTH = "vocab", "embed", "heads", "kv", "mlp", "length"
