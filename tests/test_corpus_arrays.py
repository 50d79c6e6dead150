"""EncodedCorpus and iter_tsv: the same pairs, ids and errors as data.read_tsv / TextPairs."""

import numpy as np
import pytest

from flaxformer_mini import data
from flaxformer_mini.data import tokenizers as tk
from flaxformer_mini.data.corpus_arrays import EncodedCorpus
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


def _corpus_file(tmp_path, n=50):
    rng = np.random.default_rng(0)
    words = ["w%d" % i for i in range(30)]
    lines = [
        " ".join(rng.choice(words, rng.integers(1, 9))) + "\t" + " ".join(rng.choice(words, rng.integers(1, 12)))
        for _ in range(n)
    ]
    path = tmp_path / "c.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path, [line.split("\t") for line in lines]


@pytest.mark.parametrize("kind", ["word", "bpe"])
def test_flat_arrays_hold_each_examples_ids(tmp_path, kind):
    path, pairs = _corpus_file(tmp_path)
    tok = tk.train(kind, [s for s, _ in pairs] + [t for _, t in pairs], vocab_size=None if kind == "word" else 60)
    corpus = EncodedCorpus.from_tsv(path, tok, tok, chunk_lines=7)  # several chunks
    assert len(corpus) == len(pairs)
    assert corpus.source_ids.dtype == np.int32 and corpus.source_offsets.dtype == np.int64
    for i, (s, t) in enumerate(pairs):
        assert corpus.source(i).tolist() == tok.encode(s)
        assert corpus.target(i).tolist() == tok.encode(t)
    assert corpus.source_lengths.tolist() == [len(tok.encode(s)) + 1 for s, _ in pairs]
    assert corpus.line_numbers.tolist() == list(range(1, len(pairs) + 1))


def test_max_len_drops_what_textpairs_drops_and_batches_match(tmp_path):
    path, pairs = _corpus_file(tmp_path)
    vocab = data.Vocab.build([s for s, _ in pairs] + [t for _, t in pairs])
    tok = tk.WordTokenizer(vocab)
    corpus = EncodedCorpus.from_tsv(path, tok, tok, max_len=8, chunk_lines=5)
    reference = data.TextPairs(pairs, vocab, vocab, max_len=8, length_multiple=1)
    assert corpus.dropped == reference.dropped > 0
    assert len(corpus) == len(reference)
    got = corpus.batch([0, 3, 4])
    want = reference._batch_of([0, 3, 4])
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_every_pair_too_long_is_an_error(tmp_path):
    path, pairs = _corpus_file(tmp_path, n=5)
    tok = tk.train("word", [s for s, _ in pairs] + [t for _, t in pairs])
    with pytest.raises(data.DataError, match="all 5 are longer than max_len=1"):
        EncodedCorpus.from_tsv(path, tok, tok, max_len=1)


def test_unknown_tokens_are_counted(tmp_path):
    path = tmp_path / "u.tsv"
    path.write_text("a b zz\tc\nb\tc qq qq\n")
    tok = tk.train("word", ["a b", "c"])
    assert EncodedCorpus.from_tsv(path, tok, tok).unk_counts() == (1, 2)
