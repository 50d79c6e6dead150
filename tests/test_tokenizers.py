"""Tokenizers: special ids, exact round trips, word-kind compatibility, bad input."""

import os
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flaxformer_mini import data
from flaxformer_mini.data import tokenizers as tk

TEXTS = [
    "the cat sat on the mat",
    "a dog ate my homework",
    "héllo wörld, naïve café",
    "the the the cat cat",
]


@pytest.mark.parametrize("kind", ["char", "bpe", "unigram"])
def test_special_tokens_have_data_module_ids(kind):
    tok = tk.train(kind, TEXTS, vocab_size=None if kind == "char" else 60)
    for i, token in enumerate(data.SPECIAL_TOKENS):
        assert tok.hf.token_to_id(token) == i
    assert (data.PAD, data.BOS, data.EOS, data.UNK) == (0, 1, 2, 3)


def test_normalize_is_nfc_collapsed_whitespace_stripped():
    # Expected values written independently with the standard library.
    raw = "  e\u0301te\t\t  \u00a0ok\n"
    assert tk.normalize(raw) == unicodedata.normalize("NFC", "\u00e9te ok")
    assert tk.normalize("a\u2581b") == "a b"  # the Metaspace mark reads as a space


@pytest.mark.parametrize("kind", ["char", "bpe", "unigram"])
def test_roundtrip_on_training_text(kind):
    tok = tk.train(kind, TEXTS, vocab_size=None if kind == "char" else 60)
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text
        assert data.UNK not in tok.encode(text)


# Text over a small alphabet with arbitrary whitespace runs, including Unicode spaces and a
# decomposed accent that NFC composes.
_piece = st.sampled_from(list("abcxyz<>.\u00e9 \t\u00a0\n") + ["e\u0301", "  "])
_text = st.lists(_piece, max_size=30).map("".join)


@pytest.mark.parametrize("kind", ["char", "bpe", "unigram"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_text, min_size=1, max_size=6))
def test_decode_encode_is_identity_on_normalised_text(kind, texts):
    corpus = texts + ["abcxyz <>. é"]  # every character occurs at least once in training
    alphabet = len(tk._alphabet(kind, corpus)) + data.NUM_SPECIAL
    tok = tk.train(kind, corpus, vocab_size=None if kind == "char" else alphabet + 10)
    for text in texts:
        assert tok.decode(tok.encode(text)) == tk.normalize(text)


@pytest.mark.parametrize("kind", ["char", "bpe", "unigram"])
def test_literal_special_token_text_never_encodes_to_a_control_id(kind):
    tok = tk.train(kind, TEXTS + ["<eos> <pad> <bos>"], vocab_size=None if kind == "char" else 80)
    ids = tok.encode("cat <eos> <pad> <bos> mat")
    assert not {data.PAD, data.BOS, data.EOS} & set(ids)


def test_unknown_characters_are_reported_in_order():
    tok = tk.train("char", TEXTS)
    assert tok.unknown("cat QZQ!") == ["Q", "Z", "!"]
    ids = tok.encode("cQt")
    assert ids[1] == data.UNK and tok.decode(ids) == "c<unk>t"


def test_unknown_words_for_word_kind_as_vocab_reports():
    tok = tk.train("word", TEXTS)
    vocab = data.Vocab.build(TEXTS)
    assert tok.unknown("the zebra ate zebra pie") == vocab.unknown_words("the zebra ate zebra pie") == ["zebra", "pie"]


def test_decode_stops_at_eos_and_strips_pad_bos():
    tok = tk.train("char", TEXTS)
    ids = tok.encode("cat")
    assert tok.decode([data.BOS, *ids, data.EOS, *tok.encode("dog"), data.PAD]) == "cat"


def test_word_kind_writes_the_vocab_file_byte_for_byte(tmp_path):
    tok = tk.train("word", TEXTS, vocab_size=12)
    path = tok.save(tmp_path, "source")
    assert path.name == "vocab_source.json"
    data.Vocab.build(TEXTS, max_size=12).save(tmp_path / "reference.json")
    assert path.read_bytes() == (tmp_path / "reference.json").read_bytes()


