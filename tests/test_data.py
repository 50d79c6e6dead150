"""Data: synthetic tasks, TSV reading, vocabularies, bucketed batches (pure numpy)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaxformer_mini.data import (
    BOS,
    EOS,
    NUM_SPECIAL,
    PAD,
    SPECIAL_TOKENS,
    TASKS,
    UNK,
    Batch,
    DataError,
    EmptySideError,
    SyntheticTask,
    TextPairs,
    Vocab,
    check_columns,
    iter_tsv,
    make_batch,
    make_source,
    pad_batch,
    read_tsv,
)


def content_of(row):
    """The tokens of a source or target_out row before its first EOS."""
    row = list(row)
    return row[: row.index(EOS)]


def assert_well_formed(batch):
    """Every row: tokens, then EOS (source, target_out) or BOS first (target_in), then PAD only."""
    assert all(a.dtype == np.int32 for a in batch)
    assert batch.target_in.shape == batch.target_out.shape
    for src, t_in, t_out in zip(*batch):
        for row in (src, t_out):
            if not row.any():  # a fill row: PAD only
                continue
            n = list(row).index(EOS)
            assert PAD not in row[:n] and BOS not in row[:n]
            assert (row[n + 1 :] == PAD).all(), "padding only after EOS"
        if t_out.any():
            n = list(t_out).index(EOS)
            np.testing.assert_array_equal(t_in[: n + 1], [BOS, *t_out[:n]])
            assert (t_in[n + 1 :] == PAD).all()


# ----------------------------------------------------------------------------- helpers


def test_special_ids_are_fixed_and_pad_is_the_model_pad_index():
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert SPECIAL_TOKENS == ("<pad>", "<bos>", "<eos>", "<unk>") and NUM_SPECIAL == 4


def test_pad_batch_right_pads_with_pad_and_never_truncates():
    out = pad_batch([[5, 6, 7], [8], []])
    np.testing.assert_array_equal(out, [[5, 6, 7], [8, 0, 0], [0, 0, 0]])
    assert out.dtype == np.int32
    assert pad_batch([[5]], length=4).shape == (1, 4)
    with pytest.raises(ValueError, match="length 3 does not fit length=2"):
        pad_batch([[5, 6, 7]], length=2)
    with pytest.raises(TypeError, match="integer"):
        pad_batch([[0.5, 1.0]])


def test_make_batch_shifts_target_by_one_and_counts_label_tokens():
    batch = make_batch([[7, 8]], [[9, 10, 11]])
    np.testing.assert_array_equal(batch.source, [[7, 8, EOS]])
    np.testing.assert_array_equal(batch.target_in, [[BOS, 9, 10, 11]])
    np.testing.assert_array_equal(batch.target_out, [[9, 10, 11, EOS]])
    assert batch.num_tokens == 4
    np.testing.assert_array_equal(make_source([[7], [8, 9]]), [[7, EOS, PAD], [8, 9, EOS]])


@pytest.mark.parametrize("sources, targets, exc, match", [
    # Unchecked: "TypeError: Value after * must be an iterable, not int".
    pytest.param([7, 8], [9, 10], ValueError, r"^source 0 must be one-dimensional \(a sequence of ids\), got shape \(\) "
                 r"\(7: a list of ids where a list of sequences belongs\?\)$", id="flat_sources"),
    pytest.param([[7]], [9], ValueError, r"^target 0 must be one-dimensional", id="flat_targets"),
    pytest.param([[7]], [[[9]]], ValueError, r"^target 0 must be one-dimensional \(a sequence of ids\), got shape \(1, 1\)$",
                 id="nested_targets"),
    # Named as text, not as pad_batch's "sequence 0 must hold integer ids, got dtype <U3".
    pytest.param(["a b"], [[9]], TypeError, r"^source 0 must hold integer ids, got text 'a b' \(encode it first: a Vocab "
                 r"or a tokenizer\)$", id="text"),
    pytest.param([[7]], [[9.0]], TypeError, r"^target 0 must hold integer ids, got dtype float64$", id="floats"),
])
def test_make_batch_names_the_side_and_row_that_is_no_sequence_of_ids(sources, targets, exc, match):
    with pytest.raises(exc, match=match):
        make_batch(sources, targets)


# ----------------------------------------------------------------------------- synthetic tasks


@pytest.fixture
def reverse_task():
    return SyntheticTask("reverse", vocab_size=13, min_len=2, max_len=7)


def test_synthetic_batch_is_a_function_of_seed_and_step(reverse_task):
    again = SyntheticTask("reverse", vocab_size=13, min_len=2, max_len=7)
    a, b = reverse_task.batch(3, 5, 11), again.batch(3, 5, 11)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.source, reverse_task.batch(3, 6, 11).source), "different steps differ"
    assert not np.array_equal(a.source, reverse_task.batch(4, 5, 11).source), "different seeds differ"


@pytest.mark.parametrize("name", TASKS)
def test_synthetic_targets_are_correct_for_every_row(name):
    task = SyntheticTask(name, vocab_size=11, min_len=1, max_len=9)
    batch = task.batch(0, 0, 64)
    for src, t_out in zip(batch.source, batch.target_out):
        content = content_of(src)
        expected = {"copy": content, "reverse": content[::-1], "sort": sorted(content)}[name]
        assert content_of(t_out) == expected
    assert_well_formed(batch)


def test_synthetic_batches_have_fixed_shape_and_lengths_span_min_to_max(reverse_task):
    batch = reverse_task.batch(0, 1, 200)
    L = reverse_task.model_max_len
    assert L == 8
    assert batch.source.shape == batch.target_in.shape == batch.target_out.shape == (200, L)
    lengths = {len(content_of(row)) for row in batch.source}
    assert lengths == set(range(2, 8))
    content = np.concatenate([content_of(row) for row in batch.source])
    assert content.min() >= NUM_SPECIAL and content.max() < 13
    assert_well_formed(batch)


def test_eval_batches_are_deterministic_and_differ_from_training_batches(reverse_task):
    held_out = reverse_task.eval_batches(seed=0, num_batches=3, batch_size=16)
    assert len(held_out) == 3
    again = reverse_task.eval_batches(seed=0, num_batches=3, batch_size=16)
    for x, y in zip(held_out, again, strict=True):
        np.testing.assert_array_equal(x.source, y.source)
        for step in range(10):
            assert not np.array_equal(x.source, reverse_task.batch(0, step, 16).source)
        assert_well_formed(x)


@pytest.mark.parametrize(
    "args, message",
    [
        (("shuffle", 10, 1, 5), "unknown task 'shuffle'; choose one of: copy, reverse, sort"),
        (("copy", 5, 1, 5), "vocab_size must be > 5"),
        (("copy", 10, 0, 5), "min_len must be >= 1"),
        (("copy", 10, 6, 5), "min_len=6 is greater than max_len=5"),
    ],
)
def test_synthetic_task_rejects_bad_configuration(args, message):
    with pytest.raises(ValueError, match=message):
        SyntheticTask(*args)


def test_task_text_round_trips_and_reverse_prints_user_values(reverse_task):
    ids = reverse_task.encode_text("5 3 8 2 7")
    assert ids == [9, 7, 12, 6, 11]
    assert reverse_task.decode_ids(ids) == "5 3 8 2 7"
    assert reverse_task.decode_ids(reverse_task.solve(ids)) == "7 2 8 3 5"
    # Output decoding stops at EOS and skips PAD/BOS.
    assert reverse_task.decode_ids([BOS, 9, PAD, 7, EOS, 12, 6]) == "5 3"


@pytest.mark.parametrize("text, bad", [("5 a 3", "'a'"), ("5 9", "'9'"), ("-1", "'-1'"), ("1_0", "'1_0' is not an integer"),
                                       ("\u0663", "'\u0663' is not an integer"), ("--5", "'--5' is not an integer")])
def test_task_text_rejects_bad_tokens_by_name(reverse_task, text, bad):
    with pytest.raises(ValueError, match=bad):
        reverse_task.encode_text(text)


# ----------------------------------------------------------------------------- TSV files


def write(tmp_path, text, name="pairs.tsv"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def test_read_tsv_reads_pairs_skips_blank_lines_and_handles_crlf(tmp_path):
    path = write(tmp_path, "\ufeffein Haus\ta house\r\n\n  \nGrüße\tgreetings\n")
    assert read_tsv(path) == [("ein Haus", "a house"), ("Grüße", "greetings")]


def test_a_bom_starting_a_later_line_of_files_joined_by_cat_is_not_read_as_text(tmp_path):
    # Two files each saved with a BOM and joined by `cat`: the second's BOM starts line 2 (and a
    # CRLF file's, line 3); its U+FEFF would otherwise be the start of a source word.
    path = write(tmp_path, b"\xef\xbb\xbfein Haus\ta house\n\xef\xbb\xbfGr\xc3\xbc\xc3\x9fe\tgreetings\r\n"
                           b"\xef\xbb\xbfHaus\thouse\r\n")
    assert list(iter_tsv(path)) == [(1, "ein Haus", "a house"), (2, "Grüße", "greetings"), (3, "Haus", "house")]


@pytest.mark.parametrize("name, text, hinted", [
    ("field.tsv", b"a b\tb a\nc d\rx\te f\n", True),  # a lone \r inside line 2's source
    ("mac.tsv", b"a b\tb a\rc d\rx\te\tf\r", True),  # old Mac line ends, the last one at the end
    ("crlf.tsv", b"a b\tb a\r\nc d\r\nx\te f\r\n", False),  # \r\n alone: an editor numbers as here
])
def test_a_bad_lines_number_says_when_lone_carriage_returns_count_as_line_ends(tmp_path, name, text, hinted):
    # A lone \r ends a line here, and an editor showing it as ^M numbers the lines otherwise:
    # "line 2 has no tab" points at a line the user sees with one.
    path = write(tmp_path, text, name)
    with pytest.raises(DataError, match=rf"{name}:2: expected one tab between source and target, found no tab") as e:
        list(iter_tsv(path))
    hint = r"carriage return (\r) not followed by \n as a line end, and this file has some"
    assert (hint in str(e.value)) == hinted, str(e.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("a\tb\nno tab here\n", r"pairs\.tsv:2: .*found no tab"),
        ("a\tb\n\nx\ty\tz\n", r"pairs\.tsv:3: .*found 2 tabs"),
        ("a\tb\n\t b\n", r"pairs\.tsv:2: empty source"),
        ("a\t \n", r"pairs\.tsv:1: empty target"),
        ("", r"pairs\.tsv: no source<TAB>target pairs \(the file is empty\)"),
        ("\n \n", r"pairs\.tsv: no source<TAB>target pairs \(its 2 lines are blank\)"),
        (b"a\tb\nc\t\xff\n", r"pairs\.tsv:2: not valid UTF-8"),
    ],
)
def test_read_tsv_errors_name_the_file_and_line(tmp_path, text, message):
    with pytest.raises(DataError, match=message):
        read_tsv(write(tmp_path, text))


def test_read_tsv_names_every_bad_line_at_once_and_calls_a_trailing_tab_so(tmp_path):
    # A messy export is fixed in one pass: the error names the bad lines, not the first alone.
    bad = [2, 4, 5] + list(range(7, 19))  # 15 bad lines; the first 1 + 10 are numbered
    lines = ["ok\tfine"] * 20
    lines[1] = "a\tb\t"  # a trailing tab
    lines[3], lines[4] = "no tab", "\tempty source"
    for n in range(7, 19):
        lines[n - 1] = "x\ty\tz"
    with pytest.raises(DataError) as info:
        read_tsv(write(tmp_path, "\n".join(lines) + "\n"))
    assert str(info.value) == (
        f"{tmp_path / 'pairs.tsv'}:2: expected one tab between source and target, found 2 tabs (one at the end "
        f"of the line: a trailing tab?) (and 14 more bad lines: {', '.join(map(str, bad[1:11]))}, ...)")


def test_read_tsv_columns_pick_source_and_target_of_a_wider_file_either_way_round(tmp_path):
    # A Tatoeba/Anki export: English, French, attribution (which may be empty).
    path = write(tmp_path, "Go.\tVa !\tCC-BY 2.0 #1\n\nHi.\tSalut !\t\n")
    assert read_tsv(path, columns=(1, 2)) == [("Go.", "Va !"), ("Hi.", "Salut !")]
    assert read_tsv(path, columns=[2, 1]) == [("Va !", "Go."), ("Salut !", "Hi.")]  # the other direction
    with pytest.raises(DataError, match=r"pairs\.tsv:3: empty source \(column 3\)"):
        read_tsv(path, columns=(3, 1))  # line 3's third column is empty
    with pytest.raises(DataError, match=r"pairs\.tsv:1: expected at least 4 tab-separated columns "
                                        r"\(--columns 4,1\), found 3 \(and 1 more bad line: 3\)"):
        read_tsv(path, columns=(4, 1))
    # Without columns: exactly two, and the error points to --columns.
    with pytest.raises(DataError, match=r"pairs\.tsv:1: expected one tab .* found 2 tabs; --columns S,T picks two"):
        read_tsv(path)


@pytest.mark.parametrize("columns", [(1, 1), (0, 2), (-1, 2), ("a", 2), (1, 2, 3), 5])
def test_columns_must_be_two_different_column_numbers_from_1(columns):
    with pytest.raises(DataError, match=r"columns must be two"):
        check_columns(columns)


# ----------------------------------------------------------------------------- vocabularies


def test_vocab_orders_specials_then_frequency_then_alphabet():
    vocab = Vocab.build(["b a c a", "c d a", "b"])
    # a:3, b:2, c:2, d:1 -> b before c alphabetically.
    assert vocab.tokens == SPECIAL_TOKENS + ("a", "b", "c", "d")
    assert len(vocab) == 8
    assert Vocab.build(["c d a", "b", "b a c a"]) == vocab, "order of texts does not matter"
    assert Vocab.build(["b a c a", "c d a", "b"], min_freq=2).tokens[NUM_SPECIAL:] == ("a", "b", "c")
    assert Vocab.build(["b a c a", "c d a", "b"], max_size=6).tokens[NUM_SPECIAL:] == ("a", "b")


def test_unknown_words_and_special_strings_encode_to_unk():
    vocab = Vocab.build(["the cat sat"])
    assert vocab.encode("the dog sat <eos> the") == [vocab.encode("the")[0], UNK, vocab.encode("sat")[0], UNK, vocab.encode("the")[0]]
    assert vocab.unk_count("the dog dog <eos>") == 3
    assert vocab.unknown_words("the dog dog <eos>") == ["dog", "<eos>"]


def test_vocab_decode_stops_at_eos_and_skips_pad_and_bos():
    vocab = Vocab.build(["the cat sat"])
    ids = vocab.encode("the cat sat")
    assert vocab.decode([BOS, *ids, EOS, *ids, PAD]) == "the cat sat"
    assert vocab.decode([ids[0], UNK]) == "the <unk>"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocab.decode([len(vocab)])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.text(alphabet="abcxyzé<>", min_size=1, max_size=4), max_size=6), min_size=1, max_size=5))
def test_vocab_encode_decode_round_trips_known_words(sentences):
    texts = [" ".join(words) for words in sentences]
    vocab = Vocab.build(texts)
    for words, text in zip(sentences, texts):
        decoded = vocab.decode(vocab.encode(text))
        assert decoded == " ".join(w if w not in SPECIAL_TOKENS else "<unk>" for w in words)


def test_vocab_save_load_round_trip(tmp_path):
    vocab = Vocab.build(["ein Haus", "das Haus", "Grüße"])
    path = tmp_path / "vocab.json"
    vocab.save(path)
    loaded = Vocab.load(path)
    assert loaded == vocab and loaded.tokens == vocab.tokens
    assert loaded.encode("das Haus Grüße") == vocab.encode("das Haus Grüße")


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not a vocabulary file"),
        (json.dumps({"tokens": list(SPECIAL_TOKENS)}), "not a vocabulary file"),
        (json.dumps({"format": "flaxformer-mini-vocab", "version": 99, "tokens": []}), "version 99 is not supported"),
        (json.dumps({"format": "flaxformer-mini-vocab", "version": 1, "tokens": ["a", "b"]}), "must start with the special tokens"),
        (json.dumps({"format": "flaxformer-mini-vocab", "version": 1, "tokens": [*SPECIAL_TOKENS, "a", "a"]}), "duplicate"),
        (json.dumps({"format": "flaxformer-mini-vocab", "version": 1, "tokens": [*SPECIAL_TOKENS, "a b"]}), "whitespace-free"),
    ],
)
def test_vocab_load_rejects_malformed_files_naming_the_file(tmp_path, content, message):
    path = tmp_path / "bad_vocab.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=rf"bad_vocab\.json: .*{message}"):
        Vocab.load(path)


# ----------------------------------------------------------------------------- text pairs


def make_pairs(n=203, seed=0):
    """Distinct pairs (each source starts with its own id word) of lengths 1..20, target
    lengths close to source lengths, as in translation."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(n):
        length = int(rng.integers(1, 21))
        src = [f"s{i}"] + [f"w{k}" for k in rng.integers(0, 30, length - 1)]
        tgt = [f"t{k}" for k in rng.integers(0, 30, max(1, length + int(rng.integers(-2, 3))))]
        pairs.append((" ".join(src), " ".join(tgt)))
    return pairs


