"""What a new text run says at its start about its own training file, before any step: each
case is ``Run.start`` on a few lines (tokenizers and encoding only, nothing compiled)."""

import pytest

from flaxformer_mini.runs.config import DataConfig, TrainOptions
from flaxformer_mini.runs.run import Run


def start_notes(tmp_path, lines, **data):
    train = tmp_path / "train.tsv"
    train.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    notes = []
    config = DataConfig(kind="tsv", max_len=23, train_path=str(train), **data)
    Run.start(tmp_path / "run", TrainOptions(preset="tiny"), config, echo=notes.append).close()
    return train, notes


def test_held_out_pairs_that_repeated_lines_also_train_on_are_counted_in_a_warning(tmp_path):
    # 50 copies of one pair: the 5 held out (a tenth) all have copies among the 45 trained on.
    train, notes = start_notes(tmp_path, ["a b\tb a"] * 50, holdout=512)
    assert notes == [f"warning: 5 of the 5 pairs held out of {train} (no --valid) are also training pairs, on "
                     "repeated lines: the held-out scores partly measure pairs the model trains on; remove repeated "
                     "lines (sort -u) or give --valid FILE"]


@pytest.mark.parametrize("holdout", [512, 0])
def test_distinct_lines_or_no_held_out_pairs_give_no_repeated_line_warning(tmp_path, holdout):
    # Distinct lines of 8 words, each word on 14 lines: the held-out pairs' words are trained on too.
    words = [f"w{i}" for i in range(8)]
    lines = [f"{a} {b}\t{b} {a}" for a in words for b in words if a != b] if holdout else ["a b\tb a"] * 50
    assert start_notes(tmp_path, lines, holdout=holdout)[1] == []


def test_held_out_pairs_of_words_no_other_line_has_are_warned_of_without_the_columns_hint(tmp_path):
    # A corpus of ids: "common id{i}" -> "id{i}", each id on one line alone. The 5 pairs held out
    # have ids the tokenizers never saw: half their source tokens and all their target tokens
    # are <unk>, and their scores measure that. Their columns are the trained ones: no hint of a swap.
    lines = [f"common id{i}\tid{i}" for i in range(50)]
    train, notes = start_notes(tmp_path, lines, holdout=512)
    assert notes == [f"warning: {train} (its 5 pairs held out, no --valid): 50.0% of its source tokens and 100.0% of "
                     "its target tokens are outside the vocabulary (the tokenizers trained on its other pairs) and read "
                     "as <unk>"]


def test_a_word_vocab_size_that_leaves_training_tokens_unknown_says_how_many(tmp_path):
    # 40 lines of two words each: "common" on every line, then one of 40 rare words. A vocabulary of
    # 4 specials + 2 words keeps "common" and one rare word: 39 of 80 source tokens are <unk>.
    lines = [f"common r{i:02d}\tcommon" for i in range(40)]
    train, notes = start_notes(tmp_path, lines, holdout=0, tokenizer="word", tokenizer_vocab_size=6)
    assert notes == ["note: --vocab-size 6 asked for, the word tokenizer learnt 5 (target): all the training text "
                     "gave it; the model's vocabulary is that size",
                     f"note: --vocab-size 6 leaves 48.8% of the source tokens of {train} outside the word vocabulary, "
                     "read as <unk>; a larger --vocab-size, or --tokenizer bpe or unigram, keeps more of them"]


def test_a_large_training_file_is_said_before_it_is_read_and_encoded_and_how_long_that_took(tmp_path, monkeypatch):
    import re

    from flaxformer_mini.runs import run

    monkeypatch.setattr(run, "LARGE_TRAINING_FILE_BYTES", 1000)  # the file below: 50 lines of 20 bytes, 1000 in all
    lines = [f"w{i:02d} x y z\tz y x w{i:02d}" for i in range(50)]
    train, notes = start_notes(tmp_path, lines, holdout=512, tokenizer="bpe", tokenizer_vocab_size=40)
    assert notes[0] == f"reading {train} (0 MiB) and encoding its pairs with bpe tokenizers trained on it"
    assert re.fullmatch(r"read 45 training and 5 held-out pairs in \d+ s", notes[1]), notes
    # A resume reads the tokenizers it saved; a file under the size says nothing.
    notes.clear()
    config = DataConfig(kind="tsv", max_len=23, train_path=str(train), holdout=512, tokenizer="bpe",
                        tokenizer_vocab_size=40)
    Run.start(tmp_path / "run", TrainOptions(preset="tiny"), config, echo=notes.append).close()
    assert notes[0] == f"reading {train} (0 MiB) and encoding its pairs with its tokenizers saved in the run"
    monkeypatch.setattr(run, "LARGE_TRAINING_FILE_BYTES", 1001)
    notes.clear()
    Run.start(tmp_path / "run", TrainOptions(preset="tiny"), config, echo=notes.append).close()
    assert notes == []


def test_a_word_vocabulary_over_the_large_size_is_said_with_the_parameters_it_costs(tmp_path, monkeypatch):
    from flaxformer_mini.runs import run

    monkeypatch.setattr(run, "LARGE_WORD_VOCABULARY", 55)
    # 50 words and "x" a side, with the 4 specials 55 tokens: three tables of 55 rows of the tiny
    # preset's width 30, and the output layer's 55 biases.
    _, notes = start_notes(tmp_path, [f"w{i:02d} x\tx w{i:02d}" for i in range(50)], holdout=0)
    assert notes == ["note: the word tokenizer keeps every word of the training text, a vocabulary of 55 (source) "
                     "and 55 (target) tokens; the embeddings and the output layer hold 5,005 parameters; "
                     "--vocab-size N keeps the N - 4 most frequent words, --tokenizer bpe or unigram splits the rare "
                     "ones into pieces"]
    monkeypatch.setattr(run, "LARGE_WORD_VOCABULARY", 56)
    (tmp_path / "smaller").mkdir()
    _, notes = start_notes(tmp_path / "smaller", [f"w{i:02d} x\tx w{i:02d}" for i in range(50)], holdout=0)
    assert notes == []


def test_the_evaluation_line_counts_the_held_out_pairs_that_are_too_long_apart(tmp_path):
    # 50 distinct pairs, every fifth 30 words long (over --max-len 24): the fixed split holds out
    # lines 14, 16, 25, 30 and 40, of which line 16 (pair 15) is a long one.
    lines = [(f"w{i} " * (30 if i % 5 == 0 else 1)).strip() + f"\tx{i}" for i in range(50)]
    train = tmp_path / "train.tsv"
    train.write_text("".join(line + "\n" for line in lines))
    config = DataConfig(kind="tsv", max_len=23, train_path=str(train), holdout=512)
    run = Run.start(tmp_path / "run", TrainOptions(preset="tiny"), config, echo=lambda m: None)
    run.close()
    assert (run.data.held_out_pairs, len(run.data.eval)) == (5, 4)
    assert run.describe_evaluation() == ("evaluating on 4 of 4 held-out pairs from 5 training pairs held out (no "
                                         "--valid, 1 of them longer than --max-len); --valid-size sets how many")
