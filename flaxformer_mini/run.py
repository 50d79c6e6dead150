"""A training run: one directory's whole lifecycle, from options to a finished model.

    run = Run.start(out, TrainOptions(...), DataConfig(...))   # new, or resume the run in `out`
    state = run.restore_or_init(manager)                       # the latest checkpoint, or step 0
    ...                                                        # fit.fit trains it
    run = Run.open(out)                                        # a finished run: evaluate, generate
    state = run.latest_state()
    ids, unknown = run.codec.encode("5 3 9")

``Run`` resolves the config from the options and the data (the vocabulary sizes come from
the data), writes it or checks it against the run already there, saves the vocabularies,
builds the model and its train state, and opens the checkpoints. ``train``, ``evaluate``
and ``generate`` all go through it; the files themselves are ``RunDir``'s.
"""

import functools
from typing import NamedTuple

from flax import nnx

from flaxformer_mini import checkpoint, distributed
from flaxformer_mini.data import Batch, SyntheticTask, TextPairs, Vocab, read_tsv
from flaxformer_mini.model import Transformer
from flaxformer_mini.run_config import DataConfig, RunConfig, TrainOptions, resolve_config
from flaxformer_mini.run_dir import RunDir
from flaxformer_mini.training import Trainer


class RunData(NamedTuple):
    train: object  # SyntheticTask or TextPairs: batch(seed, step, batch_size)
    eval: object  # the held-out examples
    vocabs: tuple | None  # (source Vocab, target Vocab) of a text run

    @property
    def vocab_sizes(self):
        return (self.train.vocab_size,) * 2 if self.vocabs is None else tuple(len(v) for v in self.vocabs)


def load_data(config: DataConfig, run_dir: RunDir) -> RunData:
    """The run's examples. A text run keeps its saved vocabularies when it has them (a resumed
    run keeps its ids even if the training file changed); a new one builds them from the
    training pairs that fit ``max_len``, so a dropped pair adds no words."""
    if config.kind == "synthetic":
        task = SyntheticTask(config.task, config.vocab_size, config.min_len, config.max_len)
        return RunData(task, task, None)
    pairs = read_tsv(config.train_path)
    if run_dir.has_vocabularies():
        vocabs = run_dir.load_vocabularies()
    else:
        # Whitespace words are the word vocabulary's tokens: a side longer than max_len words
        # is a pair TextPairs will drop.
        kept = [(s, t) for s, t in pairs if max(len(s.split()), len(t.split())) <= config.max_len]
        vocabs = (Vocab.build([s for s, _ in kept]), Vocab.build([t for _, t in kept]))
    train = TextPairs(pairs, *vocabs, config.model_max_len)
    valid = TextPairs(read_tsv(config.valid_path), *vocabs, config.model_max_len) if config.valid_path else train
    return RunData(train, valid, vocabs)


class Codec:
    """Text <-> token ids in a run's own format: a synthetic task's integers, or words."""

    def __init__(self, task: SyntheticTask | None = None, vocabs=None):
        self._task, self._vocabs = task, vocabs

    def encode(self, text):
        """(ids, unknown words mapped to UNK)."""
        if self._task is not None:
            return self._task.encode_text(text), []
        source = self._vocabs[0]
        return source.encode(text), source.unknown_words(text)

    def decode(self, ids):
        return self._task.decode_ids(ids) if self._task is not None else self._vocabs[1].decode(ids)


