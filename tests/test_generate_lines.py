"""`flaxformer-mini generate` reading standard input: output line i is always input line i's.

Blank lines give empty output lines, a line longer than the model takes gives an empty output
line and a warning naming it (the other lines are still decoded, exit code 0), and the input
is read as the training files are: a UTF-8 BOM skipped, \\r\\n and a lone \\r ending lines.
"""

import io
import json
import os
import subprocess
import threading

import numpy as np
import pytest

from flaxformer_mini.cli.arriving_lines import ArrivingLines
from flaxformer_mini.decode import search as decoding
from flaxformer_mini.decode import generation
from flaxformer_mini.runs.generate import generate
from flaxformer_mini.runs.run import Run
from helpers import CLI, Lines, cli, command_precision

# TINY_RUN's model: max_len 6, so at most 5 tokens and EOS; token values 0..6.
LONGEST_FITTING = 5
FITTING = ["5 3 6 2", "1", "0 0 4", "6 5 4 3 2", "2 2"]
TOO_LONG = "1 2 3 4 5 6"  # 6 tokens


@pytest.fixture(scope="module")
def run(trained_run):
    # Trained until no FITTING input decodes to an empty line, which would look left empty
    # (helpers.SHARED_RUNS; tests/test_exported_run_in_torch.py decodes the same run).
    return trained_run("copy_60_steps") / "run"


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


def test_evaluate_data_on_a_synthetic_run_scores_the_files_pairs_as_generate_decodes_them(run, alone, tmp_path):
    # Targets: each input's own greedy output, then one that is not: exact match 3 of 4.
    pairs = [(text, alone[text]) for text in FITTING[:3]] + [(FITTING[3], "1 1")]
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    proc = cli("evaluate", "--checkpoint", str(run), "--data", str(data), "--json")
    assert proc.returncode == 0, proc.stderr
    assert alone[FITTING[3]] != "1 1"
    assert json.loads(proc.stdout)["exact_match"] == 3 / 4


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
    # As iter_tsv: the BOM is skipped, \r\n and a lone \r end a line. Unskipped, the BOM would
    # stick to the first token ("token '\ufeff5' is not an integer").
    stdin = "\ufeff5 3 6 2\r\n1\r\n\r\n0 0 4\r2 2\n".encode()
    # --batch-size 2: the shape of mixed's batches, so their compiled decoder decodes these too.
    proc = cli("generate", "--checkpoint", str(run), "--batch-size", "2", stdin=stdin)
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
    outputs = list(generate(run, [""] * blanks + ["1", " "], batch_size=1))
    assert [o.text for o in outputs[:blanks]] == [""] * blanks
    assert len(outputs) == blanks + 2 and outputs[-1].text == "" and outputs[-2].left_empty is None


def test_input_without_any_text_is_refused_before_any_output(run):
    produced = []
    with pytest.raises(ValueError, match=r"empty input.*\(40 blank lines and no text\)"):
        for out in generate(run, [""] * 40, batch_size=1):
            produced.append(out)
    assert produced == []