def test_word_kind_loads_an_existing_runs_vocab(tmp_path):
    vocab = data.Vocab.build(TEXTS)
    vocab.save(tmp_path / "vocab_target.json")
    tok = tk.load(tmp_path, "word", "target")
    assert tok.vocab == vocab and len(tok) == len(vocab)
    assert tok.encode("the cat zebra") == vocab.encode("the cat zebra")


@pytest.mark.parametrize("kind", ["word", "char", "bpe", "unigram"])
def test_save_load_gives_the_same_ids_and_checksum(tmp_path, kind):
    tok = tk.train(kind, TEXTS, vocab_size=None if kind in ("word", "char") else 60)
    path = tok.save(tmp_path, "shared")
    again = tk.load(tmp_path, kind, "shared", sha256=tok.sha256(tmp_path, "shared"))
    assert len(again) == len(tok)
    for text in TEXTS + ["unseen Q words"]:
        assert again.encode(text) == tok.encode(text)
    import hashlib

    assert tok.describe(tmp_path, "shared")["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_word_char_and_bpe_training_writes_the_same_files_in_any_process(tmp_path):
    # Two runs of one corpus (a run and its rerun, or a deleted vocabulary rebuilt on resume)
    # build the same tokenizer: no set or dict order of strings leaks into a vocabulary (Python
    # salts str hashes per process). Not unigram: Hugging Face's unigram trainer may order and
    # score its pieces differently from one process to the next, whatever PYTHONHASHSEED
    # (tokenizers 0.23; docs/data.md). A multi-process run therefore uses the files process 0
    # saved (Run.follow_main; tests/test_multiprocess.py).
    import subprocess
    import sys

    from simulated_devices import ROOT

    kinds = ("word", "char", "bpe")
    script = ("import sys; from pathlib import Path; from flaxformer_mini.data import tokenizers as tk; "
              f"texts = {TEXTS!r} * 3; out = Path(sys.argv[1])\n"
              f"for kind in {kinds!r}:\n"
              "    tk.train(kind, texts, vocab_size=None if kind in ('word', 'char') else 60).save(out, kind)")
    files = {}
    for seed in ("1", "2"):
        out = tmp_path / seed
        out.mkdir()
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, "-c", script, str(out)], env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        files[seed] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert len(files["1"]) == len(kinds), sorted(files["1"])
    assert files["1"] == files["2"]


def test_a_tokenizer_and_its_file_read_back_compare_equal_and_another_does_not():
    # Hugging Face's JSON reads -3.7611312505172005 back as -3.761131250517201 (one ulp), so a
    # unigram tokenizer in memory and its own file read back differ in their bytes; compared
    # after one reading back (run_dir.comparable_tokenizer_bytes) they are equal, and a
    # tokenizer with two pieces numbered the other way round is not.
    from tokenizers import Tokenizer, models

    from flaxformer_mini.runs.directory import comparable_tokenizer_bytes, tokenizer_bytes

    def unigram(pieces):
        vocab = [(t, 0.0) for t in tk.SPECIAL_TOKENS] + pieces
        return tk.HFTokenizer("unigram", Tokenizer(models.Unigram(vocab, unk_id=tk.UNK, byte_fallback=False)))

    trained = unigram([("\u2581a", -3.7611312505172005), ("b", -1.5)])
    read_back = tk.HFTokenizer("unigram", Tokenizer.from_str(trained.hf.to_str()))
    assert tokenizer_bytes(trained) != tokenizer_bytes(read_back)
    assert comparable_tokenizer_bytes(trained) == comparable_tokenizer_bytes(read_back)
    swapped = unigram([("b", -1.5), ("\u2581a", -3.7611312505172005)])
    assert comparable_tokenizer_bytes(swapped) != comparable_tokenizer_bytes(trained)
    word = tk.train("word", TEXTS).vocab  # what a run holds for the word kind (data.Vocab)
    assert comparable_tokenizer_bytes(word) == tokenizer_bytes(word)  # a Vocab's bytes are exact


