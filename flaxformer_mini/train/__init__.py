"""Training a model: the optimizer and its schedule (``optimizer.py``), the loss (``loss.py``),
``TrainState`` (``state.py``), the pure train and eval steps (``step.py``), gradient
accumulation (``accumulation.py``), the ``Trainer`` that compiles them (``trainer.py``), orbax
checkpoints (``checkpoint.py``), stop requests from signals (``stop.py``) and the error a
diverging run stops with (``errors.py``). It imports ``model`` and ``data``.
"""