@pytest.fixture
def text_pairs():
    pairs = make_pairs()
    return TextPairs(pairs, Vocab.build(s for s, _ in pairs), Vocab.build(t for _, t in pairs), max_len=24, length_multiple=1)


def example_ids(batch, vocab):
    """The id word of every non-fill row."""
    return [vocab.decode(row).split()[0] for row in batch.source if row.any()]


def test_text_pairs_refuse_a_side_of_no_tokens_naming_its_line_or_pair():
    from flaxformer_mini.data import tokenizers

    pairs = [("a b", "x"), ("b", "\u2581"), ("\u2581 \u2581", "x"), ("a", "x")]
    char = tokenizers.train("char", [text for pair in pairs for text in pair])
    with pytest.raises(EmptySideError) as info:
        TextPairs(pairs, char, char, max_len=8, line_numbers=[3, 5, 6, 9])
    assert info.value.where == "5"
    assert str(info.value) == ("empty target once the tokenizer normalises '\u2581' (it reads U+2581 '\u2581' as a "
                               "space and strips spaces at the ends); 1 more such pair after it")
    with pytest.raises(EmptySideError) as info:
        TextPairs(pairs[2:], char, char, max_len=8)
    assert info.value.where == "pair 1" and str(info.value).startswith("empty source once")
    # The word tokenizer splits on whitespace alone: U+2581 is a word of its own there.
    words = Vocab.build(text for pair in pairs for text in pair)
    assert len(TextPairs(pairs, words, words, max_len=8)) == 4


