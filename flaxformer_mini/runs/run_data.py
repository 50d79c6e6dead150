"""A run's examples: the synthetic task, or the text pairs encoded with the run's tokenizers
(saved ones when the run has them, trained on the training file when it is new), and the
held-out pairs it evaluates on."""

import contextlib
import os
from typing import NamedTuple

import numpy as np

from flaxformer_mini.data import DataError, EmptySideError, SyntheticTask, TextPairs, Vocab, iter_tsv, tokenizers
from flaxformer_mini.runs import tokenizer_from
from flaxformer_mini.runs.config import DataConfig, RunConfigError
from flaxformer_mini.runs.directory import RunDir, data_file_sha256


class RunData(NamedTuple):
    train: object  # SyntheticTask or TextPairs: batch(seed, step, batch_size)
    eval: object  # the held-out examples
    vocabs: tuple | None  # (source Vocab, target Vocab) of a text run
    # Held-out pairs (no --valid) that a duplicate line also puts among the training pairs.
    held_out_also_trained: int = 0
    held_out_pairs: int = 0  # how many were held out of the training file

    @property
    def vocab_sizes(self):
        return (self.train.vocab_size,) * 2 if self.vocabs is None else tuple(len(v) for v in self.vocabs)


def _check_held_out_file(config: DataConfig, run_dir: RunDir):
    """An opened text run (evaluate) scores the pairs it held out: its --valid file's, or
    pairs drawn from its training file's lines. That file gone, or changed since the run
    started, would be an error about a path the user never typed, or other pairs (some of
    them trained on) scored under the run's name, silently: refused, naming the file, as a
    resume refuses it. A run that recorded no checksum is checked by path alone."""
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
                             f"{found[:12]}..., recorded {recorded[:12]}...), so the pairs it would score are not "
                             f"the run's: {instead}")


