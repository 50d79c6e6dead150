"""A training run: one directory's whole lifecycle, from options to a finished model.

    >>> import tempfile
    >>> from flaxformer_mini.runs.config import DataConfig, TrainOptions
    >>> from flaxformer_mini.runs.run import Run
    >>> from flaxformer_mini.train import checkpoint
    >>> out = tempfile.mkdtemp()
    >>> data = DataConfig(kind="synthetic", task="copy", vocab_size=11, max_len=5)
    >>> run = Run.start(out, TrainOptions(preset="tiny", num_layers=1), data)  # or resume the run in out
    >>> state = run.restore_or_init(run.checkpoints())  # the latest checkpoint, or step 0
    >>> checkpoint.save(run.checkpoints(), state)  # runs.fit.fit(run, steps) trains, evaluates and saves
    0
    >>> run.close()  # the directory's lock, for another train
    >>> finished = Run.open(out)  # a run as evaluate and generate read it
    >>> int(finished.latest_state().step)
    0
    >>> finished.codec.encode("5 3 6")  # ids, and the words outside the vocabulary
    ([9, 7, 10], [])

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
from pathlib import Path

from flax import nnx

from flaxformer_mini.data import Batch, SyntheticTask, TextPairs
from flaxformer_mini.data.codec import Codec
from flaxformer_mini.data.token_batches import TokenBatcher
from flaxformer_mini.runs import budget, init_from
from flaxformer_mini.runs.config import DataConfig, RunConfig, RunConfigError, TrainOptions, resolve_config
from flaxformer_mini.runs.directory import (RunDir, best_of, comparable_tokenizer_bytes, data_file_checksums,
                                            not_a_run)
from flaxformer_mini.runs.run_data import UNKNOWN_NOTE_RATE, RunData, load_data, unknown_tokens_note
from flaxformer_mini.scale import distributed
from flaxformer_mini.train import checkpoint
from flaxformer_mini.train.state import TrainState, on_default_device
from flaxformer_mini.train.trainer import Trainer


# A training file of this many bytes or more takes seconds to minutes to read, train
# tokenizers on and encode before anything else is printed: said before and after, so a
# long silence before the first step is not taken for a hang.
LARGE_TRAINING_FILE_BYTES = 8 << 20


# A word vocabulary this large (one side) is said, with what it costs: see
# Run._report_large_word_vocabularies.
LARGE_WORD_VOCABULARY = 100_000


def _large_training_file(data_config):
    """The size of a text run's training file when it is large, else None."""
    if data_config.kind != "tsv":
        return None
    try:
        size = os.path.getsize(data_config.train_path)
    except OSError:  # missing or unreadable: load_data's error names it
        return None
    return size if size >= LARGE_TRAINING_FILE_BYTES else None


def warn(message):
    """The default ``echo`` of notes and warnings: standard error, since stdout is for results
    (evaluate --json, generate)."""
    print(message, file=sys.stderr)


class _PairNames:
    """``names[i]``: training pair i as ``file:line`` and the start of its source, for the one
    error that names it (built on demand: no string per pair is kept)."""

    SHOWN = 60  # characters of the source: a pair over a budget is long, and the line number finds it

    def __init__(self, pairs, path):
        self.pairs, self.path = pairs, path

    def __getitem__(self, i):
        lines = self.pairs.line_numbers
        where = f"{self.path}:{lines[i]}" if lines is not None else str(self.path)
        source = self.pairs.source_vocab.decode(self.pairs.source(i))
        shown = source if len(source) <= self.SHOWN else source[: self.SHOWN] + "..."
        return f"{where}: the pair whose source is {shown!r}"