def test_text_pairs_drop_pairs_longer_than_max_len_and_count_them():
    pairs = [("a b c", "x y"), ("a", "x y z w"), ("a b", "x")]
    src, tgt = Vocab.build(s for s, _ in pairs), Vocab.build(t for _, t in pairs)
    data = TextPairs(pairs, src, tgt, max_len=4)  # "a b c"+EOS fits; "x y z w"+EOS does not
    assert len(data) == 2 and data.dropped == 1
    with pytest.raises(DataError, match="all 3 are longer than max_len=2"):
        TextPairs(pairs, src, tgt, max_len=2)


def test_bucketing_covers_every_example_once_per_epoch(text_pairs):
    batch_size = 16
    steps = text_pairs.steps_per_epoch(batch_size)
    assert steps == 13  # ceil(203 / 16)
    epochs = []
    for epoch in range(2):
        seen = []
        for step in range(epoch * steps, (epoch + 1) * steps):
            batch = text_pairs.batch(seed=7, step=step, batch_size=batch_size)
            assert batch.source.shape[0] == batch_size, "fill rows keep the batch size fixed"
            assert_well_formed(batch)
            seen += example_ids(batch, text_pairs.source_vocab)
        assert sorted(seen) == sorted(f"s{i}" for i in range(203))
        epochs.append(seen)
    assert epochs[0] != epochs[1], "each epoch has its own order"