class Run:
    """A run directory with its config and (loaded on first use) its data."""

    def __init__(self, directory: RunDir, config: RunConfig, data: RunData | None = None):
        self.dir, self.config, self._data = directory, config, data

    @classmethod
    def start(cls, out, options: TrainOptions, data_config: DataConfig, echo=print):
        """A new run in ``out`` from the user's options, or the run already there when the
        options give the same config (then it resumes)."""
        run_dir = RunDir(out)
        data = load_data(data_config, run_dir)
        config = resolve_config(options, data_config, *data.vocab_sizes)
        return cls.create(out, config, data, echo=echo)

    @classmethod
    def create(cls, out, config: RunConfig, data: RunData | None = None, echo=print):
        """Write ``config`` into ``out`` (or check it against the run there) and save the
        vocabularies; nothing is written when the config does not fit."""
        run_dir = RunDir(out)
        data = data if data is not None else load_data(config.data, run_dir)
        if not distributed.is_main():  # scale-out: process 0 alone writes (and locks) the run's files
            return cls(run_dir, config, data)
        resuming = run_dir.start_or_resume(config)
        if data.vocabs is not None and not run_dir.has_vocabularies():
            run_dir.save_vocabularies(data.vocabs)
        run = cls(run_dir, config, data)
        if not resuming:
            run._report_dropped(echo)
        return run

    @classmethod
    def open(cls, out):
        """The run in ``out``, as ``evaluate`` and ``generate`` read it."""
        run_dir = RunDir(out)
        return cls(run_dir, run_dir.load_config())

    @property
    def path(self):
        return self.dir.path

    @property
    def data(self) -> RunData:
        if self._data is None:
            self._data = load_data(self.config.data, self.dir)
        return self._data

    @functools.cached_property
    def codec(self):
        """The run's text format; reads the saved vocabularies, not the training data."""
        d = self.config.data
        if d.kind == "synthetic":
            return Codec(task=SyntheticTask(d.task, d.vocab_size, d.min_len, d.max_len))
        return Codec(vocabs=self._data.vocabs if self._data is not None else self.dir.load_vocabularies())

    def _report_dropped(self, echo):
        for name, pairs in (("training", self.data.train), ("validation", self.data.eval)):
            if isinstance(pairs, TextPairs) and pairs.dropped and (name == "training" or pairs is not self.data.train):
                echo(f"note: {pairs.dropped} {name} pair(s) longer than max_len={self.config.data.max_len} tokens "
                     f"were dropped (the longest had {pairs.longest_dropped}); --max-len raises the limit")

    # --- model, state and checkpoints

    @functools.cached_property
    def trainer(self):
        model = Transformer.from_config(self.config.model, dtype=self.config.compute_dtype,
                                        rngs=nnx.Rngs(self.config.train.seed))
        return Trainer(model, self.config.train)

    def checkpoints(self, max_to_keep=3):
        return checkpoint.open_manager(self.dir.checkpoints.absolute(), max_to_keep=max_to_keep)

    def restore_or_init(self, manager, place=None):
        """The state of the latest checkpoint in ``manager``, or a fresh one at step 0.
        ``place(state)`` lays the template out first (sharding.shard_state): orbax restores
        into the template's layout, whatever layout the checkpoint was saved from."""
        state = self.trainer.init_state()
        state = state if place is None else place(state)
        return checkpoint.restore(manager, state) if manager.latest_step() is not None else state

    def latest_state(self):
        """The latest checkpoint's state; an error naming the run when it has none."""
        manager = self.checkpoints()
        if manager.latest_step() is None:
            raise FileNotFoundError(f"{self.path}: the run has no checkpoint yet")
        return checkpoint.restore(manager, self.trainer.init_state())

    # --- held-out data

    def eval_batches(self, batch_size=None):
        """The held-out batches: the same examples whatever ``batch_size``. Synthetic:
        ``eval_sequences`` drawn from the evaluation stream. Text: every held-out pair once,
        in order."""
        batch_size = batch_size or self.config.batch_size
        data = self.config.data
        if data.kind == "synthetic":
            every = self.data.eval.held_out(self.config.train.seed, data.eval_sequences)
            return [Batch(*(a[i : i + batch_size] for a in every)) for i in range(0, data.eval_sequences, batch_size)]
        return list(self.data.eval.iter_eval_batches(batch_size))
