"""Parallel text: ``source<TAB>target`` files, and ``TextPairs``, their encoded pairs with
length-bucketed training batches that are functions of ``(seed, step)`` alone."""

import itertools
import math
from pathlib import Path

import numpy as np

from .batches import UNK, DataError, non_negative_int, positive_int, make_batch, pad_rows

# Bucketing sorts by length within pools of this many batches, not over the whole data set:
# batches still hold similar lengths, but which examples share a batch changes every epoch.
_BUCKET_POOL_BATCHES = 32
# Batch lengths round up to a multiple of this (TextPairs' length_multiple; train --length-multiple).
LENGTH_MULTIPLE = 8
_ENCODE_CHUNK = 8192  # pairs encoded per encode_batch call: big enough to amortise it, small in memory


def read_tsv(path, columns=None):
    """``(source, target)`` pairs from a UTF-8 file of ``source<TAB>target`` lines.

    Blank lines are skipped. A line without exactly one tab, with an empty side or with
    invalid UTF-8, and a file without any pair, raise ``DataError`` naming the file and the
    1-based line number (of the first bad line, with how many more).

    ``columns=(s, t)`` (1-based, as ``cut -f``; ``--columns S,T``) reads the source from
    column s and the target from column t of lines with at least max(s, t) tab-separated
    columns, the others ignored: a three-column Tatoeba/Anki file (``English<TAB>French<TAB>
    attribution``) read either way round. ``None``: exactly two columns, source first.
    """
    return [(source, target) for _, source, target in iter_tsv(path, columns)]


def check_columns(columns):
    """``columns`` as a tuple of two distinct 1-based column numbers, or None."""
    if columns is None:
        return None
    try:
        s, t = (int(c) for c in columns)
    except (TypeError, ValueError):
        raise DataError(f"columns must be two column numbers (source, target), got {columns!r}") from None
    if s < 1 or t < 1 or s == t:
        raise DataError(f"columns must be two different column numbers >= 1 (source, target; 1 is the first), "
                        f"got {s},{t}")
    return s, t


UTF8_BOM = b"\xef\xbb\xbf"  # some editors (Notepad) start a UTF-8 file with it
# Byte-order marks of the encodings a UTF-8 reader must not take for text, longest first
# (UTF-32LE's starts with UTF-16LE's).
OTHER_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32LE"), (b"\x00\x00\xfe\xff", "UTF-32BE"), (b"\xff\xfe", "UTF-16LE"),
              (b"\xfe\xff", "UTF-16BE"))
_CONVERT = "converts with `iconv -f {encoding} -t UTF-8`"


def iter_lines(f, name):
    """``(line_number, text)`` for each line of the binary stream ``f``, numbered as every
    text reader here numbers them (training files, ``generate``'s standard input): a UTF-8
    BOM at the start of the file, or of any line, is skipped, ``\\n``, ``\\r\\n`` and a lone ``\\r`` each end a line
    (bytes.splitlines), and invalid UTF-8 raises ``DataError`` naming ``name:line``. So do a
    UTF-16 or UTF-32 file (its byte-order mark, or without one its NUL bytes, which decode as
    valid UTF-8) and any NUL byte, which no text here holds. The text keeps its spaces:
    callers strip what they split.
    """
    lineno = 0
    for physical in f:
        if lineno == 0:
            for bom, encoding in OTHER_BOMS:
                if physical.startswith(bom):
                    raise DataError(f"{name}: a {encoding} file (its byte-order mark says so), not UTF-8; it "
                                    + _CONVERT.format(encoding=encoding))
            if physical.startswith(UTF8_BOM):
                physical = physical[len(UTF8_BOM):]
        for raw in physical.splitlines() or [b""]:
            lineno += 1
            if raw.startswith(UTF8_BOM):  # files each saved with one and joined by `cat`: not text either
                raw = raw[len(UTF8_BOM):]
            if b"\x00" in raw:
                raise DataError(f"{name}:{lineno}: {_nul_problem(raw, at_start=lineno == 1)}")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                # The usual cause is a file saved in a legacy encoding: say how to convert it.
                raise DataError(f"{name}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start}); a file in another "
                                f"encoding converts with `iconv -f ENCODING -t UTF-8` (e.g. -f latin1)") from None
            yield lineno, line