def test_bucketed_batches_are_a_function_of_seed_and_step(text_pairs):
    pairs = make_pairs()
    fresh = TextPairs(pairs, text_pairs.source_vocab, text_pairs.target_vocab, max_len=24, length_multiple=1)
    for step in (0, 5, 30, 4):  # across epochs, and back: the epoch cache does not matter
        for x, y in zip(text_pairs.batch(1, step, 16), fresh.batch(1, step, 16)):
            np.testing.assert_array_equal(x, y)
    assert not np.array_equal(text_pairs.batch(1, 0, 16).source, text_pairs.batch(2, 0, 16).source)


def test_bucketing_pads_less_than_random_batching(text_pairs):
    batch_size = 16

    def padding(batches):
        total = sum(b.source.size + b.target_out.size for b in batches)
        real = sum(np.count_nonzero(b.source) + int(b.num_tokens) for b in batches)
        return 1 - real / total

    steps = text_pairs.steps_per_epoch(batch_size)
    bucketed = [text_pairs._batch_of(rows) for rows in text_pairs._epoch_plan(0, 0, batch_size)]
    assert len(bucketed) == steps
    order = np.random.default_rng(0).permutation(len(text_pairs))
    random = [text_pairs._batch_of(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]
    assert padding(bucketed) < 0.5 * padding(random)
    # The public batches (with fill rows) carry the same labels.
    assert sum(int(text_pairs.batch(0, s, batch_size).num_tokens) for s in range(steps)) == sum(int(b.num_tokens) for b in bucketed)


def test_length_multiple_rounds_batch_lengths_up_to_max_len():
    pairs = [("a b c", "x"), ("a", "x y z w v")]
    src, tgt = Vocab.build(s for s, _ in pairs), Vocab.build(t for _, t in pairs)
    data = TextPairs(pairs, src, tgt, max_len=7, length_multiple=4)
    batch = next(data.iter_eval_batches(2))
    assert batch.source.shape == (2, 4)  # longest 4 -> 4
    assert batch.target_out.shape == (2, 7)  # longest 6 -> 8, capped at max_len


def test_eval_batches_yield_every_example_in_order(text_pairs):
    batches = list(text_pairs.iter_eval_batches(50))
    assert [b.source.shape[0] for b in batches] == [50, 50, 50, 50, 3]
    ids = [i for b in batches for i in example_ids(b, text_pairs.source_vocab)]
    assert ids == [f"s{i}" for i in range(203)]
    for b in batches:
        assert_well_formed(b)


def test_text_batches_decode_back_to_the_pairs():
    pairs = [("ein Haus", "a house"), ("das Haus", "the house")]
    src, tgt = Vocab.build(s for s, _ in pairs), Vocab.build(t for _, t in pairs)
    batch = next(TextPairs(pairs, src, tgt, max_len=8).iter_eval_batches(2))
    assert isinstance(batch, Batch)
    assert [(src.decode(s), tgt.decode(t)) for s, t in zip(batch.source, batch.target_out)] == pairs
    assert [tgt.decode(t) for t in batch.target_in] == ["a house", "the house"]
