"""A training run: where a directory, its config, its data and its checkpoints meet.

``directory.py`` (``RunDir``: the run's files, its lock and checksums), ``config.py``
(``RunConfig``, ``DataConfig``, ``TrainOptions``), ``run_data.py`` (the run's examples and the
tokenizers it trains or keeps), ``run.py`` (``Run``: start, resume, open), ``launch.py`` (a run
started on every process of a job), ``fit.py`` (the training loop), ``evaluate.py`` and
``generate.py`` (a finished run scored and decoding), ``init_from.py`` and ``tokenizer_from.py``
(weights and tokenizers from elsewhere), ``plot.py`` and ``tensorboard.py`` (what a run draws and
logs). It imports ``scale``, ``train``, ``decode``, ``model`` and ``data``.
"""
