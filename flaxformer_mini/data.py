"""Training data: synthetic tasks, parallel text, vocabularies and padded batches.

Every batch is a ``Batch`` of int32 numpy arrays, right-padded with PAD (id 0, the model's
``src_pad_idx``):

    source      (B, S)  encoder input    tokens + EOS
    target_in   (B, T)  decoder input    BOS + tokens   (teacher forcing)
    target_out  (B, T)  labels           tokens + EOS

so the decoder reads ``target_in[:, t]`` when it predicts ``target_out[:, t]``, and the loss
counts only the positions where ``target_out != PAD`` (``Batch.num_tokens``).

Training batches are functions of ``(seed, step)`` alone, never of an iterator's state: a run
resumed from a checkpoint at step k sees exactly the batches it would have seen.

Pure numpy and the standard library; this module needs neither JAX nor PyTorch.
"""

import json
import math
import operator
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np

from flaxformer_mini.files import write_atomic

# Special tokens, defined once. PAD = 0 is the model's src_pad_idx: the encoder masks it out.
PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
NUM_SPECIAL = len(SPECIAL_TOKENS)

TASKS = ("copy", "reverse", "sort")

# Last word of a synthetic task's seed sequence. Training step i and held-out batch i come from
# different streams, so held-out data is never a replay of some training batch.
_TRAIN_STREAM = 0
_EVAL_STREAM = 1

# Bucketing sorts by length within pools of this many batches, not over the whole data set:
# batches still hold similar lengths, but which examples share a batch changes every epoch.
_BUCKET_POOL_BATCHES = 32

_VOCAB_FORMAT = "flaxformer-mini-vocab"
_VOCAB_VERSION = 1


class DataError(ValueError):
    """Bad data in a file or a data set. The message names the file and the line."""


class Batch(NamedTuple):
    """Padded int32 arrays; see the module docstring. A NamedTuple, so also a JAX pytree."""

    source: np.ndarray  # (B, S)
    target_in: np.ndarray  # (B, T)
    target_out: np.ndarray  # (B, T)

    @property
    def num_tokens(self):
        """Number of labels that count in the loss (a numpy or JAX scalar, not a Python int,
        so it also works on a batch of JAX arrays inside ``jax.jit``)."""
        return (self.target_out != PAD).sum()


def _non_negative_int(name, value):
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _positive_int(name, value):
    value = _non_negative_int(name, value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def pad_batch(sequences, length=None):
    """Stack integer sequences into a ``(len(sequences), length)`` int32 array, right-padded
    with PAD. ``length`` defaults to the longest sequence; a longer sequence is an error,
    never silently truncated."""
    arrays = [np.asarray(s) for s in sequences]
    for i, a in enumerate(arrays):
        if a.ndim != 1:
            raise ValueError(f"sequence {i} must be one-dimensional, got shape {a.shape}")
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"sequence {i} must hold integer ids, got dtype {a.dtype}")
    longest = max((a.size for a in arrays), default=0)
    if length is None:
        length = longest
    elif longest > length:
        raise ValueError(f"a sequence of length {longest} does not fit length={length}")
    out = np.full((len(arrays), length), PAD, np.int32)
    for i, a in enumerate(arrays):
        out[i, : a.size] = a
    return out


def make_source(sequences, length=None):
    """The encoder input for already-encoded token sequences: each + EOS, padded. (B, S)"""
    return pad_batch([[*s, EOS] for s in sequences], length)


