"""Decoding a trained model: the key/value cache (``cache.py``), greedy decoding, sampling and
beam search (``search.py``) with their options (``options.py``), corpus metrics (``metrics.py``),
the held-out evaluation of a train state (``evaluation.py``) and text generation in bounded
batches (``generation.py``). It imports ``model`` and ``data``.
"""
