"""`flaxformer-mini generate` reading standard input: output line i is always input line i's.

Blank lines give empty output lines, a line longer than the model takes gives an empty output
line and a warning naming it (the other lines are still decoded, exit code 0), and the input
is read as the training files are: a UTF-8 BOM skipped, \\r\\n and a lone \\r ending lines.
"""

import pytest

from flaxformer_mini import generation
from test_real_corpora import text_args, write_corpus
from test_train_cli import TINY_RUN, cli

# TINY_RUN's model: max_len 6, so at most 5 tokens and EOS; token values 0..6.
LONGEST_FITTING = 5
FITTING = ["5 3 6 2", "1", "0 0 4", "6 5 4 3 2", "2 2"]
TOO_LONG = "1 2 3 4 5 6"  # 6 tokens


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("generate_lines") / "run"
    # Trained until no FITTING input decodes to an empty line, which would look left empty.
    proc = cli("train", *TINY_RUN, "--steps", "60", "--lr", "1e-2", "--save-every", "60", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def alone(run):
    """Each fitting input decoded alone, as a command-line argument."""
    outputs = {}
    for text in FITTING:
        proc = cli("generate", "--checkpoint", str(run), text)
        assert proc.returncode == 0, proc.stderr
        outputs[text] = proc.stdout.removesuffix("\n")
    assert all(outputs.values()), outputs  # so an empty output line can only be a skipped one
    return outputs


def mixed_lines():
    """40 lines (more than one chunk at --batch-size 2: 32 lines a chunk): fitting lines with a
    blank line, a whitespace-only one and over-long ones among them; a chunk boundary falls
    between the two over-long lines."""
    lines = [FITTING[i % len(FITTING)] for i in range(40)]
    lines[1], lines[6], lines[7] = "", "   \t ", TOO_LONG
    lines[33] = TOO_LONG + " 1 2"  # 8 tokens, in the second chunk
    lines[39] = ""
    return lines


@pytest.fixture(scope="module")
def mixed(run):
    lines = mixed_lines()
    proc = cli("generate", "--checkpoint", str(run), "--batch-size", "2", stdin="".join(t + "\n" for t in lines))
    return lines, proc


def test_every_input_line_gets_its_output_line_in_order(mixed, alone):
    lines, proc = mixed
    assert proc.returncode == 0, proc.stderr
    outputs = proc.stdout.split("\n")
    assert outputs[-1] == "" and len(outputs) - 1 == len(lines) == 40
    for i, (line, output) in enumerate(zip(lines, outputs), 1):
        expected = alone.get(line, "")  # blank and over-long lines: an empty output line
        assert output == expected, f"line {i} ({line!r})"
    assert sum(1 for line in lines if line in alone) == 35  # most lines were decoded


def test_an_over_long_line_is_named_with_its_line_number_length_and_the_limit(mixed):
    lines, proc = mixed
    warnings = [w for w in proc.stderr.splitlines() if w.startswith("warning:")]
    assert warnings == [
        "warning: line 8 has 6 tokens; with EOS that exceeds the model's max_len=6, so at most 5 tokens fit; "
        "its output line is left empty",
        "warning: line 34 has 8 tokens; with EOS that exceeds the model's max_len=6, so at most 5 tokens fit; "
        "its output line is left empty",
        "warning: 2 of 40 input line(s) left empty; the warnings above name each and why",
    ]


def test_an_over_long_argument_gives_an_empty_line_and_a_warning(run):
    proc = cli("generate", "--checkpoint", str(run), TOO_LONG)
    assert proc.returncode == 0 and proc.stdout == "\n"
    assert "warning: the input has 6 tokens" in proc.stderr and "at most 5 tokens fit" in proc.stderr


def test_a_bad_token_is_named_by_its_real_line_number(run):
    proc = cli("generate", "--checkpoint", str(run), stdin="1\n\n\nx\n")
    assert proc.returncode == 2
    assert "input 4: token 'x' is not an integer" in proc.stderr and proc.stdout == ""


def test_a_bom_and_crlf_line_ends_are_read_as_training_files_are(run, alone):
    # As iter_tsv: the BOM is skipped, \r\n and a lone \r end a line. Before, the BOM stuck
    # to the first token ("token '\ufeff5' is not an integer").
    stdin = "\ufeff5 3 6 2\r\n1\r\n\r\n0 0 4\r2 2\n".encode()
    proc = cli("generate", "--checkpoint", str(run), stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n") == [alone["5 3 6 2"], alone["1"], "", alone["0 0 4"], alone["2 2"], ""]


def test_invalid_utf8_is_named_by_line(run):
    proc = cli("generate", "--checkpoint", str(run), stdin=b"1\n\n2 \xff\n")
    assert proc.returncode == 2
    assert "standard input:3: not valid UTF-8" in proc.stderr and "Traceback" not in proc.stderr


def test_leading_blank_lines_beyond_a_chunk_keep_their_output_lines(run):
    # One chunk is CHUNK_BATCHES lines at batch size 1: the blank lines before the first text
    # fill more than one; they are held as a count and come out before it.
    blanks = generation.CHUNK_BATCHES + 3
    outputs = list(generation.generate(run, [""] * blanks + ["1", " "], batch_size=1))
    assert [o.text for o in outputs[:blanks]] == [""] * blanks
    assert len(outputs) == blanks + 2 and outputs[-1].text == "" and outputs[-2].left_empty is None


def test_input_without_any_text_is_refused_before_any_output(run):
    produced = []
    with pytest.raises(ValueError, match=r"empty input.*\(40 blank lines and no text\)"):
        for out in generation.generate(run, [""] * 40, batch_size=1):
            produced.append(out)
    assert produced == []


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("generate_text")
    corpus = write_corpus(d / "train.tsv", 40), write_corpus(d / "valid.tsv", 5)
    proc = cli(*text_args(corpus, d / "run", "--max-len", "6", "--steps", "2"))
    assert proc.returncode == 0, proc.stderr
    return d / "run"


def test_text_run_notes_name_real_line_numbers_and_the_bom_is_no_word(text_run):
    stdin = "\ufeffzzzq cat\n\n   \nthe cat the cat the cat the\nred qqq\n".encode()
    proc = cli("generate", "--checkpoint", str(text_run), stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    outputs = proc.stdout.split("\n")
    assert len(outputs) == 6 and outputs[1:4] == ["", "", ""] and outputs[-1] == ""
    assert [e for e in proc.stderr.splitlines() if e.startswith(("note:", "warning:"))] == [
        "note: line 1: 1 unknown word(s) mapped to <unk>: zzzq",
        "warning: line 4 has 7 tokens; with EOS that exceeds the model's max_len=6, so at most 5 tokens fit; "
        "its output line is left empty",
        "note: line 5: 1 unknown word(s) mapped to <unk>: qqq",
        "warning: 1 of 5 input line(s) left empty; the warnings above name each and why",
    ]
