"""`flaxformer-mini evaluate` scores what `generate` decodes: hypotheses decoded to the model's
max_len whatever the references' length or the batch size, `--data` to score a file of
pairs with one output line per input line, and `--output` that replaces no file unasked, nor
a file of the run (its config.json, its training or --valid file) even with --force, under any
name (a hard link, a symlink, a path through `..`)."""

import json
import os
import shutil
import signal
import time

import numpy as np
import pytest

from flaxformer_mini.decode.metrics import exact_match
from flaxformer_mini.data import EOS, PAD
from flaxformer_mini.decode.metrics import corpus_metrics
from flaxformer_mini.runs.run import Run
from helpers import cli, text_args, write_corpus

TEXT_METRICS = ("exact_match", "bleu", "chrf", "wer", "cer")
SHORT_REFERENCE = ("the cat", "a")  # one character: its labels (a, EOS) pad to 8 positions
OVER_LONG = ("big sun " * 4, "x")  # 32 characters: over the run's --max-len 24


@pytest.fixture(scope="module")
def char_run(trained_run):
    """A briefly trained character-level run: its hypotheses run long (few EOS learnt yet),
    which is what truncation at the references' length would hide (helpers.SHARED_RUNS;
    tests/test_exported_run_in_torch.py exports the same run). Read only: copied where changed."""
    d = trained_run("char_4_steps")
    return d / "run", (d / "train.tsv", d / "valid.tsv")


@pytest.fixture(scope="module")
def test_file(char_run, tmp_path_factory):
    """Pairs the run never evaluated on: the first valid pairs, a pair whose reference is one
    character, and one too long for the run (line 5)."""
    _, (_, valid) = char_run
    pairs = [tuple(line.split("\t")) for line in valid.read_text().splitlines()[:3]]
    pairs = pairs + [SHORT_REFERENCE, OVER_LONG] + pairs[:2]
    path = tmp_path_factory.mktemp("test_data") / "test.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    return path, pairs


def evaluate(out, *args):
    proc = cli("evaluate", "--checkpoint", str(out), "--json", *map(str, args))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def generated(out, sources):
    proc = cli("generate", "--checkpoint", str(out), stdin="".join(s + "\n" for s in sources))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def kept_indices(pairs):
    """The indices of the pairs the run can take: all but OVER_LONG."""
    return [i for i, pair in enumerate(pairs) if pair != OVER_LONG]


@pytest.fixture(scope="module")
def evaluated(char_run, test_file, tmp_path_factory):
    """`evaluate --data test.tsv --output hyp.txt` at the run's batch size (64: one batch of the
    6 pairs it takes, as any batch size of 6 or more makes): (its JSON, its stderr, hyp.txt).
    One command for the tests that read it; none writes to it."""
    out, _ = char_run
    path, _ = test_file
    hypotheses = tmp_path_factory.mktemp("evaluated") / "hyp.txt"
    result, stderr = evaluate(out, "--data", path, "--output", hypotheses)
    return result, stderr, hypotheses


@pytest.fixture(scope="module")
def generated_kept(char_run, test_file):
    """`generate`'s lines for the sources of test.tsv's pairs the run can take, in order."""
    out, _ = char_run
    _, pairs = test_file
    return generated(out, [pairs[i][0] for i in kept_indices(pairs)])


def test_evaluate_hypotheses_and_metrics_do_not_depend_on_the_batch_size_and_equal_generates(
        char_run, test_file, evaluated, generated_kept, tmp_path):
    # Batch size 1 (six batches of a row) against the run's 64 (one batch of the six pairs the
    # run takes; 7 made the same single batch).
    out, _ = char_run
    path, pairs = test_file
    hypotheses = tmp_path / "hyp1.txt"
    results = [evaluate(out, "--data", path, "--batch-size", 1, "--output", hypotheses)[0], evaluated[0]]
    outputs = [hypotheses.read_text().splitlines(), evaluated[2].read_text().splitlines()]
    assert outputs[1] == outputs[0]
    for result in results[1:]:
        assert {k: result[k] for k in TEXT_METRICS} == {k: results[0][k] for k in TEXT_METRICS}
        # The same examples; their float32 losses summed in other batches (~1e-7 relative apart).
        assert result["loss"] == pytest.approx(results[0]["loss"], rel=1e-5)
    assert [outputs[0][i] for i in kept_indices(pairs)] == generated_kept


