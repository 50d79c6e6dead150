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

import dataclasses
import functools
import json
import os
import sys
import time
from typing import NamedTuple

import numpy as np
from flax import nnx

from flaxformer_mini import checkpoint, distributed, tokenizer_from, tokenizers
from flaxformer_mini.data import Batch, DataError, SyntheticTask, TextPairs, Vocab, iter_tsv, read_tsv
from flaxformer_mini.run_config import DataConfig, RunConfig, RunConfigError, TrainOptions, resolve_config
from flaxformer_mini.run_dir import RunDir, comparable_tokenizer_bytes, data_file_checksums, data_file_sha256
from flaxformer_mini.training import Trainer, TrainState, on_default_device


def warn(message):
    """The default ``echo`` of notes and warnings: standard error, since stdout is for results
    (evaluate --json, generate)."""
    print(message, file=sys.stderr)


class RunData(NamedTuple):
    train: object  # SyntheticTask or TextPairs: batch(seed, step, batch_size)
    eval: object  # the held-out examples
    vocabs: tuple | None  # (source Vocab, target Vocab) of a text run

    @property
    def vocab_sizes(self):
        return (self.train.vocab_size,) * 2 if self.vocabs is None else tuple(len(v) for v in self.vocabs)


def _check_held_out_file(config: DataConfig, run_dir: RunDir):
    """An opened text run (evaluate) scores the pairs it held out: its --valid file's, or
    pairs drawn from its training file's lines. That file gone, or changed since the run
    started, would be an error about a path the user never typed, or other pairs (some of
    them trained on) scored under the run's name, silently: refused, naming the file, as a
    resume refuses it. A run that recorded no checksum keeps the old rule (the same path)."""
    key = "valid_path" if config.valid_path else "train_path"
    path = getattr(config, key)
    what = "--valid file" if key == "valid_path" else "training file (the pairs it evaluates on come from its lines)"
    instead = "restore it, or score a file of pairs with `evaluate --data FILE`"
    if not os.path.isfile(path):
        raise RunConfigError(f"{path}: the run's {what}, recorded in {run_dir.config_path} (data.{key}), is not "
                             f"there: {instead}")
    recorded = run_dir.recorded_checksums().get(f"data.{key}")
    if recorded is not None and (found := data_file_sha256(path)) != recorded:
        raise RunConfigError(f"{path}: the run's {what} has changed since the run in {run_dir.path} started (sha256 "
                             f"{found[:12]}..., recorded {recorded[:12]}...), so the pairs it would score are no longer "
                             f"the run's: {instead}")


