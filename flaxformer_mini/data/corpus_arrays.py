"""A tokenised parallel corpus as flat numpy arrays, built by streaming a TSV file.

Storage, per side: one flat int32 array of all token ids (no BOS/EOS) and an int64 array of
``n + 1`` offsets, so example ``i`` is ``ids[offsets[i]:offsets[i + 1]]``. No Python object
per token (nor per line) outlives the loading: the file is read line by line and encoded in
chunks with the tokenizer's ``encode_batch`` (parallel Rust for the HF kinds), and each chunk
is turned into arrays at once. docs/data.md has the measured time and memory for 1M lines.
"""

import itertools
from pathlib import Path

import numpy as np

from . import UNK, DataError, iter_tsv, make_batch  # noqa: F401  (iter_tsv re-exported)

_CHUNK_LINES = 8192  # lines encoded per encode_batch call: big enough to amortise, small in memory


def _flatten(encoded):
    """(flat int32 ids, int64 lengths) of a list of id lists."""
    lengths = np.fromiter(map(len, encoded), np.int64, count=len(encoded))
    ids = np.fromiter(itertools.chain.from_iterable(encoded), np.int32, count=int(lengths.sum()))
    return ids, lengths


class EncodedCorpus:
    """Token ids of a parallel corpus: ``source_ids``/``target_ids`` (flat int32),
    ``source_offsets``/``target_offsets`` (int64, ``len + 1``), ``line_numbers`` (int64, the
    file line of each example) and ``dropped`` (pairs longer than ``max_len``, as in
    ``data.TextPairs``)."""

    def __init__(self, source_ids, source_offsets, target_ids, target_offsets, line_numbers, path=None, dropped=0):
        self.source_ids, self.source_offsets = source_ids, source_offsets
        self.target_ids, self.target_offsets = target_ids, target_offsets
        self.line_numbers, self.path, self.dropped = line_numbers, path, dropped

    @classmethod
    def from_tsv(cls, path, source_tokenizer, target_tokenizer, max_len=None, chunk_lines=_CHUNK_LINES, columns=None):
        """Stream ``path`` through the tokenizers (the same object for a shared vocabulary);
        ``columns``: as ``data.read_tsv``'s.

        With ``max_len``, a pair whose source or target with its EOS (or BOS) is longer is
        dropped and counted in ``dropped``; if every pair is dropped that is a ``DataError``.
        """
        parts = {"s": [], "sl": [], "t": [], "tl": [], "line": []}
        dropped = 0
        pairs = iter_tsv(path, columns)
        while chunk := list(itertools.islice(pairs, chunk_lines)):
            lines, sources, targets = zip(*chunk)
            s_ids, s_len = _flatten(source_tokenizer.encode_batch(sources))
            t_ids, t_len = _flatten(target_tokenizer.encode_batch(targets))
            lines = np.asarray(lines, np.int64)
            if max_len is not None:
                keep = (s_len + 1 <= max_len) & (t_len + 1 <= max_len)
                dropped += int((~keep).sum())
                s_ids, t_ids = s_ids[np.repeat(keep, s_len)], t_ids[np.repeat(keep, t_len)]
                s_len, t_len, lines = s_len[keep], t_len[keep], lines[keep]
            for key, value in zip(("s", "sl", "t", "tl", "line"), (s_ids, s_len, t_ids, t_len, lines)):
                parts[key].append(value)
        if not sum(map(len, parts["line"])):
            raise DataError(f"{path}: no pairs: all {dropped} are longer than max_len={max_len}")

        def take(key):
            # pop: each side's chunks are freed once joined, so the peak is the result plus
            # one side's chunks, not twice the result.
            return np.concatenate(parts.pop(key))

        def offsets(key):
            return np.concatenate([[0], np.cumsum(take(key))]).astype(np.int64)

        return cls(
            take("s"), offsets("sl"), take("t"), offsets("tl"), take("line"), path=Path(path), dropped=dropped
        )

    def __len__(self):
        return self.line_numbers.size

    def source(self, i):
        return self.source_ids[self.source_offsets[i] : self.source_offsets[i + 1]]

    def target(self, i):
        return self.target_ids[self.target_offsets[i] : self.target_offsets[i + 1]]

    @property
    def source_lengths(self):
        """Encoder lengths: tokens + EOS (what ``batching.token_batches`` takes)."""
        return np.diff(self.source_offsets) + 1

    @property
    def target_lengths(self):
        """Decoder lengths: BOS + tokens (= tokens + EOS)."""
        return np.diff(self.target_offsets) + 1

    def names(self):
        """``"file:line"`` of each example, for error messages (built on demand)."""
        return [f"{self.path}:{n}" for n in self.line_numbers.tolist()]

    def unk_counts(self):
        """``(source, target)`` number of UNK tokens, for the unknown-token report."""
        return int(np.count_nonzero(self.source_ids == UNK)), int(np.count_nonzero(self.target_ids == UNK))

    @property
    def nbytes(self):
        arrays = (self.source_ids, self.source_offsets, self.target_ids, self.target_offsets, self.line_numbers)
        return sum(a.nbytes for a in arrays)

    def batch(self, rows, source_length=None, target_length=None):
        """A ``data.Batch`` of examples ``rows`` (EOS/BOS added, padded to the given lengths)."""
        rows = np.asarray(rows).tolist()
        return make_batch([self.source(i) for i in rows], [self.target(i) for i in rows], source_length, target_length)
