"""Parallel text streamed: ``iter_tsv`` reads what ``read_tsv`` reads, and ``TextPairs`` keeps
each side's ids as one flat array with offsets, encoded a chunk at a time, with the ids,
drops and unknown-token counts of encoding each pair alone."""

import numpy as np
import pytest

from flaxformer_mini import data
from flaxformer_mini.data import tokenizers as tk
from flaxformer_mini.data import parallel_text
from flaxformer_mini.data.parallel_text import iter_tsv

TRICKY = b"\xef\xbb\xbfa b\tx y\r\n\n  \nc\td\rlong one two three\tz\n e f \t g \n"


def test_iter_tsv_reads_what_read_tsv_reads_with_the_same_line_numbers(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_bytes(TRICKY)
    streamed = list(iter_tsv(path))
    assert [(s, t) for _, s, t in streamed] == data.read_tsv(path)
    assert [n for n, _, _ in streamed] == [1, 4, 5, 6]


@pytest.mark.parametrize(
    "content",
    [b"a\tb\nno tab here\n", b"a\tb\n\tb\n", b"a\tb\nx\ty\tz\n", b"a\tb\n\xff\tb\n", b"\n\n", b""],
)
def test_iter_tsv_errors_match_read_tsv(tmp_path, content):
    path = tmp_path / "bad.tsv"
    path.write_bytes(content)
    with pytest.raises(data.DataError) as expected:
        data.read_tsv(path)
    with pytest.raises(data.DataError) as got:
        list(iter_tsv(path))
    assert str(got.value) == str(expected.value)


def _corpus(n=50):
    rng = np.random.default_rng(0)
    words = ["w%d" % i for i in range(30)]
    return [(" ".join(rng.choice(words, rng.integers(1, 9))), " ".join(rng.choice(words, rng.integers(1, 12))))
            for _ in range(n)]


@pytest.mark.parametrize("kind", ["word", "bpe"])
def test_flat_arrays_hold_each_examples_ids_across_chunks(monkeypatch, kind):
    pairs = _corpus()
    tok = tk.train(kind, [s for s, _ in pairs] + [t for _, t in pairs], vocab_size=None if kind == "word" else 60)
    monkeypatch.setattr(parallel_text, "_ENCODE_CHUNK", 7)  # several chunks, the last one short
    text = data.TextPairs(pairs, tok, tok, max_len=100)
    assert len(text) == len(pairs) and text.kept == list(range(len(pairs)))
    assert text._source_ids.dtype == np.int32 and text._source_offsets.dtype == np.int64
    for i, (s, t) in enumerate(pairs):
        assert text.source(i).tolist() == tok.encode(s)
        assert text.target(i).tolist() == tok.encode(t)
    assert text.source_lengths.tolist() == [len(tok.encode(s)) + 1 for s, _ in pairs]
    # 4 bytes a token and 8 an offset and a length per example and side: no object per pair.
    tokens = sum(len(tok.encode(s)) + len(tok.encode(t)) for s, t in pairs)
    assert text.nbytes == 4 * tokens + 2 * 8 * (len(pairs) + 1) + 2 * 8 * len(pairs)


def test_pairs_over_max_len_are_dropped_in_any_chunk_and_counted(monkeypatch):
    pairs = _corpus()
    vocab = data.Vocab.build([s for s, _ in pairs] + [t for _, t in pairs])
    monkeypatch.setattr(parallel_text, "_ENCODE_CHUNK", 5)
    text = data.TextPairs(iter(pairs), vocab, vocab, max_len=8, length_multiple=1)  # any iterable of pairs
    fits = [i for i, (s, t) in enumerate(pairs) if max(len(s.split()), len(t.split())) + 1 <= 8]
    assert text.kept == fits and text.dropped == len(pairs) - len(fits) > 0
    assert text.longest_dropped == max(max(len(s.split()), len(t.split())) for i, (s, t) in enumerate(pairs)
                                       if i not in fits)
    batch = text._batch_of([0, 1])  # each row its example's ids, then EOS
    for row, i in enumerate([0, 1]):
        ids = [vocab.encode(pairs[text.kept[i]][0])][0]
        assert batch.source[row, : len(ids) + 1].tolist() == ids + [data.EOS]


def test_every_pair_too_long_is_an_error():
    pairs = _corpus(n=5)
    vocab = data.Vocab.build([s for s, _ in pairs] + [t for _, t in pairs])
    with pytest.raises(data.DataError, match="all 5 are longer than max_len=2"):
        data.TextPairs(pairs, vocab, vocab, max_len=2)


def test_unknown_token_rates_count_every_unk_of_each_side():
    vocab = data.Vocab.build(["a b", "c"])
    text = data.TextPairs([("a b zz", "c"), ("b", "c qq qq")], vocab, vocab, max_len=8)
    assert text.unknown_rates() == (1 / 4, 2 / 4)