def test_a_hypothesis_longer_than_its_reference_is_scored_at_its_full_length(char_run, test_file, evaluated,
                                                                              generated_kept):
    out, _ = char_run
    path, pairs = test_file
    kept = kept_indices(pairs)
    full = generated_kept[kept.index(pairs.index(SHORT_REFERENCE))]  # generate's line for SHORT_REFERENCE's source
    # The reference's labels (a, EOS) padded to 8: a cut there would leave at most 8 characters.
    assert len(full) > 8, f"the run's hypothesis {full!r} is too short for this test"
    result, _, hypotheses = evaluated
    lines = hypotheses.read_text().splitlines()
    assert lines[pairs.index(SHORT_REFERENCE)] == full
    run = Run.open(out)
    target = run.dir.load_vocabularies(run.config.data)[1]
    expected = corpus_metrics([lines[i] for i in kept], [run.codec.decode(target.encode(pairs[i][1])) for i in kept])
    for key in ("bleu", "chrf", "wer", "cer"):
        assert result[key] == pytest.approx(expected[key], abs=1e-9)


def test_evaluate_output_has_one_line_per_data_line_and_an_empty_one_for_an_over_long_pair(test_file, evaluated):
    path, pairs = test_file
    _, stderr, hypotheses = evaluated
    lines = hypotheses.read_text().split("\n")
    assert lines[-1] == "" and len(lines[:-1]) == len(pairs) == 7  # one line per pair, each ended by \n
    assert lines[pairs.index(OVER_LONG)] == ""
    assert (f"note: 1 of 7 pairs in {path} are longer than the run's --max-len 24 allows and are not evaluated; "
            f"{hypotheses} holds an empty line for each, so its lines match {path}'s") in stderr


def test_evaluate_output_lines_up_with_a_data_file_that_has_blank_lines(char_run, test_file, generated_kept,
                                                                       tmp_path):
    # paste test.tsv hyp.txt: blank lines (at the start, in the middle, whitespace only, at the
    # end) keep their places as empty lines, as generate keeps a blank input line's place.
    out, _ = char_run
    _, pairs = test_file
    lines = ["", *(f"{s}\t{t}" for s, t in pairs[:3]), "  ", *(f"{s}\t{t}" for s, t in pairs[3:]), "", ""]
    path = tmp_path / "blanks.tsv"
    path.write_bytes("\r\n".join(lines).encode() + b"\r\n")
    hypotheses = tmp_path / "hyp.txt"
    evaluate(out, "--data", path, "--output", hypotheses)
    written = hypotheses.read_text().split("\n")
    assert written[-1] == "" and len(written[:-1]) == len(lines) == 11
    decoded = iter(generated_kept)  # the lines of [s for s, _ in pairs if (s, _) != OVER_LONG]
    expected = ["" if not line.strip() or tuple(line.split("\t")) == OVER_LONG else next(decoded) for line in lines]
    assert written[:-1] == expected


def test_evaluate_data_read_from_a_pipe_counts_its_lines_in_the_one_pass_it_gets(char_run, test_file):
    # `--data <(...)` is a pipe's /dev/fd/N: a second open of it reads nothing (the writer is
    # done), so the lines are counted as the pairs are read, in the one pass there is.
    import os

    from flaxformer_mini.runs.evaluate import read_pairs

    out, _ = char_run
    _, pairs = test_file
    text = "\n" + "".join(f"{s}\t{t}\n\n" for s, t in pairs[:3]) + "\n"
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, text.encode())  # well under a pipe's buffer: no writer thread needed
        os.close(write_end)
        held_out, file_lines = read_pairs(Run.open(out), f"/proc/self/fd/{read_end}")
    finally:
        os.close(read_end)
    assert (len(held_out), held_out.line_numbers, file_lines) == (3, [2, 4, 6], 8)