def _nul_problem(raw, at_start):
    """Why a line holding a NUL byte is refused: the UTF-16/32 it looks like (every other
    byte, or three bytes in four, NUL: ASCII text in those encodings; which byte order, where
    the line starts the file), or a NUL in text."""
    body = raw if at_start else raw.strip(b"\x00")  # a line split at a UTF-16 "\n" keeps its other byte
    for width, encoding in ((4, "UTF-32"), (2, "UTF-16")):
        if len(body) >= width and body.count(b"\x00") >= (width - 1) * (len(body) // width):
            if at_start:
                order = "LE" if body[0] != 0 else "BE"
                return f"looks like {encoding}{order} text without a byte-order mark, not UTF-8; it " + \
                    _CONVERT.format(encoding=encoding + order)
            return (f"looks like {encoding} text (NUL bytes between the characters), not UTF-8; it "
                    + _CONVERT.format(encoding=f"{encoding}LE (or {encoding}BE)"))
    at = raw.index(b"\x00")
    return (f"a NUL byte at byte {at}: text files hold none (a binary file, or a NUL inside a word); remove it, "
            "e.g. `tr -d '\\000' < FILE`")


def iter_tsv(path, columns=None, lines=None):
    """``(line_number, source, target)`` for each pair of a ``source<TAB>target`` file (or of
    ``columns``), streamed: the rules and errors of ``read_tsv`` (lines read by ``iter_lines``: BOM
    skipped, the same numbering; blank lines skipped, ``DataError`` naming ``file:line``),
    without reading the whole file. With several bad lines, the error names the first one's
    reason and how many more (with the next line numbers), so a messy file is fixed in one
    go, not one line per run. ``lines``: the file's ``iter_lines``, from a caller that reads
    it itself (to count its lines in the same pass: a pipe can be read once).
    """
    path, columns = Path(path), check_columns(columns)
    if lines is None:
        with path.open("rb") as f:
            yield from iter_tsv(path, columns, iter_lines(f, path))
        return
    found, bad, lineno = False, [], 0  # bad: (line number, why) of every bad line
    try:
        for lineno, line in lines:
            why, pair = _split_line(line, columns)
            if why is None:
                continue  # blank
            if why:
                bad.append((lineno, why))
                continue
            if bad:
                continue  # the file fails: read on only to count its bad lines
            found = True
            yield lineno, *pair
    except DataError as e:  # not valid UTF-8: reading cannot go on
        if not bad:
            raise
        bad.append((None, str(e)))
    if bad:
        (first, why), rest = bad[0], bad[1:]
        more = ""
        if rest:
            numbers = [str(n) if n is not None else "then not valid UTF-8" for n, _ in rest[:10]]
            more = f" (and {len(rest)} more bad line{'s' if len(rest) > 1 else ''}: {', '.join(numbers)}" \
                   f"{', ...' if len(rest) > 10 else ''})"
        cr = ("; lines are numbered with a carriage return (\\r) not followed by \\n as a line end, and this file "
              "has some, as in a field or an old Mac file (an editor showing them as ^M numbers the lines otherwise)"
              if _has_lone_carriage_return(path) else "")
        raise DataError(f"{path}:{first}: {why}{more}{cr}")
    if not found:
        why = f"its {lineno} line{'s are' if lineno > 1 else ' is'} blank" if lineno else "the file is empty"
        raise DataError(f"{path}: no source<TAB>target pairs ({why})")


def _has_lone_carriage_return(path):
    """Whether the file ``path`` holds a ``\\r`` not followed by ``\\n``, which ``iter_lines``
    reads as a line end: a bad line's number then differs from an editor's that shows it as ^M.
    Read again only on that error path; False for a pipe, which cannot be read twice."""
    try:
        if not path.is_file():
            return False
        with path.open("rb") as f:
            carried = b""
            for chunk in iter(lambda: f.read(1 << 20), b""):
                data = carried + chunk
                # A \r ending the chunk waits for the next chunk's first byte.
                carried = b"\r" if data.endswith(b"\r") else b""
                if b"\r" in data[:len(data) - len(carried)].replace(b"\r\n", b""):
                    return True
            return bool(carried)
    except OSError:
        return False


class EmptySideError(DataError):
    """A pair one side of which encodes to no token (``where``: its line, or "pair N" without
    line numbers): text that the tokenizer's normalisation empties, as it does a side of U+2581
    marks alone. The readers refuse a side empty as written; this is the same refusal, made once
    the tokenizer is known."""

    def __init__(self, where, message):
        super().__init__(message)
        self.where = where


def _flatten(encoded):
    """(flat int32 ids, int64 lengths) of a list of id lists."""
    lengths = np.fromiter(map(len, encoded), np.int64, count=len(encoded))
    return np.fromiter(itertools.chain.from_iterable(encoded), np.int32, count=int(lengths.sum())), lengths


def _split_line(line, columns):
    """(why ``line`` is not a pair: '' when it is one, None when it is blank; its (source,
    target) when it is one)."""
    if not line.strip():
        return None, None
    tabs = line.count("\t")
    if columns is None and tabs != 1:
        found = "no tab" if tabs == 0 else f"{tabs} tabs"
        hint = " (one at the end of the line: a trailing tab?)" if tabs == 2 and line.rstrip(" ").endswith("\t") else ""
        more = "; --columns S,T picks two columns of a wider file" if tabs >= 2 and not hint else ""
        return f"expected one tab between source and target, found {found}{hint}{more}", None
    if columns is not None and tabs + 1 < max(columns):
        return (f"expected at least {max(columns)} tab-separated columns (--columns {columns[0]},{columns[1]}), "
                f"found {tabs + 1}"), None
    fields = line.split("\t")
    source, target = (fields[c - 1].strip() for c in columns or (1, 2))
    if not source or not target:
        where = "" if columns is None else f" (column {columns[0] if not source else columns[1]})"
        return f"empty {'source' if not source else 'target'}{where}", None
    return "", (source, target)


def _refuse_empty_sides(chunk, start, source_lengths, target_lengths, line_numbers):
    """EmptySideError for the first pair of ``chunk`` (pairs ``start``... of the input) with a side
    of no tokens, counting the chunk's others."""
    empty = np.flatnonzero((source_lengths == 0) | (target_lengths == 0))
    if not empty.size:
        return
    i = int(empty[0])
    side = 0 if source_lengths[i] == 0 else 1
    where = f"pair {start + i + 1}" if line_numbers is None else str(line_numbers[start + i])
    more = f"; {empty.size - 1} more such pair{'s' if empty.size > 2 else ''} after it" if empty.size > 1 else ""
    raise EmptySideError(where, f"empty {('source', 'target')[side]} once the tokenizer normalises "
                                f"{chunk[i][side]!r} (it reads U+2581 '\u2581' as a space and strips spaces at "
                                f"the ends){more}")


class TextPairs:
    """Encoded parallel text with length-bucketed training batches.

    A pair whose source or target, with its EOS (or BOS), is longer than ``max_len`` is
    dropped, and counted in ``dropped`` (its longest side in ``longest_dropped``): a corpus has a few very long lines, and the caller
    decides (from the count) whether to raise ``max_len``. If every pair is dropped that is
    a ``DataError``. ``kept[i]`` is the index in ``pairs`` of example i (evaluate --output
    lines its hypotheses up with the input file's lines by it). ``line_numbers`` (optional,
    one per pair): the file's line of each, kept as ``line_numbers[i]`` for example i, so an
    error can name ``file:line``; None without them. A side that encodes to no token is an
    ``EmptySideError`` naming its line (or its pair).

    ``length_multiple`` rounds each batch's S and T up to a multiple (capped at
    ``max_len``), so the jitted train step of a fixed batch size compiles for at most
    ceil(max_len / length_multiple)^2 shapes, not one per pair of lengths (13 on a
    character-level corpus at max_len 64: docs/data.md, "Compiled shapes"). Pass 1 for the
    tightest padding.
    """

    def __init__(self, pairs, source_vocab, target_vocab, max_len, length_multiple=LENGTH_MULTIPLE, line_numbers=None):
        self.max_len = non_negative_int("max_len", max_len)
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2 (a word and its EOS), got {max_len}")
        self.length_multiple = positive_int("length_multiple", length_multiple)
        self.source_vocab, self.target_vocab = source_vocab, target_vocab
        parts = {"s": [], "sl": [], "t": [], "tl": [], "kept": []}
        self.dropped = 0
        self.longest_dropped = 0  # tokens of the longest side of a dropped pair
        pairs, start = iter(pairs), 0
        # Encoded a chunk at a time (encode_batch: parallel Rust for the Hugging Face kinds), each
        # chunk's ids made flat arrays at once: no Python object per token or pair outlives it.
        while chunk := list(itertools.islice(pairs, _ENCODE_CHUNK)):
            sources, targets = zip(*chunk)
            s_ids, s_len = _flatten(source_vocab.encode_batch(sources))
            t_ids, t_len = _flatten(target_vocab.encode_batch(targets))
            _refuse_empty_sides(chunk, start, s_len, t_len, line_numbers)
            keep = (s_len + 1 <= self.max_len) & (t_len + 1 <= self.max_len)  # + EOS (or BOS)
            if not keep.all():
                self.dropped += int((~keep).sum())
                self.longest_dropped = max(self.longest_dropped, int(np.maximum(s_len, t_len)[~keep].max()))
                s_ids, t_ids = s_ids[np.repeat(keep, s_len)], t_ids[np.repeat(keep, t_len)]
                s_len, t_len = s_len[keep], t_len[keep]
            for key, value in zip(("s", "sl", "t", "tl", "kept"), (s_ids, s_len, t_ids, t_len,
                                                                 start + np.flatnonzero(keep))):
                parts[key].append(value)
            start += len(chunk)
        if not sum(map(len, parts["kept"])):
            raise DataError(f"no pairs: all {self.dropped} are longer than max_len={self.max_len}" if self.dropped else "no pairs")
        # Per side: one flat int32 array of every example's ids (no BOS/EOS) and int64 offsets,
        # example i being ids[offsets[i]:offsets[i + 1]].
        self._source_ids, self._target_ids = np.concatenate(parts.pop("s")), np.concatenate(parts.pop("t"))
        source_len, target_len = np.concatenate(parts.pop("sl")), np.concatenate(parts.pop("tl"))
        self._source_offsets = np.concatenate([[0], np.cumsum(source_len)]).astype(np.int64)
        self._target_offsets = np.concatenate([[0], np.cumsum(target_len)]).astype(np.int64)
        self.kept = np.concatenate(parts.pop("kept")).tolist()  # the input index of each kept pair
        self.line_numbers = None if line_numbers is None else [line_numbers[i] for i in self.kept]
        # Padded lengths: tokens + EOS (source) and BOS/EOS + tokens (target).
        self._source_lengths, self._target_lengths = source_len + 1, target_len + 1
        self._plan_key, self._plan = None, None

    def __len__(self):
        return len(self._source_lengths)

    def source(self, i):
        """Example i's source ids (int32, no EOS)."""
        return self._source_ids[self._source_offsets[i]:self._source_offsets[i + 1]]

    def target(self, i):
        """Example i's target ids (int32, no BOS/EOS)."""
        return self._target_ids[self._target_offsets[i]:self._target_offsets[i + 1]]

    @property
    def nbytes(self):
        """The bytes of the encoded examples' arrays."""
        return sum(a.nbytes for a in (self._source_ids, self._source_offsets, self._target_ids, self._target_offsets,
                                      self._source_lengths, self._target_lengths))

    def steps_per_epoch(self, batch_size):
        return math.ceil(len(self) / positive_int("batch_size", batch_size))

    def batch(self, seed, step, batch_size):
        """Training batch ``step`` (a function of seed and step alone), of exactly
        ``batch_size`` rows.

        Each epoch of ``steps_per_epoch(batch_size)`` steps holds every example once. The
        epoch's last batch is usually short: it is filled up with rows of PAD only, which
        carry no labels (``num_tokens`` ignores them), so the batch shape stays fixed.
        """
        seed, step = non_negative_int("seed", seed), non_negative_int("step", step)
        epoch, index = divmod(step, self.steps_per_epoch(batch_size))
        rows = self._epoch_plan(seed, epoch, batch_size)[index]
        return pad_rows(self._batch_of(rows), batch_size)

    def iter_eval_batches(self, batch_size, indices=None):
        """Every example once (or those of ``indices``), in order; the last batch may be
        smaller."""
        batch_size = positive_int("batch_size", batch_size)
        indices = np.arange(len(self)) if indices is None else np.asarray(indices)
        for start in range(0, len(indices), batch_size):
            yield self._batch_of(indices[start : start + batch_size])

    def sample_indices(self, n, seed=0):
        """``n`` example indices (all when ``n`` >= len), drawn once by ``seed``, in order."""
        if n >= len(self):
            return np.arange(len(self))
        return np.sort(np.random.default_rng(seed).choice(len(self), size=n, replace=False))

    def unknown_rates(self):
        """(source, target): the fraction of each side's tokens that are UNK, outside its
        vocabulary."""
        return tuple(int(np.count_nonzero(ids == UNK)) / max(ids.size, 1)
                     for ids in (self._source_ids, self._target_ids))

    @property
    def source_lengths(self):
        """Encoder lengths (tokens + EOS), one int per pair: what token_batches.TokenBatcher takes."""
        return self._source_lengths

    @property
    def target_lengths(self):
        """Decoder lengths (BOS + tokens)."""
        return self._target_lengths

    def batch_of_rows(self, rows, max_tokens=None):
        """The ``Batch`` of examples ``rows`` (a --max-tokens batch). With ``max_tokens``,
        filled up with PAD rows (no labels) to ``max_tokens // max(S, T)`` rows (at most the
        corpus's size), so the batch shape depends on its (S, T) alone and the jitted step
        compiles a few times, not once per row count."""
        batch = self._batch_of(rows)
        if max_tokens is not None:  # never more rows than the corpus holds: a budget above it pads to it
            rows = min(max_tokens // max(batch.source.shape[1], batch.target_in.shape[1]), len(self))
            batch = pad_rows(batch, rows)
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
            [self.source(i) for i in rows],
            [self.target(i) for i in rows],
            self._padded_length(int(self._source_lengths[rows].max())),
            self._padded_length(int(self._target_lengths[rows].max())),
        )
