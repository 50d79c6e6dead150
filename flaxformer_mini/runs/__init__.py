"""A training run, one directory's whole life: its config (``config.py``), files (``directory.py``),
examples (``run_data.py``), the ``Run`` itself (``run.py``), its start on every process
(``launch.py``), memory budget (``budget.py``), training loop (``fit.py``) and progress bar
(``step_rate.py``), its best checkpoint and early stop (``selection.py``); weights and tokenizers from elsewhere (``init_from.py``,
``tokenizer_from.py``); its logs (``tensorboard.py``, ``plot.py``); and a finished run's
``evaluate``, ``generate`` and ``average`` (``evaluate.py``, ``generate.py``, ``average.py``). It
imports every floor below it: ``model``, ``data``, ``train``, ``decode`` and ``scale``.
"""