def test_evaluate_data_scores_that_file_even_when_the_runs_data_files_moved(char_run, tmp_path):
    out, (train, valid) = char_run
    # The run's own held-out file through --data: the same pairs, the same scores.
    held_out, _ = evaluate(out)
    assert evaluate(out, "--data", valid)[0] == held_out
    # A copy of the run whose training and validation files are gone: only --data can be scored.
    moved = tmp_path / "run"
    shutil.copytree(out, moved)
    config = json.loads((moved / "config.json").read_text())
    config["data"].update(train_path=str(tmp_path / "gone_train.tsv"), valid_path=str(tmp_path / "gone_valid.tsv"))
    (moved / "config.json").write_text(json.dumps(config))
    refused = cli("evaluate", "--checkpoint", str(moved))
    assert refused.returncode == 2 and "gone_valid.tsv" in refused.stderr
    other = tmp_path / "other.tsv"
    shutil.copy(valid, other)
    assert evaluate(moved, "--data", other)[0] == held_out


def test_evaluate_output_onto_an_existing_file_is_refused_unless_force(char_run, tmp_path):
    out, (train, _) = char_run
    hypotheses = tmp_path / "hyp.txt"
    hypotheses.write_text("my notes\n")
    refused = cli("evaluate", "--checkpoint", str(out), "--output", str(hypotheses))
    assert refused.returncode == 2
    assert f"--output {hypotheses}: already exists (a file); nothing was written" in refused.stderr
    assert hypotheses.read_text() == "my notes\n"
    forced = cli("evaluate", "--checkpoint", str(out), "--output", str(hypotheses), "--force")
    assert forced.returncode == 0, forced.stderr
    assert len(hypotheses.read_text().splitlines()) == 7  # the 7 held-out pairs' hypotheses


def _copy_of_run_reading(out, tmp_path, key, source):
    """A copy of the run ``out`` whose ``data.<key>`` is a copy of ``source`` in ``tmp_path``."""
    run, mine = tmp_path / "run", tmp_path / source.name
    shutil.copytree(out, run)
    shutil.copy(source, mine)
    config = json.loads((run / "config.json").read_text())
    config["data"][key] = str(mine)  # the data files' paths are outside config.json's checksum
    (run / "config.json").write_text(json.dumps(config))
    return run, mine


def test_evaluate_refuses_its_valid_file_changed_or_gone_and_an_output_onto_it_even_with_force(char_run, tmp_path):
    out, (_, valid) = char_run
    run, mine = _copy_of_run_reading(out, tmp_path, "valid_path", valid)
    assert evaluate(run)[0] == evaluate(out)[0]  # the same contents: the same pairs and scores
    forced = cli("evaluate", "--checkpoint", str(run), "--output", str(mine), "--force")
    assert forced.returncode == 2 and (f"--output {mine}: is the run's --valid file (data.valid_path in "
                                       f"{run}/config.json), which --force would overwrite too") in forced.stderr
    assert mine.read_text() == valid.read_text()
    # Any file of the run, under any name (RunDir.own_file): a hard link to its config.json, a
    # path through `..` to its --valid file.
    os.link(run / "config.json", tmp_path / "hard.txt")
    for output, what in [(tmp_path / "hard.txt", "config.json"),
                         (run / ".." / mine.name, f"--valid file (data.valid_path in {run}/config.json)")]:
        forced = cli("evaluate", "--checkpoint", str(run), "--output", str(output), "--force")
        assert forced.returncode == 2 and (f"--output {output}: is the run's {what}, which --force would overwrite "
                                           f"too") in forced.stderr, forced.stderr
    assert mine.read_text() == valid.read_text()
    with mine.open("a") as f:
        f.write("sun cat\tcat sun\n")  # one pair more: other held-out pairs under the run's name
    changed = cli("evaluate", "--checkpoint", str(run))
    assert changed.returncode == 2 and f"{mine}: the run's --valid file has changed since the run in {run} started " \
                                      f"(sha256 " in changed.stderr, changed.stderr
    assert "restore it, or score a file of pairs with `evaluate --data FILE`" in changed.stderr
    mine.unlink()
    gone = cli("evaluate", "--checkpoint", str(run))
    assert gone.returncode == 2 and (f"{mine}: the run's --valid file, recorded in {run}/config.json "
                                     f"(data.valid_path), is not there: restore it") in gone.stderr