def test_a_closed_standard_input_is_refused_as_an_empty_input(run, monkeypatch, capsys):
    # `generate <&-`: Python starts with sys.stdin None, no stream and no descriptor to read.
    from flaxformer_mini.cli.main import main

    monkeypatch.setattr("sys.stdin", None)
    assert main(["generate", "--checkpoint", str(run)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("flaxformer-mini generate: error: empty input: give the texts as arguments or one per "
                            "line on standard input\n")


def test_a_reader_that_closes_its_end_early_stops_generate_quietly_with_141(run, monkeypatch, capsys):
    # `generate ... | head -1`: the pipe's reader is gone, so writing an output fails (EPIPE).
    from flaxformer_mini.cli.main import main

    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as closed_pipe:
        monkeypatch.setattr("sys.stdout", closed_pipe)
        with command_precision():
            code = main(["generate", "--checkpoint", str(run), FITTING[0]])
        assert code == 141  # 128 + SIGPIPE, as a shell reports a tool stopped so
        closed_pipe.write("x\n")
        closed_pipe.flush()  # stdout now writes to devnull: the flush at exit fails no more
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("texts", ["5 3 9", b"5 3 9"])
def test_one_text_instead_of_an_iterable_of_texts_is_refused_at_the_call(run, texts):
    with pytest.raises(TypeError, match=rf"texts: expected an iterable of texts, one per input, got one "
                                        rf"{type(texts).__name__} \(give \[text\] for a single input\)"):
        generate(run, texts)


@pytest.fixture(scope="module")
def text_run(trained_run):
    # A word run of two steps at --max-len 6 (helpers.SHARED_RUNS; tests/test_exported_run_in_torch.py
    # exports the same run). Two held-out pairs: where this process trained it, the run's evaluation
    # decoded the shape of the test's two decoded lines (one compiled decoder).
    return trained_run("word_2_steps") / "run"


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
        # Two steps of training end no output: each is cut at the limit, the default one here.
        "warning: 2 of 5 output(s) reached the model's max_len (the default --max-new-tokens) before their EOS "
        "and are cut there",
    ]


# --- beam search options: --length-penalty, --nbest, --scores ----------------------------


def library_beams(run_dir, text, beam_size, alpha):
    """[(score, text)] of ``decoding.beam_search`` on the source generate builds for ``text``
    decoded alone (--batch-size 1), best first: the numbers the CLI must print."""
    r = Run.open(run_dir)
    ids, _ = r.codec.encode(text)
    max_len = r.config.model.max_len
    source = generation._source([ids], 1, max_len)
    tokens, scores = decoding.beam_search(r.latest_state().model(), source, max_len, beam_size=beam_size, alpha=alpha)
    return [(np.float32(s), r.codec.decode(row)) for row, s in zip(np.asarray(tokens)[0].tolist(), np.asarray(scores)[0])]


def scored_lines(proc):
    assert proc.returncode == 0, proc.stderr
    return [(np.float32(score), text) for score, text in (line.split("\t") for line in proc.stdout.splitlines())]


@pytest.mark.parametrize("alpha", [None, 0.0, 2.0])
def test_nbest_prints_the_beams_best_n_in_score_order_with_the_librarys_scores(run, alpha):
    given = [] if alpha is None else ["--length-penalty", str(alpha)]
    proc = cli("generate", "--checkpoint", str(run), "--batch-size", "1", "--beam-size", "4", "--nbest", "3",
               "--scores", *given, FITTING[0])
    printed = scored_lines(proc)
    # The printed score is the float32 score itself (shortest exact text), not a rounding of it.
    assert printed == library_beams(run, FITTING[0], 4, decoding.DEFAULT_LENGTH_PENALTY if alpha is None else alpha)[:3]
    assert [s for s, _ in printed] == sorted((s for s, _ in printed), reverse=True)


def test_a_score_is_the_log_probability_over_gnmts_length_penalty_counting_eos(run):
    # --length-penalty 0 prints log p itself; at 1 the same hypothesis scores log p / ((5 + length) / 6),
    # its length counting its EOS (a hypothesis cut at the model's max_len has none).
    def scores(alpha):
        proc = cli("generate", "--checkpoint", str(run), "--beam-size", "4", "--nbest", "4", "--scores",
                   "--length-penalty", str(alpha), FITTING[3])
        return {text: score for score, text in scored_lines(proc)}

    log_p, penalised = scores(0), scores(1)
    common = set(log_p) & set(penalised)
    assert common
    for text in common:
        tokens = len(text.split())
        length = tokens if tokens == run_max_len(run) else tokens + 1
        assert penalised[text] == pytest.approx(log_p[text] / ((5 + length) / 6), rel=1e-5), text


def run_max_len(run_dir):
    return Run.open(run_dir).config.model.max_len


def test_scores_alone_print_the_greedy_output_with_its_score(run, alone):
    proc = cli("generate", "--checkpoint", str(run), "--batch-size", "1", "--scores", FITTING[1])
    ((score, text),) = scored_lines(proc)
    assert text == alone[FITTING[1]]
    assert (score, text) == library_beams(run, FITTING[1], 1, decoding.DEFAULT_LENGTH_PENALTY)[0]


def test_nbest_gives_n_lines_per_input_and_n_empty_ones_for_an_input_not_decoded(run, alone):
    lines = [FITTING[0], "", TOO_LONG, FITTING[1]]
    proc = cli("generate", "--checkpoint", str(run), "--beam-size", "3", "--nbest", "2",
               stdin="".join(t + "\n" for t in lines))
    assert proc.returncode == 0, proc.stderr
    outputs = proc.stdout.split("\n")
    assert len(outputs) == 2 * len(lines) + 1 and outputs[-1] == ""
    assert outputs[2:6] == ["", "", "", ""]  # the blank line's two, the over-long line's two
    assert "warning: line 3 has 6 tokens" in proc.stderr and "its output 2 lines are left empty" in proc.stderr
    best = cli("generate", "--checkpoint", str(run), "--beam-size", "3", stdin=f"{FITTING[0]}\n{FITTING[1]}\n")
    assert [outputs[0], outputs[6]] == best.stdout.splitlines()  # the first of each input's lines is the best


def test_max_new_tokens_that_cut_outputs_are_counted_in_one_warning(run):
    proc = cli("generate", "--checkpoint", str(run), "--max-new-tokens", "1", stdin=f"{FITTING[0]}\n{FITTING[3]}\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "warning: 2 of 2 output(s) reached --max-new-tokens 1 before their EOS and are cut there"]


@pytest.mark.parametrize("args, message", [
    (["--nbest", "2", "1"], "--nbest must be >= 1 and at most the beam size (--beam-size 1), got 2"),
    (["--beam-size", "2", "--nbest", "3", "1"], "--nbest must be >= 1 and at most the beam size (--beam-size 2), got 3"),
    (["--length-penalty", "1", "1"], "--length-penalty goes with --beam-size K > 1 or --nbest or --scores"),
    (["--scores", "--temperature", "1", "1"], "--nbest and --scores go with greedy decoding or --beam-size, not with"),
    (["--beam-size", "2", "--alpha", "-1", "1"], "--length-penalty must be a finite number >= 0"),
    (["--top-k", "99", "1"], "--top-k must be in [1, 11] (the target vocabulary), got 99"),
])
def test_decoding_option_errors_name_the_options_as_typed(run, args, message):
    proc = cli("generate", "--checkpoint", str(run), *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr


def test_the_clis_default_length_penalty_is_the_librarys():
    from flaxformer_mini.cli import parser

    assert parser.LENGTH_PENALTY == decoding.DEFAULT_LENGTH_PENALTY


def test_a_weights_file_or_a_checkpoint_instead_of_a_run_says_what_it_is(run, tmp_path):
    weights = tmp_path / "model.pt"
    weights.write_bytes(b"not read")
    proc = cli("generate", "--checkpoint", str(weights), "1")
    assert proc.returncode == 2
    assert f"{weights}: a weights file (torch or Flax), not a run directory" in proc.stderr
    assert "python -m parity convert" in proc.stderr
    step = next((run / "checkpoints").iterdir())
    proc = cli("evaluate", "--checkpoint", str(step))
    assert proc.returncode == 2
    assert f"{step}: this is one checkpoint of a training run; give the run directory ({run})" in proc.stderr


@pytest.fixture
def decoded_rows(monkeypatch):
    """The row count of each batch generation decodes, in order."""
    rows, decode = [], generation.decode
    monkeypatch.setattr(generation, "decode", lambda model, source, *a, **k: rows.append(len(source))
                        or decode(model, source, *a, **k))
    return rows


def test_lines_typed_one_at_a_time_are_each_answered_before_the_next_is_read(run, alone, decoded_rows):
    # An interactive caller: ready() says no further line is waiting after each one, so each is
    # decoded alone, its output yielded before the next line is asked for.
    events = []

    def typed():
        for i, text in enumerate(FITTING):
            events.append(("read", i))
            yield text

    for i, out in enumerate(generate(run, typed(), batch_size=8, ready=lambda: False)):
        events.append(("answered", i))
        assert out.text == alone[FITTING[i]]
    assert events == [(kind, i) for i in range(len(FITTING)) for kind in ("read", "answered")]
    assert decoded_rows == [1] * len(FITTING)


def test_lines_that_arrive_together_are_decoded_together_in_a_power_of_two_rows(run, alone, decoded_rows):
    # Three lines arrive, then a pause: one batch of 4 rows (padded), whatever the count, so
    # the decoder compiles for few row counts; then the last two, a batch of 2.
    read = []

    def arriving():
        for text in FITTING:
            read.append(text)
            yield text

    outputs = list(generate(run, arriving(), batch_size=8, ready=lambda: len(read) not in (3, 5)))
    assert [o.text for o in outputs] == [alone[t] for t in FITTING]
    assert decoded_rows == [4, 2]


def test_generate_answers_each_line_of_standard_input_as_it_arrives(run, alone):
    # A real pipe, written a line at a time: each answer comes while standard input is still
    # open, before the next line is sent (the reader sees the pause through select).
    proc = subprocess.Popen([*CLI, "generate", "--checkpoint", str(run)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        answers = Lines(proc.stdout, proc)
        for text in FITTING[:2]:
            proc.stdin.write(text + "\n")
            proc.stdin.flush()
            assert answers.wait_for(alone[text]) == alone[text]
        out, err = proc.communicate(timeout=60)  # closes standard input: the end of the input
        assert proc.returncode == 0 and out == "", err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_arriving_lines_are_a_binary_files_lines_and_ready_only_when_one_can_be_read():
    data = b"\xef\xbb\xbfone\r\ntwo\rthree\n\n" + b"x" * 70_000 + b"\nlast without newline"
    read, write = os.pipe()
    try:
        lines = ArrivingLines(read)
        os.write(write, b"a\nb")
        assert lines.ready()
        it = iter(lines)
        assert next(it) == b"a\n"
        assert not lines.ready()  # "b" waits for the rest of its line
        os.write(write, b"\n")
        assert lines.ready() and next(it) == b"b\n"
        assert not lines.ready()

        def send():  # more than a pipe holds and one read takes: written while it is read
            with open(write, "wb") as w:
                w.write(data)

        writer = threading.Thread(target=send)
        writer.start()
        write = None  # send() closes it
        assert list(it) == io.BytesIO(data).readlines()  # what iter_lines reads from a file
        writer.join()
        assert lines.ready()  # the end: reading does not wait
    finally:
        os.close(read)
        if write is not None:
            os.close(write)


def test_sampling_with_the_largest_seed_goes_on_past_the_first_batch(run):
    # Batch i samples with seed + i, taken modulo 2**63 (jax.random.key's limit): the second
    # batch of --seed 2**63 - 1 samples with seed 0, not an OverflowError.
    top = cli("generate", "--checkpoint", str(run), "--seed", str(2**63 - 1), "--temperature", "2", "--batch-size", "1",
              stdin="1 2\n3 4\n")
    assert top.returncode == 0 and len(top.stdout.splitlines()) == 2, top.stderr
    refused = cli("generate", "--checkpoint", str(run), "--seed", str(2**63), "--temperature", "2", "1 2")
    assert refused.returncode == 2 and "--seed must be in [0, 2**63), got 9223372036854775808" in refused.stderr