def load_data(config: DataConfig, run_dir: RunDir, rebuild=True, with_train=False) -> RunData:
    """The run's examples. A text run keeps its saved vocabularies when it has them (a resumed
    run keeps its ids even if the training file changed); a new one builds them from the
    training pairs that fit ``max_len``, so a dropped pair adds no words. An opened run
    (``rebuild`` False) with a --valid file leaves its training file unread (``train`` None)
    unless ``with_train``: evaluating needs only the tokenizers and that file."""
    if config.kind == "synthetic":
        task = SyntheticTask(config.task, config.vocab_size, config.min_len, config.max_len)
        return RunData(task, task, None)
    if not rebuild:
        _check_held_out_file(config, run_dir)
    if not rebuild and config.valid_path and not (with_train and os.path.isfile(config.train_path)):
        # An opened run (evaluate, generate): its saved vocabularies and its --valid file are all
        # that evaluating needs; the training file, maybe large, maybe moved, is left unread.
        vocabs = run_dir.load_vocabularies(config)
        return RunData(None, _text_pairs(config.valid_path, _rows(config.valid_path, config), vocabs, config), vocabs)
    rows = _rows(config.train_path, config)
    held_out_rows = []
    if config.valid_path is None and config.holdout:
        # A fixed split (seed 0): the same file always holds out the same pairs.
        n = min(config.holdout, len(rows) // 10)
        chosen = set(np.random.default_rng(0).choice(len(rows), size=n, replace=False).tolist()) if n else set()
        held_out_rows = [row for i, row in enumerate(rows) if i in chosen]
        rows = [row for i, row in enumerate(rows) if i not in chosen]
    held_out = [(source, target) for _, source, target in held_out_rows]
    pairs = [(source, target) for _, source, target in rows]
    # A file with repeated lines puts copies of held-out pairs among the training pairs, and
    # the held-out scores then count pairs the model trained on: counted, for the run's note.
    held = set(held_out)
    trained = {pair for pair in pairs if pair in held} if held else set()
    also_trained = sum(pair in trained for pair in held_out)
    if run_dir.has_vocabularies(config) or not rebuild:  # evaluate: a missing file is an error naming it
        vocabs = run_dir.load_vocabularies(config)
    elif config.tokenizer_from is not None:  # a new run numbering its tokens as an earlier run did
        vocabs = tokenizer_from.load(config)
    else:
        with _naming_the_limit(config.train_path, config, held_out=len(held_out)):
            vocabs = build_tokenizers(config, pairs)
    train = _text_pairs(config.train_path, rows, vocabs, config, held_out=len(held_out))
    if config.valid_path:
        valid = _text_pairs(config.valid_path, _rows(config.valid_path, config), vocabs, config)
    else:
        valid = _text_pairs(config.train_path, held_out_rows, vocabs, config, holding_out=True) if held_out else train
    return RunData(train, valid, vocabs, also_trained, len(held_out))


# A side with more of its tokens outside the vocabulary than this is said: a --valid or
# evaluate --data file, or the training file under another run's --tokenizer-from.
UNKNOWN_NOTE_RATE = 0.05
# ... and this many suggests the file is not what the tokenizers were made for.
UNKNOWN_MISMATCH_RATE = 0.5


def unknown_tokens_note(pairs, path, what, mismatch_hint=True):
    """A line saying how many of ``pairs``' tokens (each side's) are UNK, or None when no side
    passes ``UNKNOWN_NOTE_RATE``. ``what``: how the tokenizers came to this file.
    ``mismatch_hint``: past ``UNKNOWN_MISMATCH_RATE``, suggest swapped columns or another corpus
    (not for pairs held out of the training file itself, whose columns are the trained ones)."""
    rates = dict(zip(("source", "target"), pairs.unknown_rates()))
    high = {side: rate for side, rate in rates.items() if rate > UNKNOWN_NOTE_RATE}
    if not high:
        return None
    said = " and ".join(f"{rate:.1%} of its {side} tokens" for side, rate in high.items())
    hint = ""
    if mismatch_hint and max(high.values()) > UNKNOWN_MISMATCH_RATE:
        hint = ("; so many suggests swapped source and target columns (--columns) or another corpus than the "
                "tokenizers were trained on")
    return f"warning: {path}: {said} are outside the vocabulary ({what}) and read as <unk>{hint}"


def _rows(path, config):
    """(line number, source, target) of each pair of the TSV file ``path``."""
    return list(iter_tsv(path, config.columns))


def _text_pairs(path, rows, vocabs, config, held_out=0, holding_out=False):
    """TextPairs of ``rows`` ((line number, source, target), ``_rows``) read from ``path``; a
    side that encodes to no token is an error naming ``path:line``, and so is no pair that
    fits (``_naming_the_limit``)."""
    pairs = [(source, target) for _, source, target in rows]
    with _naming_the_limit(path, config, held_out, len(pairs) if holding_out else None):
        return TextPairs(pairs, *vocabs, config.model_max_len, config.length_multiple,
                         line_numbers=[line for line, _, _ in rows])


@contextlib.contextmanager
def _naming_the_limit(path, config, held_out=0, holding_out=None):
    """A DataError raised inside (no pair fits) said with the file and the option that raises
    the limit; with the ``held_out`` pairs of the file that its count leaves out, so that it adds
    up to the file's, or, when the pairs are the ``holding_out`` ones held out of the file for
    validation (a count), saying so: the file's other pairs may well fit."""
    try:
        yield
    except EmptySideError as e:
        raise DataError(f"{path}:{e.where}: {e}") from None
    except DataError as e:
        limit = f"(--max-len {config.model_max_len}: a side's tokens plus its EOS)"
        if holding_out is not None:
            raise DataError(f"{path}: the {holding_out} pairs held out of it for validation (no --valid): {e} {limit}; "
                            f"--max-len raises the limit, --valid FILE gives held-out pairs of their own") from None
        aside = f"; the file's other {held_out} pairs are held out for validation (no --valid)" if held_out else ""
        raise DataError(f"{path}: {e} {limit}{aside}; --max-len raises the limit") from None


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
        normalize = tokenizers.normalizer().normalize_str  # built once: tokenizers.normalize builds it per call
        size = lambda text: len(normalize(text))  # noqa: E731
    else:
        size = lambda text: len(text.split())  # noqa: E731
    kept = [(s, t) for s, t in pairs if max(size(s), size(t)) <= config.max_len]
    if not kept:  # TextPairs' error for pairs of which none fits, before a tokenizer trains on nothing
        raise DataError(f"no pairs: all {len(pairs)} are longer than max_len={config.model_max_len}" if pairs
                        else "no pairs")
    if kind == "word" and not config.shared_vocab and config.tokenizer_vocab_size is None:
        return Vocab.build([s for s, _ in kept]), Vocab.build([t for _, t in kept])

    def fit(texts):
        tokenizer = tokenizers.train(kind, texts, config.tokenizer_vocab_size)
        return tokenizer.vocab if kind == "word" else tokenizer  # word: the Vocab and its vocab_*.json files

    if config.shared_vocab:
        shared = fit([s for s, _ in kept] + [t for _, t in kept])
        return shared, shared
    return fit([s for s, _ in kept]), fit([t for _, t in kept])