def make_batch(sources, targets, source_length=None, target_length=None):
    """A ``Batch`` from token sequences without specials: the one place that adds BOS/EOS."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    return Batch(
        source=make_source(sources, source_length),
        target_in=pad_batch([[BOS, *t] for t in targets], target_length),
        target_out=pad_batch([[*t, EOS] for t in targets], target_length),
    )


def pad_rows(batch, rows):
    """``batch`` with rows of PAD appended up to ``rows`` (unchanged when it has as many): a
    fixed batch shape, so the jitted steps compile once for it, not again for a smaller
    remainder (an epoch's last training batch, a --max-tokens batch, an evaluation's last
    batch, as ``generate`` pads its last one). A PAD row carries no labels, adds nothing to the
    loss sums, and its decoded row is dropped."""
    missing = rows - len(batch.source)
    if missing <= 0:
        return batch
    return Batch(*(np.pad(np.asarray(a), ((0, missing), (0, 0)), constant_values=PAD) for a in batch))


def _strip_specials(ids):
    """The ids of a model output up to the first EOS, without PAD and BOS."""
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
        if i == EOS:
            break
        if i not in (PAD, BOS):
            out.append(i)
    return out


# ----------------------------------------------------------------------------- synthetic tasks


class SyntheticTask:
    """Copy, reverse or sort a random sequence of content tokens.

    Content ids lie in ``[NUM_SPECIAL, vocab_size)``; sequences have ``min_len..max_len``
    content tokens. ``vocab_size`` is the model's source and target vocabulary size and
    ``model_max_len`` the length its positional tables must hold.
    """

    def __init__(self, name, vocab_size, min_len, max_len):
        if name not in TASKS:
            raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
        vocab_size = _non_negative_int("vocab_size", vocab_size)
        min_len = _non_negative_int("min_len", min_len)
        max_len = _non_negative_int("max_len", max_len)
        # With a single content token every task is the same trivial constant map.
        if vocab_size <= NUM_SPECIAL + 1:
            raise ValueError(
                f"vocab_size must be > {NUM_SPECIAL + 1} ({NUM_SPECIAL} special tokens and at "
                f"least two content tokens), got {vocab_size}"
            )
        if min_len < 1:
            raise ValueError(f"min_len must be >= 1, got {min_len}")
        if min_len > max_len:
            raise ValueError(f"min_len={min_len} is greater than max_len={max_len}")
        self.name, self.vocab_size, self.min_len, self.max_len = name, vocab_size, min_len, max_len

    def __repr__(self):
        return f"SyntheticTask({self.name!r}, vocab_size={self.vocab_size}, min_len={self.min_len}, max_len={self.max_len})"

    @property
    def model_max_len(self):
        """Longest sequence the model sees: max_len content tokens plus EOS (or BOS)."""
        return self.max_len + 1

    @property
    def num_values(self):
        """How many content values there are; the user writes them as 0..num_values-1."""
        return self.vocab_size - NUM_SPECIAL

    def solve(self, content):
        """The correct target for a sequence of content ids (no specials)."""
        content = np.asarray(content)
        if self.name == "reverse":
            return content[::-1]
        if self.name == "sort":
            return np.sort(content)
        return content

    def batch(self, seed, step, batch_size):
        """Training batch ``step`` of the stream ``seed``: a function of (seed, step) alone."""
        seed, step = _non_negative_int("seed", seed), _non_negative_int("step", step)
        return self._draw(np.random.default_rng([seed, step, _TRAIN_STREAM]), batch_size)

    def eval_batches(self, seed, num_batches, batch_size):
        """``num_batches`` held-out batches, from a stream that training never draws from.

        With a small vocabulary and short sequences a held-out sequence can still equal one
        seen in training by chance; it is never a copy of a training batch.
        """
        seed = _non_negative_int("seed", seed)
        num_batches = _non_negative_int("num_batches", num_batches)
        return [self._draw(np.random.default_rng([seed, i, _EVAL_STREAM]), batch_size) for i in range(num_batches)]

    def held_out(self, seed, num_sequences):
        """``num_sequences`` held-out sequences as one ``Batch``, from the evaluation stream:
        the same sequences whatever batch size an evaluation later splits them into."""
        return self._draw(np.random.default_rng([_non_negative_int("seed", seed), 0, _EVAL_STREAM]), num_sequences)

    def _draw(self, rng, batch_size):
        batch_size = _positive_int("batch_size", batch_size)
        lengths = rng.integers(self.min_len, self.max_len + 1, size=batch_size)
        content = rng.integers(NUM_SPECIAL, self.vocab_size, size=(batch_size, self.max_len))
        sources = [row[:n] for row, n in zip(content, lengths)]
        # Always padded to model_max_len: one fixed shape, so the jitted step compiles once.
        return make_batch(sources, [self.solve(s) for s in sources], self.model_max_len, self.model_max_len)

    def encode_text(self, text):
        """Content ids for a line of space-separated values: ``"5 3 9"`` -> ``[9, 7, 13]``.

        A value v is the id ``v + NUM_SPECIAL``, so the user never sees the special ids.
        No EOS is added (``make_source`` does that).
        """
        ids = []
        for token in text.split():
            try:
                value = int(token)
            except ValueError:
                raise ValueError(f"token {token!r} is not an integer; the {self.name} task reads integers 0..{self.num_values - 1}") from None
            if not 0 <= value < self.num_values:
                raise ValueError(f"token {token!r} is out of range: values are 0..{self.num_values - 1}")
            ids.append(value + NUM_SPECIAL)
        return ids

    def decode_ids(self, ids):
        """Space-separated content values of a model output, up to the first EOS."""
        words = []
        for i in _strip_specials(ids):
            if i == UNK:
                words.append(SPECIAL_TOKENS[UNK])
            elif NUM_SPECIAL <= i < self.vocab_size:
                words.append(str(i - NUM_SPECIAL))
            else:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return " ".join(words)


# ----------------------------------------------------------------------------- parallel text


def read_tsv(path):
    """``(source, target)`` pairs from a UTF-8 file of ``source<TAB>target`` lines.

    Blank lines are skipped. A line without exactly one tab, with an empty side or with
    invalid UTF-8, and a file without any pair, raise ``DataError`` naming the file and the
    1-based line number.
    """
    return [(source, target) for _, source, target in iter_tsv(path)]


def iter_tsv(path):
    """``(line_number, source, target)`` for each pair of a ``source<TAB>target`` file,
    streamed: the rules and errors of ``data.read_tsv`` (same line numbering, BOM skipped,
    blank lines skipped, ``DataError`` naming ``file:line``), without reading the whole file.
    """
    path = Path(path)
    lineno, found = 0, False
    with path.open("rb") as f:
        for physical in f:
            if lineno == 0 and physical.startswith(b"\xef\xbb\xbf"):
                physical = physical[3:]
            # bytes.splitlines, as read_tsv numbers lines (a lone \r ends a line too).
            for raw in physical.splitlines() or [b""]:
                lineno += 1
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
                if not line.strip():
                    continue
                tabs = line.count("\t")
                if tabs != 1:
                    raise DataError(f"{path}:{lineno}: expected one tab between source and target, found {'no tab' if tabs == 0 else f'{tabs} tabs'}")
                source, target = (side.strip() for side in line.split("\t"))
                if not source or not target:
                    raise DataError(f"{path}:{lineno}: empty {'source' if not source else 'target'}")
                found = True
                yield lineno, source, target
    if not found:
        raise DataError(f"{path}: no source<TAB>target pairs (the file is empty)")


class Vocab:
    """A whitespace tokenizer's vocabulary: the special tokens (ids 0..3), then words.

    Special-token strings in the text are ordinary unknown words: a literal ``<eos>`` in a
    sentence encodes to UNK, never to an EOS that would cut the sentence short.
    """

    def __init__(self, tokens):
        tokens = tuple(tokens)
        if tokens[:NUM_SPECIAL] != SPECIAL_TOKENS:
            raise ValueError(f"a vocabulary must start with the special tokens {SPECIAL_TOKENS}, got {tokens[:NUM_SPECIAL]}")
        for token in tokens[NUM_SPECIAL:]:
            if not isinstance(token, str) or token.split() != [token]:
                raise ValueError(f"vocabulary token {token!r} is not a single whitespace-free word")
        duplicates = sorted(t for t, c in Counter(tokens).items() if c > 1)
        if duplicates:
            raise ValueError(f"duplicate vocabulary tokens: {duplicates}")
        self.tokens = tokens
        self._ids = {token: i for i, token in enumerate(tokens) if i >= NUM_SPECIAL}

    @classmethod
    def build(cls, texts, min_freq=1, max_size=None):
        """Words of ``texts`` seen at least ``min_freq`` times, most frequent first, ties in
        alphabetical order (so the same texts always give the same ids). ``max_size`` caps
        the size of the whole vocabulary, special tokens included: the model's vocab size."""
        if isinstance(texts, str):
            raise TypeError("texts must be an iterable of strings, not one string")
        min_freq = _positive_int("min_freq", min_freq)
        if max_size is not None and _non_negative_int("max_size", max_size) < NUM_SPECIAL:
            raise ValueError(f"max_size must be >= {NUM_SPECIAL} (the special tokens), got {max_size}")
        counts = Counter(word for text in texts for word in text.split() if word not in SPECIAL_TOKENS)
        words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[: max_size - NUM_SPECIAL]
        return cls(SPECIAL_TOKENS + tuple(words))

    def __len__(self):
        return len(self.tokens)

    def __eq__(self, other):
        return isinstance(other, Vocab) and self.tokens == other.tokens

    def __hash__(self):
        return hash(self.tokens)

    def __repr__(self):
        return f"Vocab({len(self)} tokens)"

    def encode(self, text):
        """Token ids of ``text``, unknown words -> UNK. No BOS/EOS."""
        return [self._ids.get(word, UNK) for word in text.split()]

    def decode(self, ids):
        """The text of a model output: up to the first EOS, without PAD and BOS."""
        words = []
        for i in _strip_specials(ids):
            if not 0 <= i < len(self.tokens):
                raise ValueError(f"token id {i} is outside the vocabulary [0, {len(self.tokens)})")
            words.append(self.tokens[i])
        return " ".join(words)

    def unknown_words(self, text):
        """The distinct words of ``text`` that encode to UNK, in order of first appearance."""
        return list(dict.fromkeys(w for w in text.split() if w not in self._ids))

    def unk_count(self, text):
        """How many words of ``text`` (with repeats) encode to UNK."""
        return sum(w not in self._ids for w in text.split())

    def to_bytes(self):
        """The saved file's bytes (its checksum is recorded in the run's config)."""
        payload = {"format": _VOCAB_FORMAT, "version": _VOCAB_VERSION, "tokens": list(self.tokens)}
        # One token a line (indent=1): a saved vocabulary diffs well.
        return (json.dumps(payload, ensure_ascii=False, indent=1) + "\n").encode("utf-8")

    def save(self, path):
        write_atomic(path, self.to_bytes())

    @classmethod
    def load(cls, path):
        path = Path(path)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError(f"{path}: not a vocabulary file: {e}") from None
        if not isinstance(payload, dict) or payload.get("format") != _VOCAB_FORMAT:
            raise DataError(f"{path}: not a vocabulary file (no \"format\": \"{_VOCAB_FORMAT}\")")
        if payload.get("version") != _VOCAB_VERSION:
            raise DataError(f"{path}: vocabulary format version {payload.get('version')!r} is not supported (this code reads version {_VOCAB_VERSION})")
        tokens = payload.get("tokens")
        if not isinstance(tokens, list):
            raise DataError(f"{path}: \"tokens\" must be a list of strings")
        try:
            return cls(tokens)
        except (TypeError, ValueError) as e:
            raise DataError(f"{path}: {e}") from None