def load_data(config: DataConfig, run_dir: RunDir, rebuild=True) -> RunData:
    """The run's examples. A text run keeps its saved vocabularies when it has them (a resumed
    run keeps its ids even if the training file changed); a new one builds them from the
    training pairs that fit ``max_len``, so a dropped pair adds no words."""
    if config.kind == "synthetic":
        task = SyntheticTask(config.task, config.vocab_size, config.min_len, config.max_len)
        return RunData(task, task, None)
    if not rebuild:
        _check_held_out_file(config, run_dir)
    if not rebuild and config.valid_path and not os.path.isfile(config.train_path):
        # An opened run (evaluate, generate) whose training file moved since: its saved
        # vocabularies and its --valid file are all that evaluating needs.
        vocabs = run_dir.load_vocabularies(config)
        valid = read_tsv(config.valid_path, config.columns)
        return RunData(None, _text_pairs(config.valid_path, valid, vocabs, config), vocabs)
    rows = list(iter_tsv(config.train_path, config.columns))  # (line number, source, target)
    held_out = []
    if config.valid_path is None and config.holdout:
        # A fixed split (seed 0): the same file always holds out the same pairs.
        n = min(config.holdout, len(rows) // 10)
        chosen = set(np.random.default_rng(0).choice(len(rows), size=n, replace=False).tolist()) if n else set()
        held_out = [(source, target) for i, (_, source, target) in enumerate(rows) if i in chosen]
        rows = [row for i, row in enumerate(rows) if i not in chosen]
    pairs = [(source, target) for _, source, target in rows]
    if run_dir.has_vocabularies(config) or not rebuild:  # evaluate: a missing file is an error naming it
        vocabs = run_dir.load_vocabularies(config)
    elif config.tokenizer_from is not None:  # a new run numbering its tokens as an earlier run did
        vocabs = tokenizer_from.load(config)
    else:
        vocabs = build_tokenizers(config, pairs)
    train = _text_pairs(config.train_path, pairs, vocabs, config, held_out=len(held_out),
                        line_numbers=[line for line, _, _ in rows])
    if config.valid_path:
        valid = _text_pairs(config.valid_path, read_tsv(config.valid_path, config.columns), vocabs, config)
    else:
        valid = _text_pairs(config.train_path, held_out, vocabs, config) if held_out else train
    return RunData(train, valid, vocabs)


def _text_pairs(path, pairs, vocabs, config, held_out=0, line_numbers=None):
    """TextPairs of ``pairs`` read from ``path``; every pair too long is an error naming the
    file and the option that raises the limit (and the ``held_out`` pairs of the file that
    the count leaves out, so that it adds up to the file's)."""
    try:
        return TextPairs(pairs, *vocabs, config.model_max_len, line_numbers=line_numbers)
    except DataError as e:
        aside = f"; the file's other {held_out} pairs are held out for validation (no --valid)" if held_out else ""
        raise DataError(f"{path}: {e} (--max-len {config.model_max_len}: a side's tokens plus its EOS){aside}; "
                        f"--max-len raises the limit") from None


def build_tokenizers(config: DataConfig, pairs):
    """(source, target) tokenizers trained on the training ``pairs`` that can be kept (the
    same object twice with ``shared_vocab``).

    A side longer than max_len whitespace words (word), or characters (char), is a pair
    TextPairs will drop, so it adds nothing to the vocabulary. A subword side has at least
    as many pieces as words, so a pair over the limit in words is left out of bpe/unigram
    training too (a pair that fits in words but not in pieces still trains them: its
    pieces are only known after training)."""
    kind = config.tokenizer
    if kind == "char":
        normalize = tokenizers._normalizer().normalize_str  # built once: tokenizers.normalize builds it per call
        size = lambda text: len(normalize(text))  # noqa: E731
    else:
        size = lambda text: len(text.split())  # noqa: E731
    kept = [(s, t) for s, t in pairs if max(size(s), size(t)) <= config.max_len]
    if kind == "word" and not config.shared_vocab and config.tokenizer_vocab_size is None:
        return Vocab.build([s for s, _ in kept]), Vocab.build([t for _, t in kept])  # today's exactly

    def fit(texts):
        tokenizer = tokenizers.train(kind, texts, config.tokenizer_vocab_size)
        return tokenizer.vocab if kind == "word" else tokenizer  # word: the Vocab, its files as today

    if config.shared_vocab:
        shared = fit([s for s, _ in kept] + [t for _, t in kept])
        return shared, shared
    return fit([s for s, _ in kept]), fit([t for _, t in kept])


class Codec:
    """Text <-> token ids in a run's own format: a synthetic task's integers, or text through
    the run's tokenizers (words, characters or subwords)."""

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


class _PairNames:
    """``names[i]``: training pair i as ``file:line`` and the start of its source, for the one
    error that names it (built on demand: no string per pair is kept)."""

    SHOWN = 60  # characters of the source: a pair over a budget is long, and the line number finds it

    def __init__(self, pairs, path):
        self.pairs, self.path = pairs, path

    def __getitem__(self, i):
        lines = self.pairs.line_numbers
        where = f"{self.path}:{lines[i]}" if lines is not None else str(self.path)
        source = self.pairs.source_vocab.decode(self.pairs.sources[i])
        shown = source if len(source) <= self.SHOWN else source[: self.SHOWN] + "..."
        return f"{where}: the pair whose source is {shown!r}"


class Run:
    """A run directory with its config and (loaded on first use) its data."""

    def __init__(self, directory: RunDir, config: RunConfig, data: RunData | None = None):
        self.dir, self.config, self._data = directory, config, data
        self._lock = None  # held from create() to close(): one training process per directory
        self._init_params = None  # a new --init-from run: the file's parameters, read by start()

    def close(self):
        """Release the run directory for another ``train``."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @classmethod
    def start(cls, out, options: TrainOptions, data_config: DataConfig, echo=warn):
        """A new run in ``out`` from the user's options, or the run already there when the
        options give the same config (then it resumes)."""
        run_dir = RunDir(out)
        # Another tokenizer or vocabulary size: refused before any is trained. By process 0 alone:
        # the others were started with its options (cli's agree_on) and may read the same file
        # at another path on their host, which the recorded path would refuse on resume.
        if distributed.is_main():
            run_dir.check_data(data_config)
        data = load_data(data_config, run_dir)
        config = resolve_config(options, data_config, *data.vocab_sizes)
        params = None
        if options.init_from is not None:  # recorded (path, sha256): a resume checks both
            from flaxformer_mini import init_from

            if run_dir.exists():  # a resume: the checkpoints hold the run; the file may have moved or gone
                recorded = init_from.for_resume(run_dir.load_config().init_from, options.init_from, echo)
                config = dataclasses.replace(config, init_from=recorded)
            else:  # a new run: the file must fit its model before anything is written
                config = dataclasses.replace(config, init_from=init_from.record(options.init_from))
                params, notes = init_from.read_params(config.init_from.path, config, preset=options.preset)
                for note in notes:
                    echo(note)
                if data_config.kind == "tsv":  # which token each embedding row is: checked where the file says
                    init_from.check_tokenizers(options.init_from, init_from.recorded_tokenizers(config.init_from.path),
                                               run_dir.vocabulary_checksums(data.vocabs, data_config),
                                               data_config.tokenizer_from, data_config.train_path, echo)
        run = cls.create(out, config, data, echo=echo)
        run._init_params = params
        return run

    @classmethod
    def create(cls, out, config: RunConfig, data: RunData | None = None, echo=warn):
        """Write ``config`` into ``out`` (or check it against the run there) and save the
        vocabularies; nothing is written when the config does not fit."""
        run_dir = RunDir(out)
        data = data if data is not None else load_data(config.data, run_dir)
        asked_run = cls(run_dir, config, data)
        if not distributed.is_main():  # scale-out: process 0 alone writes (and locks) the run's files
            # and checks --max-tokens: this process may hold a tokenizer of its own until it adopts
            # process 0's (follow_main), and would then check other lengths than it trains on.
            return asked_run
        if config.max_tokens is not None:
            asked_run.token_batcher  # an example over the budget is refused here, before anything is written
        checksums = run_dir.vocabulary_checksums(data.vocabs, config.data) if data.vocabs is not None else {}
        checksums.update(data_file_checksums(config.data))  # a file changed later is refused on resume
        asked = config
        resuming, lock, config = run_dir.start_or_resume(config, checksums)
        for key, was, now in run_dir.moved_data:
            echo(f"note: the run's {'training' if key == 'train_path' else 'validation'} file moved from {was} to "
                 f"{now} (the same contents, by sha256); the run reads it there from now on")
        if resuming:
            for name in ("scan_layers", "remat"):
                if getattr(asked, name) and not getattr(config, name):  # absent from an older config.json
                    echo(f"note: the run in {out} was written before --{name.replace('_', '-')} existed and "
                         f"resumes without it, as it was trained")
        if config.data != asked.data:  # a run written before a data setting existed keeps its old one
            data = load_data(config.data, run_dir)
        if data.vocabs is not None and not run_dir.has_vocabularies(config.data):
            try:
                run_dir.save_vocabularies(data.vocabs, config.data)  # refused if a rebuilt one differs from the recorded
            except BaseException:
                lock.release()
                raise
            if resuming:
                source = (f"copied them again from --tokenizer-from {config.data.tokenizer_from}"
                          if config.data.tokenizer_from else f"rebuilt them from {config.data.train_path}")
                echo(f"note: the run's vocabularies were missing; {source}"
                     + (" (identical to the recorded ones)" if run_dir.recorded_checksums() else ""))
        # The run as written: an older run's own config where it lacks a newer setting.
        run = asked_run if config == asked and data is asked_run.data else cls(run_dir, config, data)
        run._lock = lock
        if not resuming:
            run._report_dropped(echo)
            run._report_smaller_vocabularies(echo)
        return run

    def follow_main(self):
        """Scale-out: this run with process 0's config and tokenizers, on every process.

        Process 0 resolves a resumed run's config against its config.json (a run written
        before a setting existed keeps its old value); the others were started with today's
        options and would otherwise train with today's defaults, on other data, silently. The
        data files' paths stay this host's own (their contents are checked equal by cli's
        agree_on).

        A new text run's tokenizers are trained by every process, and one trained elsewhere
        may number its tokens otherwise: Hugging Face's unigram trainer is not deterministic
        (its pieces' order and scores may change from one process to the next, tokenizers 0.23).
        Equal vocabulary sizes would hide it: each host would train on other ids. So every
        process adopts the files process 0 saved (written before cli's second ``all_started``, in
        a directory ``agree_on_shared_directory`` showed them all)."""
        if not distributed.is_multiprocess():
            return self
        text = json.dumps(self.config.to_dict(), sort_keys=True).encode()
        main = RunConfig.from_dict(json.loads(distributed.allgather_bytes(text)[0]), source="process 0's config")
        main = dataclasses.replace(main, data=dataclasses.replace(
            main.data, train_path=self.config.data.train_path, valid_path=self.config.data.valid_path))
        if main == self.config and not self._tokenizers_differ_from_saved():
            return self
        run = Run(self.dir, main, load_data(main.data, self.dir))
        run._lock, self._lock = self._lock, None
        return run

    def _tokenizers_differ_from_saved(self):
        """Whether this process's tokenizers are other than the files in the run directory
        (process 0's; this is one of the others). A synthetic run has none."""
        if distributed.is_main() or self.data.vocabs is None:
            return False
        saved = self.dir.load_vocabularies(self.config.data)  # checked against the recorded checksums
        return [comparable_tokenizer_bytes(v) for v in saved] != [comparable_tokenizer_bytes(v) for v in self.data.vocabs]

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
        if self._data is None:  # an opened run (evaluate): its saved tokenizers, never rebuilt ones
            self._data = load_data(self.config.data, self.dir, rebuild=False)
        return self._data

    @functools.cached_property
    def codec(self):
        """The run's text format; reads the saved vocabularies, not the training data."""
        d = self.config.data
        if d.kind == "synthetic":
            return Codec(task=SyntheticTask(d.task, d.vocab_size, d.min_len, d.max_len))
        return Codec(vocabs=self._data.vocabs if self._data is not None else self.dir.load_vocabularies(d))

    def _report_smaller_vocabularies(self, echo):
        """unigram (and a word vocabulary of fewer distinct words) may hold fewer tokens than
        --vocab-size asked for: said, since the model's embedding is sized by what was learnt."""
        d = self.config.data
        if (d.kind != "tsv" or d.tokenizer_vocab_size is None or d.tokenizer_from is not None or self._data is None
                or self._data.vocabs is None):
            return  # --tokenizer-from: RUN's tokenizers and their --vocab-size, which no one typed here
        sides = ("shared",) if d.shared_vocab else ("source", "target")
        sizes = dict(zip(sides, (len(v) for v in self._data.vocabs)))
        smaller = {side: n for side, n in sizes.items() if n < d.tokenizer_vocab_size}
        if smaller:
            echo(f"note: --vocab-size {d.tokenizer_vocab_size} asked for, the {d.tokenizer} tokenizer learnt "
                 + ", ".join(f"{n} ({side})" for side, n in smaller.items())
                 + ": all the training text gave it; the model's vocabulary is that size")

    def _report_dropped(self, echo):
        for name, pairs in (("training", self.data.train), ("validation", self.data.eval)):
            if isinstance(pairs, TextPairs) and pairs.dropped and (name == "training" or pairs is not self.data.train):
                echo(f"note: {pairs.dropped} {name} pair(s) longer than --max-len {pairs.max_len} allows "
                     f"({pairs.max_len - 1} tokens plus EOS) were dropped (the longest had {pairs.longest_dropped} "
                     f"tokens); " + ("--max-len raises the limit" if self.config.init_from is None else
                                     "the --init-from weights fix --max-len (their position table): a subword "
                                     "tokenizer that splits the new text into more pieces drops more pairs"))

    # --- model, state and checkpoints

    @functools.cached_property
    def trainer(self):
        """The compiled steps, built from the model's shapes (``nnx.eval_shape``): the random
        init, eager and op by op, is made only for a state that starts from it
        (``initial_state``), never for one a checkpoint overwrites (``latest_state``, read by
        evaluate and generate, and a resume). Measured on a tiny run (AMD EPYC family 25
        model 1, fresh processes, no compilation cache): ``generate`` of one line 5.1-5.4 s
        -> 3.3-3.4 s, a resumed ``train`` of 2 steps 10.4-11.4 s -> 7.5-7.6 s."""
        return Trainer(nnx.eval_shape(self._new_model), self.config.train)

    def _new_model(self):
        return self.config.build_model(nnx.Rngs(self.config.train.seed))

    def checkpoints(self, max_to_keep=3):
        return checkpoint.open_manager(self.dir.checkpoints.absolute(), max_to_keep=max_to_keep)

    def restore_or_init(self, manager, echo=warn, place=None):
        """The state of the newest readable checkpoint in ``manager``, or a fresh one at step
        0 (``initial_state``). ``place(tree)`` lays a state out (sharding.shard_state; shapes
        alone it gives their layout): orbax restores into the template's layout, whatever
        layout the checkpoint was saved from. The template is the state's shapes alone, so a
        resume makes no random init for the checkpoint to overwrite. Damaged newer
        checkpoints are skipped, said so, and moved out of the way into
        ``OUT/damaged_checkpoints/`` by process 0 (kept for inspection; the run saves those
        steps again).

        Several processes resume from the same step: the newest that every one of them could
        read. With FSDP each process reads only its own shards, so one may find a checkpoint
        damaged that another read; that one is then skipped by all."""
        place = place or (lambda tree: tree)
        state, skipped, template = None, {}, None
        if manager.latest_step() is not None:
            template = place(self.trainer.state_template())
            state, unreadable = checkpoint.restore_latest_intact(manager, template)
            skipped = dict(unreadable)
        state, skipped = self._agree_on_restored_step(manager, template, state, skipped)
        if state is None:  # no checkpoint read: a random init, or the --init-from file's weights
            state = place(self.initial_state(echo))
        else:  # the dropout streams checkpoint.restore made up (never saved), laid out as the rest
            state = state.replace(other=place(state.other))
        if not skipped:
            return state
        if distributed.is_main():
            aside = self.path / "damaged_checkpoints"
            aside.mkdir(exist_ok=True)
            for step, why in sorted(skipped.items(), reverse=True):
                target = aside / f"{step}.{time.strftime('%Y%m%d-%H%M%S')}"
                os.replace(self.dir.checkpoints / str(step), target)
                echo(f"warning: checkpoint {step} cannot be read ({why}); moved to {target}, "
                     f"resuming from step {int(state.step)}")
        # Then every process rereads the directory: a manager that still listed a moved step
        # would raise StepAlreadyExistsError when the run saves that step again, while process
        # 0 waited for it in orbax's barrier.
        distributed.barrier("damaged checkpoints moved aside")
        manager.reload()
        return state

    def initial_state(self, echo=warn):
        """Step 0's state: a random init, or with ``--init-from`` the file's parameters (read
        again, checked against its recorded sha256 by ``start``, when the run was resumed
        before its first checkpoint) and a fresh optimizer: loaded into the state's shapes,
        with no random init for the file to overwrite."""
        if self.config.init_from is None:  # the seed's random init
            return TrainState.create(self._new_model(), self.config.train)
        from flaxformer_mini import init_from

        params, self._init_params = self._init_params, None  # host memory back once loaded
        if params is None:
            params, _ = init_from.read_params(self.config.init_from.path, self.config)
        echo(f"starting from the weights of {self.config.init_from.path}")
        # Laid out as a fresh or restored state (training.on_default_device says why).
        return on_default_device(init_from.load_into_state(self.trainer.state_template(), params))

    @staticmethod
    def _agree_on_restored_step(manager, template, state, skipped):
        """(state, {step: why}) at the newest step every process restored (state None where
        none restored any); a process that had read a newer one restores the agreed step
        again. Refused by name when the processes list different checkpoint steps (not one
        shared directory)."""
        if not distributed.is_multiprocess():
            return state, skipped
        mine = {"steps": sorted(manager.all_steps()), "restored": -1 if state is None else int(state.step),
                "skipped": {str(step): why for step, why in skipped.items()}}
        everyone = [json.loads(b) for b in distributed.allgather_bytes(json.dumps(mine, sort_keys=True).encode())]
        distributed.refuse_differences([{"checkpoint steps in the run directory": p["steps"]} for p in everyone],
                                       "the processes see different checkpoints",
                                       "--out must be one directory shared by every process (a shared file system).")
        agreed = min(p["restored"] for p in everyone)
        if state is not None and int(state.step) != agreed:
            state = checkpoint.restore(manager, template, agreed) if agreed >= 0 else None
        skipped = {}
        for i, p in enumerate(everyone):
            for step, why in p["skipped"].items():
                skipped.setdefault(int(step), why if i == distributed.process_index() else f"process {i}: {why}")
        for step in mine["steps"]:
            if step > agreed and step not in skipped:
                skipped[step] = "unreadable on another process"
        return state, skipped

    def latest_state(self, echo=warn):
        """The newest readable checkpoint's state (damaged newer ones are skipped and named,
        left in place); an error naming the run when it has none."""
        manager = self.checkpoints()
        if manager.latest_step() is None:
            raise FileNotFoundError(f"{self.path}: the run has no checkpoint yet")
        state, skipped = checkpoint.restore_latest_intact(manager, self.trainer.state_template())
        for step, why in skipped:
            echo(f"warning: checkpoint {step} cannot be read ({why}); using step {int(state.step)}")
        return state

    # --- training batches

    def train_batches(self, step):
        """The micro-batches of optimizer update ``step`` (one, or ``accumulate`` of them): a
        function of (seed, step) alone, so a resumed run sees the same batches. Micro-batch j
        of update k is the data stream's batch k * accumulate + j."""
        k = self.config.accumulate
        return [self._batch(step * k + j) for j in range(k)]

    def _batch(self, index):
        if self.data.train is None:  # an opened run whose training file moved (load_data)
            raise FileNotFoundError(f"{self.config.data.train_path}: the run's training file is not there")
        seed = self.config.train.seed
        if self.config.max_tokens is None:
            return self.data.train.batch(seed, index, self.config.batch_size)
        return self.data.train.batch_of_rows(self.token_batcher.rows(seed, index), max_tokens=self.config.max_tokens)

    @functools.cached_property
    def token_batcher(self):
        """--max-tokens batches over the training pairs (batching.TokenBatcher); an example
        that alone exceeds the budget is an error naming it."""
        from flaxformer_mini.batching import TokenBatcher

        train = self.data.train
        return TokenBatcher(train.source_lengths, train.target_lengths, self.config.max_tokens,
                            length_multiple=train.length_multiple, names=_PairNames(train, self.config.data.train_path))

    # --- held-out data

    def eval_batches(self, batch_size=None, limit=None):
        """The held-out batches: the same examples whatever ``batch_size``. Synthetic:
        ``eval_sequences`` drawn from the evaluation stream. Text: the held-out pairs in order,
        or ``limit`` of them (a fixed sample) when given."""
        batch_size = batch_size or self.config.batch_size
        data = self.config.data
        if data.kind == "synthetic":
            every = self.data.eval.held_out(self.config.train.seed, data.eval_sequences)
            return [Batch(*(a[i : i + batch_size] for a in every)) for i in range(0, data.eval_sequences, batch_size)]
        indices = None if limit is None else self.data.eval.sample_indices(limit)
        return list(self.data.eval.iter_eval_batches(batch_size, indices))

    def describe_evaluation(self):
        """What the evaluation during training reads, in words (text runs), or None."""
        d = self.config.data
        if d.kind == "synthetic":
            return None
        total = len(self.data.eval)
        used = total if d.eval_pairs is None else min(d.eval_pairs, total)
        if self.data.eval is self.data.train:  # no hold-out asked, or too few pairs to hold out a tenth
            why = "too few pairs to hold a tenth out" if d.holdout else "none held out"
            return (f"evaluating on {used} of {total} training pairs themselves (no --valid, and {why}); "
                    f"--valid gives held-out pairs")
        where = "--valid" if d.valid_path else f"{total} training pairs held out (no --valid)"
        return f"evaluating on {used} of {total} held-out pairs from {where}; --valid-size sets how many"
