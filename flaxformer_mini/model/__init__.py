"""The model: the Flax NNX twins of the seed modules and the Transformer they make.

``config.py`` (``ModelConfig`` and presets), ``primitives.py`` (Flax layers with PyTorch's
defaults), ``attention.py`` (the seeds' attention modules), ``layers.py`` (blocks, positional
encoding, feed-forward), ``transformer.py`` (``Encoder``, ``Decoder``, ``Transformer``),
``scanned.py`` (stacked layers run by ``nnx.scan``), ``token_checks.py`` (the input checks JAX's
gather skips), ``axes.py`` (each parameter axis's logical name), ``paths.py`` (a parameter's name),
``signature.py`` (the constructor's arguments in ``help()``) and ``memory.py`` (what training
and decoding will allocate). Floor 1, beside ``data``: it imports JAX, Flax and numpy, and
nothing else of the package.
"""