def test_a_run_without_valid_refuses_its_training_file_changed_since_and_an_output_onto_it(tmp_path, monkeypatch):
    # Its held-out pairs are drawn from the training file's lines: another file draws others,
    # some of them trained on, which evaluate would score silently (and --output overwrite it).
    # Both refusals come before evaluate reads a checkpoint: the run is started, not trained.
    monkeypatch.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)
    train = write_corpus(tmp_path / "train.tsv", 60)
    args = text_args((train, None), tmp_path / "run", "--steps", "2")
    del args[args.index("--valid"):args.index("--valid") + 2]
    assert cli(*args).returncode == 0
    before = train.read_text()
    forced = cli("evaluate", "--checkpoint", str(tmp_path / "run"), "--output", str(train), "--force")
    assert forced.returncode == 2 and "is the run's training file (data.train_path" in forced.stderr
    assert train.read_text() == before
    train.write_text("".join(reversed(before.splitlines(keepends=True))))  # shuffled: the same pairs, other lines
    changed = cli("evaluate", "--checkpoint", str(tmp_path / "run"))
    assert changed.returncode == 2 and (f"{train}: the run's training file (the pairs it evaluates on come from its "
                                        f"lines) has changed since the run in") in changed.stderr, changed.stderr


def test_exact_match_compares_a_hypothesis_decoded_past_its_reference_up_to_eos():
    # Labels padded to T = 4; hypotheses decoded to N = 6 (the model's max_len).
    target_out = np.array([[5, 6, EOS, PAD], [7, EOS, PAD, PAD], [8, EOS, PAD, PAD], [9, 9, 9, EOS]])
    predicted = np.array([[5, 6, EOS, PAD, PAD, PAD],  # equal up to EOS
                          [7, 8, 9, 10, 11, EOS],  # goes on past its reference's end
                          [8, 8, EOS, PAD, PAD, PAD],  # wrong at the reference's EOS
                          [9, 9, 9, EOS, PAD, PAD]])
    np.testing.assert_array_equal(exact_match(predicted, target_out), [True, False, False, True])
    # Labels longer than the hypotheses (a row that ran out of positions): never equal.
    np.testing.assert_array_equal(exact_match(predicted[:, :3], target_out), [True, False, False, False])


def test_write_atomic_without_replace_refuses_a_file_that_appeared_after_the_check(tmp_path):
    # evaluate checks --output before decoding and writes after: a file created in between is
    # still never replaced unasked, and no temporary file is left beside it.
    from flaxformer_mini.files import write_atomic

    path = tmp_path / "hyp.txt"
    write_atomic(path, "new\n", replace=False)
    assert path.read_text() == "new\n"
    with pytest.raises(FileExistsError, match="hyp.txt"):
        write_atomic(path, "other\n", replace=False)
    assert path.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["hyp.txt"]
    write_atomic(path, "other\n")  # --force
    assert path.read_text() == "other\n"