class TextPairs:
    """Encoded parallel text with length-bucketed training batches.

    A pair whose source or target, with its EOS (or BOS), is longer than ``max_len`` is
    dropped, and counted in ``dropped`` (its longest side in ``longest_dropped``): a corpus has a few very long lines, and the caller
    decides (from the count) whether to raise ``max_len``. If every pair is dropped that is
    a ``DataError``.

    ``length_multiple`` rounds each batch's S and T up to a multiple (capped at
    ``max_len``), so the jitted train step compiles for a handful of shapes, not one per
    length. Pass 1 for the tightest padding.
    """

    def __init__(self, pairs, source_vocab, target_vocab, max_len, length_multiple=8):
        self.max_len = _non_negative_int("max_len", max_len)
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2 (a word and its EOS), got {max_len}")
        self.length_multiple = _positive_int("length_multiple", length_multiple)
        self.source_vocab, self.target_vocab = source_vocab, target_vocab
        self.sources, self.targets = [], []  # int32 ids without specials
        self.dropped = 0
        self.longest_dropped = 0  # tokens of the longest side of a dropped pair
        for source, target in pairs:
            s, t = source_vocab.encode(source), target_vocab.encode(target)
            if len(s) + 1 > self.max_len or len(t) + 1 > self.max_len:
                self.dropped += 1
                self.longest_dropped = max(self.longest_dropped, len(s), len(t))
                continue
            self.sources.append(np.asarray(s, np.int32))
            self.targets.append(np.asarray(t, np.int32))
        if not self.sources:
            raise DataError(f"no pairs: all {self.dropped} are longer than max_len={self.max_len}" if self.dropped else "no pairs")
        # Padded lengths: tokens + EOS (source) and BOS/EOS + tokens (target).
        self._source_lengths = np.array([s.size + 1 for s in self.sources])
        self._target_lengths = np.array([t.size + 1 for t in self.targets])
        self._plan_key, self._plan = None, None

    def __len__(self):
        return len(self.sources)

    def steps_per_epoch(self, batch_size):
        return math.ceil(len(self) / _positive_int("batch_size", batch_size))

    def batch(self, seed, step, batch_size):
        """Training batch ``step`` (a function of seed and step alone), of exactly
        ``batch_size`` rows.

        Each epoch of ``steps_per_epoch(batch_size)`` steps holds every example once. The
        epoch's last batch is usually short: it is filled up with rows of PAD only, which
        carry no labels (``num_tokens`` ignores them), so the batch shape stays fixed.
        """
        seed, step = _non_negative_int("seed", seed), _non_negative_int("step", step)
        epoch, index = divmod(step, self.steps_per_epoch(batch_size))
        rows = self._epoch_plan(seed, epoch, batch_size)[index]
        return pad_rows(self._batch_of(rows), batch_size)

    def iter_eval_batches(self, batch_size, indices=None):
        """Every example once (or those of ``indices``), in order; the last batch may be
        smaller."""
        batch_size = _positive_int("batch_size", batch_size)
        indices = np.arange(len(self)) if indices is None else np.asarray(indices)
        for start in range(0, len(indices), batch_size):
            yield self._batch_of(indices[start : start + batch_size])

    def sample_indices(self, n, seed=0):
        """``n`` example indices (all when ``n`` >= len), drawn once by ``seed``, in order."""
        if n >= len(self):
            return np.arange(len(self))
        return np.sort(np.random.default_rng(seed).choice(len(self), size=n, replace=False))

    @property
    def source_lengths(self):
        """Encoder lengths (tokens + EOS), one int per pair: what batching.TokenBatcher takes."""
        return self._source_lengths

    @property
    def target_lengths(self):
        """Decoder lengths (BOS + tokens)."""
        return self._target_lengths

    def batch_of_rows(self, rows, max_tokens=None):
        """The ``Batch`` of examples ``rows`` (a --max-tokens batch). With ``max_tokens``,
        filled up with PAD rows (no labels) to ``max_tokens // max(S, T)`` rows, so the batch
        shape depends on its (S, T) alone and the jitted step compiles a few times, not once
        per row count."""
        batch = self._batch_of(rows)
        if max_tokens is not None:
            batch = pad_rows(batch, max_tokens // max(batch.source.shape[1], batch.target_in.shape[1]))
        return batch

    def _epoch_plan(self, seed, epoch, batch_size):
        """The epoch's batches, as lists of example indices.

        Shuffle, sort by length within pools of _BUCKET_POOL_BATCHES batches (stable, so
        equal lengths stay in random order), cut into batches, shuffle the batches. Only the
        last pool can leave a short batch. Cached: consecutive steps share an epoch.
        """
        key = (seed, epoch, batch_size)
        if self._plan_key != key:
            rng = np.random.default_rng([seed, epoch])
            order = rng.permutation(len(self))
            pool = _BUCKET_POOL_BATCHES * batch_size
            batches = []
            for start in range(0, len(order), pool):
                chunk = order[start : start + pool]
                # np.lexsort is stable; the last key is the primary one.
                chunk = chunk[np.lexsort((self._target_lengths[chunk], self._source_lengths[chunk]))]
                batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
            self._plan = [batches[i] for i in rng.permutation(len(batches))]
            self._plan_key = key
        return self._plan

    def _padded_length(self, longest):
        rounded = -(-longest // self.length_multiple) * self.length_multiple
        return min(rounded, self.max_len)

    def _batch_of(self, rows):
        rows = list(rows)
        return make_batch(
            [self.sources[i] for i in rows],
            [self.targets[i] for i in rows],
            self._padded_length(int(self._source_lengths[rows].max())),
            self._padded_length(int(self._target_lengths[rows].max())),
        )