class Run:
    """A run directory with its config and (loaded on first use) its data."""

    def __init__(self, directory: RunDir, config: RunConfig, data: RunData | None = None, best=False):
        self.dir, self.config, self._data = directory, config, data
        self.best = best  # opened as RUN/best: latest_state reads the best checkpoint (train --best-metric)
        self._lock = None  # held from create() to close(): one training process per directory
        self._init_params = None  # a new --init-from run: the file's parameters, read by start()
        self._init_path = None  # a resumed one: where the file is, when it moved with its contents

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
        if size := _large_training_file(data_config):
            tokenizers = ("its tokenizers saved in the run" if run_dir.has_vocabularies(data_config) else
                          f"the tokenizers of --tokenizer-from {data_config.tokenizer_from}" if data_config.tokenizer_from
                          else f"{data_config.tokenizer} tokenizers trained on it")
            echo(f"reading {data_config.train_path} ({size / 2**20:.0f} MiB) and encoding its pairs with {tokenizers}")
            started = time.monotonic()
        data = load_data(data_config, run_dir)
        if size:
            echo(f"read {len(data.train):,} training and {len(data.eval):,} held-out pairs in "
                 f"{time.monotonic() - started:.0f} s")
        config = resolve_config(options, data_config, *data.vocab_sizes)
        budget.check_training(config, data.train)  # before anything is written
        budget.check_evaluation(config)
        params, init_path = None, None
        if options.init_from is not None:  # recorded (path, sha256): a resume checks both
            if run_dir.exists():  # a resume: the checkpoints hold the run; the file may have moved or gone
                recorded = init_from.for_resume(run_dir.load_config().init_from, options.init_from, echo)
                config = dataclasses.replace(config, init_from=recorded)
                given = os.path.abspath(options.init_from)
                if recorded is not None and os.path.exists(given) and init_from.digest(given) == recorded.sha256:
                    init_path = given  # moved with its contents: a run with no checkpoint yet reads it here
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
        run._init_params, run._init_path = params, init_path
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
            if asked.train.ema_decay is not None and config.train.ema_decay is None:  # as --scan-layers above
                echo(f"note: the run in {out} was written before --ema existed and resumes without it, as it was "
                     f"trained")
            if asked.evaluation != config.evaluation:  # absent from an older config.json (a difference is refused)
                echo(f"note: the run in {out} was written before --best-metric and --eval-beam-size existed and "
                     f"resumes without them: greedy evaluations, no best checkpoint, no --patience")
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
            run._report_training_unknowns(echo)
            run._report_large_word_vocabularies(echo)
            run._report_unknown_tokens(echo)
            run._report_held_out_duplicates(echo)
        return run

    def follow_main(self):
        """Scale-out: this run with process 0's config and tokenizers, on every process.

        Process 0 resolves a resumed run's config against its config.json (a run written
        before a setting existed keeps its old value); the others were started with the
        command's options and would otherwise train with their defaults, on other data, silently. The
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
        """The run in ``out``, as ``evaluate`` and ``generate`` read it; ``RUN/best`` opens RUN
        reading its best checkpoint (``latest_state``). Where ``out`` is
        something else a user may hand them (a weights file, one checkpoint of a run,
        ``parity convert``'s orbax directory), the error says what it is and what to give."""
        best = best_of(out)
        if best is not None:  # RUN/best: the run, reading its best checkpoint
            return cls(RunDir(best), RunDir(best).load_config(), best=True)
        run_dir = RunDir(out)
        try:
            return cls(run_dir, run_dir.load_config())
        except RunConfigError:
            problem = not_a_run(Path(out))
            if problem is None:
                raise
            raise RunConfigError(f"{out}: {problem}") from None

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

    def _report_training_unknowns(self, echo):
        """A --vocab-size that leaves much of the training text outside the vocabulary (a word
        tokenizer keeps only its most frequent words): the model learns to write <unk> for it,
        which no later warning about a --valid file explains."""
        d = self.config.data
        if d.kind != "tsv" or d.tokenizer_vocab_size is None or d.tokenizer_from is not None:
            return
        rates = dict(zip(("source", "target"), self.data.train.unknown_rates()))
        high = {side: rate for side, rate in rates.items() if rate > UNKNOWN_NOTE_RATE}
        if high:
            said = " and ".join(f"{rate:.1%} of the {side} tokens" for side, rate in high.items())
            echo(f"note: --vocab-size {d.tokenizer_vocab_size} leaves {said} of {d.train_path} outside the "
                 f"{d.tokenizer} vocabulary, read as <unk>; a larger --vocab-size"
                 + (", or --tokenizer bpe or unigram," if d.tokenizer == "word" else "") + " keeps more of them")

    def _report_large_word_vocabularies(self, echo):
        """A word tokenizer keeps every word of the training text unless --vocab-size caps it: a
        corpus of names, numbers or ids gives a vocabulary whose embedding and output rows are
        most of the model's memory and time, which the user may not have meant."""
        d, m = self.config.data, self.config.model
        if d.kind != "tsv" or d.tokenizer != "word" or d.tokenizer_vocab_size is not None or d.tokenizer_from:
            return
        sizes = (m.source_vocab_size, m.target_vocab_size)
        if max(sizes) < LARGE_WORD_VOCABULARY:
            return
        # Rows of the source and target embeddings and of the output layer, less those a tie shares.
        table_rows = {None: m.source_vocab_size + 2 * m.target_vocab_size,
                      "decoder": m.source_vocab_size + m.target_vocab_size, "all": m.target_vocab_size}
        rows = table_rows[m.tie_embeddings] * m.embed_size + m.target_vocab_size  # and the output layer's bias
        sides = ("shared",) if d.shared_vocab else ("source", "target")
        echo("note: the word tokenizer keeps every word of the training text, a vocabulary of "
             + " and ".join(f"{n:,} ({side})" for side, n in zip(sides, sizes))
             + f" tokens; the embeddings and the output layer hold {rows:,} parameters; --vocab-size N keeps the N - 4 "
             "most frequent words, --tokenizer bpe or unigram splits the rare ones into pieces")

    def _report_held_out_duplicates(self, echo):
        """Held-out pairs that repeated lines also put among the training pairs: their scores
        partly measure recall of trained pairs, which the user should know before reading them."""
        if n := self.data.held_out_also_trained:
            echo(f"warning: {n} of the {self.data.held_out_pairs} pairs held out of {self.config.data.train_path} "
                 f"(no --valid) are also training pairs, on repeated lines: the held-out scores "
                 f"partly measure pairs the model trains on; remove repeated lines (sort -u) or give --valid FILE")

    def _report_unknown_tokens(self, echo):
        """A text run whose pairs its tokenizers mostly cannot read: training pairs numbered by
        another run's tokenizers (--tokenizer-from), a --valid file, and the pairs held out of
        the training file (words of their own, as in a corpus of names or ids: their scores
        measure <unk> more than the model)."""
        d = self.config.data
        if d.kind != "tsv":
            return
        if d.valid_path is None and d.tokenizer_from is None and self.data.held_out_pairs:
            note = unknown_tokens_note(self.data.eval, f"{d.train_path} (its {self.data.held_out_pairs} pairs held "
                                       "out, no --valid)", "the tokenizers trained on its other pairs",
                                       mismatch_hint=False)
            if note:
                echo(note)
        files = []
        if d.tokenizer_from is not None:
            files.append((self.data.train, d.train_path, f"the tokenizers of --tokenizer-from {d.tokenizer_from}"))
        if d.valid_path is not None:
            files.append((self.data.eval, d.valid_path, "the tokenizers trained on --data"
                          if d.tokenizer_from is None else "the --tokenizer-from run's tokenizers"))
        for pairs, path, what in files:
            note = unknown_tokens_note(pairs, path, what)
            if note:
                echo(note)

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
        """The compiled steps, built from the model's shapes (``Transformer.abstract``): the
        random init, eager and op by op, is made only for a state that starts from it
        (``initial_state``), never for one a checkpoint overwrites (``latest_state``, read by
        evaluate and generate, and a resume): eager and op by op, an init costs seconds."""
        return Trainer(self.config.abstract_model(), self.config.train)

    def _new_model(self):
        return self.config.build_model(nnx.Rngs(self.config.train.seed))

    def checkpoints(self, max_to_keep=3):
        return checkpoint.open_manager(self.dir.checkpoints.absolute(), max_to_keep=max_to_keep)

    def best_checkpoints(self):
        """OUT/best's manager: the one checkpoint of the best evaluation (``fit``, --best-metric)."""
        return checkpoint.open_manager(self.dir.best.absolute(), max_to_keep=1)

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
        params, self._init_params = self._init_params, None  # host memory back once loaded
        path = self._init_path or self.config.init_from.path
        if params is None:
            params, _ = init_from.read_params(path, self.config)
        echo(f"starting from the weights of {path}")
        # Laid out as a fresh or restored state (state.on_default_device says why).
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
        left in place), or of a run opened as RUN/best its best checkpoint; an error naming the
        run when it has none."""
        manager = None if self.best and not self.dir.best.is_dir() else (
            self.best_checkpoints() if self.best else self.checkpoints())
        if self.best and (manager is None or manager.latest_step() is None):
            why = ("it was trained without --best-metric" if self.config.evaluation.best_metric is None
                   else "it has not evaluated yet")
            raise FileNotFoundError(f"{self.dir.best}: the run has no best checkpoint ({why}); give {self.path} "
                                    f"for its latest")
        if manager.latest_step() is None:
            raise FileNotFoundError(f"{self.path}: the run has no checkpoint yet")
        state, skipped = checkpoint.restore_latest_intact(manager, self.trainer.state_template())
        for step, why in skipped:
            echo(f"warning: checkpoint {step} cannot be read ({why}); using step {int(state.step)}")
        return state

    # --- training batches

    def train_batches(self, step):
        """The micro-batches of optimizer update ``step`` (one, or ``accumulate`` of them),
        drawn one at a time as they are iterated (an update of many holds one in memory): a
        function of (seed, step) alone, so a resumed run sees the same batches. Micro-batch j
        of update k is the data stream's batch k * accumulate + j."""
        k = self.config.accumulate
        return (self._batch(step * k + j) for j in range(k))

    def _training_pairs(self):
        """The training examples. An opened run with --valid reads its training file only here,
        when its batches are asked for (evaluate and generate never read it)."""
        if self.data.train is None and os.path.isfile(self.config.data.train_path):
            self._data = load_data(self.config.data, self.dir, rebuild=False, with_train=True)
        if self.data.train is None:  # an opened run whose training file moved (load_data)
            raise FileNotFoundError(f"{self.config.data.train_path}: the run's training file is not there")
        return self.data.train

    def _batch(self, index):
        train, seed = self._training_pairs(), self.config.train.seed
        if self.config.max_tokens is None:
            return train.batch(seed, index, self.config.batch_size)
        return train.batch_of_rows(self.token_batcher.rows(seed, index), max_tokens=self.config.max_tokens)

    @functools.cached_property
    def token_batcher(self):
        """--max-tokens batches over the training pairs (token_batches.TokenBatcher); an example
        that alone exceeds the budget is an error naming it."""
        train = self._training_pairs()
        return TokenBatcher(train.source_lengths, train.target_lengths, self.config.max_tokens,
                            length_multiple=train.length_multiple, names=_PairNames(train, self.config.data.train_path),
                            max_len=train.max_len)

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
        held = max(self.data.held_out_pairs, total)  # held out of the training file, before --max-len dropped some
        too_long = f", {held - total} of them longer than --max-len" if held > total else ""
        where = "--valid" if d.valid_path else f"{held} training pairs held out (no --valid{too_long})"
        return f"evaluating on {used} of {total} held-out pairs from {where}; --valid-size sets how many"