@pytest.mark.parametrize("replace", [True, False])
def test_write_atomic_a_ctrl_c_as_the_file_goes_into_place_comes_once_it_is_there_and_the_temporary_gone(
        tmp_path, monkeypatch, replace, ctrl_c_raises):
    # Ctrl-C just after the rename (replace) or link (not replace) into place, and again as the
    # temporary file is removed: cut between the link and that removal, the temporary stays.
    from flaxformer_mini.files import write_atomic

    path = tmp_path / "hyp.txt"
    real_replace, real_link, real_unlink, signalled = os.replace, os.link, os.unlink, []

    def signal_once(at):
        if at not in signalled:
            signalled.append(at)
            signal.raise_signal(signal.SIGINT)

    def replace_then_signal(source, destination):
        real_replace(source, destination)
        signal_once("in place")

    def link_then_signal(source, destination):
        real_link(source, destination)
        signal_once("in place")

    def unlink(target, *args, **kwargs):
        if str(target).endswith(".tmp"):
            signal_once("removing the temporary")
        real_unlink(target, *args, **kwargs)

    monkeypatch.setattr("flaxformer_mini.files.os.replace", replace_then_signal)
    monkeypatch.setattr("flaxformer_mini.files.os.link", link_then_signal)
    monkeypatch.setattr("flaxformer_mini.files.os.unlink", unlink)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, "new\n", replace=replace)
    assert signalled == ["in place", "removing the temporary"]
    assert [p.name for p in tmp_path.iterdir()] == ["hyp.txt"] and path.read_text() == "new\n"


def test_write_atomic_hands_a_signal_held_as_the_file_goes_into_place_to_a_runs_stop_handler_once(
        tmp_path, monkeypatch):
    # A run writes its files with train.stop's handler installed, whose watcher reads each
    # signal from signal's wakeup descriptor: a held Ctrl-C raised again would reach it twice, a
    # second stop request, which ends the process (REPEAT_S 0: no two signals are one here).
    from flaxformer_mini.files import write_atomic
    from flaxformer_mini.train import stop

    ended = []

    def end(code):
        ended.append(code)
        raise SystemExit(code)  # ends the watcher's thread, not the test's process

    monkeypatch.setattr(stop, "GRACE_S", 0.05)
    monkeypatch.setattr(stop, "REPEAT_S", 0.0)
    monkeypatch.setattr(stop, "exit_now", end)
    real_replace = os.replace

    def replace_then_signal(source, destination):
        real_replace(source, destination)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr("flaxformer_mini.files.os.replace", replace_then_signal)
    path = tmp_path / "metrics.jsonl"
    with stop.StopRequests(force_exit=True) as requests:
        write_atomic(path, "new\n")  # the stop handler sets a flag: nothing is raised
        assert requests.requested
        time.sleep(0.5)  # ten grace periods: a second request would have ended the process
    assert ended == []
    assert path.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_evaluate_beam_search_takes_the_length_penalty_and_decodes_as_generate(char_run, test_file, tmp_path,
                                                                               monkeypatch):
    from flaxformer_mini.decode import evaluation

    out, _ = char_run
    path, pairs = test_file
    alphas, decode = [], evaluation.decode
    monkeypatch.setattr(evaluation, "decode", lambda *a, **k: alphas.append(k["alpha"]) or decode(*a, **k))
    hypotheses = tmp_path / "hyp.txt"
    evaluate(out, "--data", path, "--beam-size", 2, "--length-penalty", 1.5, "--output", hypotheses)
    assert alphas and set(alphas) == {1.5}
    kept = [i for i, pair in enumerate(pairs) if pair != OVER_LONG]
    proc = cli("generate", "--checkpoint", str(out), "--beam-size", "2", "--length-penalty", "1.5",
               stdin="".join(pairs[i][0] + "\n" for i in kept))
    assert proc.returncode == 0, proc.stderr
    lines = hypotheses.read_text().splitlines()
    assert [lines[i] for i in kept] == proc.stdout.splitlines()


def test_a_char_run_names_unknown_characters_not_words(char_run):
    out, _ = char_run
    proc = cli("generate", "--checkpoint", str(out), "the cat \u00df")
    assert proc.returncode == 0, proc.stderr
    assert "note: the input: 1 unknown character(s) mapped to <unk>: \u00df" in proc.stderr