def test_batch_encode_equals_encode():
    tok = tk.train("bpe", TEXTS, vocab_size=50)
    assert tok.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]


def test_hand_edited_tokenizer_file_is_rejected_naming_it(tmp_path):
    tok = tk.train("bpe", TEXTS, vocab_size=50)
    path = tok.save(tmp_path, "source")
    recorded = tok.sha256(tmp_path, "source")
    edited = path.read_text().replace("\u2581the", "\u2581thE", 1)
    assert edited != path.read_text()
    path.write_text(edited)
    with pytest.raises(tk.TokenizerFileError, match="tokenizer_source.json.*changed"):
        tk.load(tmp_path, "bpe", "source", sha256=recorded)


def test_missing_tokenizer_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(tk.TokenizerFileError, match="tokenizer_target.json.*missing"):
        tk.load(tmp_path, "unigram", "target")


def test_garbage_tokenizer_file_is_an_error_naming_it(tmp_path):
    (tmp_path / "tokenizer_source.json").write_text("{not json")
    with pytest.raises(tk.TokenizerFileError, match="tokenizer_source.json"):
        tk.load(tmp_path, "char", "source")


@pytest.mark.parametrize("kind", ["char", "bpe", "unigram"])
def test_vocab_size_below_alphabet_names_the_numbers(kind):
    # Distinct characters of TEXTS after normalisation, counted independently.
    chars = set("".join(unicodedata.normalize("NFC", t) for t in TEXTS))
    if kind != "char":
        chars = (chars - {" "}) | {"\u2581"}
    need = len(chars) + 4
    with pytest.raises(ValueError, match=f"vocab_size=10 .* {len(chars)} distinct characters .* = {need}"):
        tk.train(kind, TEXTS, vocab_size=10)
    tk.train(kind, TEXTS, vocab_size=need)  # exactly enough is fine


def test_subword_kinds_need_a_vocab_size():
    with pytest.raises(ValueError, match="needs a vocab_size"):
        tk.train("bpe", TEXTS)


def test_unknown_kind_lists_the_choices():
    with pytest.raises(ValueError, match="word, char, bpe, unigram"):
        tk.train("wordpiece", TEXTS)


def test_shared_vocabulary_encodes_both_sides():
    sources, targets = ["a b c", "b c"], ["x y", "y z"]
    tok = tk.train("char", sources + targets)
    for text in sources + targets:
        assert tok.decode(tok.encode(text)) == text


def test_resume_with_another_tokenizer_or_vocab_size_is_refused(tmp_path):
    tok = tk.train("bpe", TEXTS, vocab_size=60)
    tok.save(tmp_path, "shared")
    recorded = tok.describe(tmp_path, "shared")
    tk.check_resume(recorded, "bpe", 60)
    tk.check_resume(recorded, None, None)
    with pytest.raises(ValueError, match="--tokenizer bpe, not unigram"):
        tk.check_resume(recorded, "unigram", 60)
    with pytest.raises(ValueError, match="--vocab-size 60 .* not 80"):
        tk.check_resume(recorded, "bpe", 80)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_tokenizer_drops_in_where_a_vocab_is_used(kind):
    tok = tk.train(kind, TEXTS, vocab_size=None if kind == "char" else 60)
    pairs = [(t, t) for t in TEXTS]
    text_pairs = data.TextPairs(pairs, tok, tok, max_len=64, length_multiple=1)
    batch = next(text_pairs.iter_eval_batches(len(pairs)))
    for row, text in zip(batch.source, TEXTS):
        assert tok.decode(row) == text
    assert tok.unknown_words("cat Q") == ["Q"] and tok.unk_count("QQ cat Q") == 3
