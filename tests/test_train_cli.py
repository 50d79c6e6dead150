"""`flaxformer-mini train` and `evaluate` as a user runs them: real processes, real signals."""

import json
import re
import signal

import numpy as np
import pytest

from flaxformer_mini.runs.directory import RunDir
from flaxformer_mini.runs.run import Run
from helpers import (
    PLOTTED_TINY_RUN,
    TINY_RUN,
    TINY_RUN_INPUTS,
    assert_exported_state_dict_computes_the_runs_logits,
    assert_same_training_state,
    cli,
    latest_state,
    run_process,
    saved_step_in,
    start,
    wait_for_checkpoint,
)
from simulated_devices import worker_env

# The uninterrupted reference run: long enough that the stop story below lands three
# signals mid-run (a tiny step takes milliseconds; each signal follows a checkpoint within one
# 50 ms poll, 10 steps before the next checkpoint at the earliest).
STRAIGHT_STEPS, SAVE_EVERY = 80, 10
STRAIGHT = ["train", *PLOTTED_TINY_RUN, "--steps", str(STRAIGHT_STEPS), "--save-every", str(SAVE_EVERY)]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    # In this process: the story below resumes its last part here too, with the same compiled
    # steps, and the runs it stops are real processes.
    # Saved at its end only: it is compared where it ends, and the stopped runs, which resume
    # from their checkpoints, save every SAVE_EVERY steps (the last --save-every wins).
    out = tmp_path_factory.mktemp("straight") / "run"
    proc = cli(*STRAIGHT, "--save-every", str(STRAIGHT_STEPS), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_train_prints_final_metrics_and_writes_the_run(straight_run):
    out, proc = straight_run
    final = json.loads(proc.stdout.strip().splitlines()[-1])
    assert final["step"] == STRAIGHT_STEPS and set(final) >= {"loss", "token_accuracy", "exact_match"}
    assert (out / "loss.png").exists() and (out / "config.json").exists()
    assert "parameters" in proc.stderr


def saved_step(proc):
    """The step a run stopped by a signal saved: exit code 130 and the step it names."""
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.rstrip().endswith("; run the same command to resume"), err[-2000:]  # its last word, said once
    return saved_step_in(err)


def test_ctrl_c_sigterm_and_kill_9_each_resume_to_the_uninterrupted_run_bit_for_bit(straight_run, tmp_path):
    # One run stopped every way a run is stopped, each time resumed with the same command.
    out = tmp_path / "run"
    command = [*STRAIGHT, "--out", str(out)]
    # 1. Ctrl-C: saves the step it is at (not only the last periodic save) and exits 130.
    proc = start(*command)
    wait_for_checkpoint(out, SAVE_EVERY, proc)
    proc.send_signal(signal.SIGINT)
    first = saved_step(proc)
    assert latest_state(out)[0] == first
    # 2. Resumed; SIGTERM, what a scheduler sends before it takes the machine back: the same.
    proc = start(*command)
    wait_for_checkpoint(out, first + SAVE_EVERY, proc)
    proc.send_signal(signal.SIGTERM)
    second = saved_step(proc)
    assert latest_state(out)[0] == second > first
    # 3. Resumed under --keep-freed-memory (the allocator setting must change nothing but
    #    speed); kill -9: no chance to clean up or save.
    proc = start(*command, "--keep-freed-memory")
    wait_for_checkpoint(out, second + SAVE_EVERY, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = latest_state(out)[0]
    assert second < killed_at < STRAIGHT_STEPS
    # The saved step's metrics reach the log before its checkpoint: none is lost for good.
    assert killed_at in [r["step"] for r in RunDir(out).read_metrics() if "loss" in r]
    # 4. Resumed to the end (in this process): every bit of the uninterrupted run's state.
    resumed = cli(*command)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {out} from step {killed_at}" in resumed.stderr
    (s1, a), (s2, b) = latest_state(straight_run[0]), latest_state(out)
    assert s1 == s2 == STRAIGHT_STEPS
    assert_same_training_state(a, b)


def test_train_asked_for_fewer_steps_than_the_run_has_evaluates_and_prints_the_runs_step(straight_run):
    out, _ = straight_run
    proc = cli(*STRAIGHT, "--steps", "30", "--out", str(out))  # the last --steps wins
    assert proc.returncode == 0, proc.stderr
    assert f"has already reached step {STRAIGHT_STEPS} (asked for 30); evaluating" in proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == STRAIGHT_STEPS


def test_evaluate_json_prints_the_three_metrics(straight_run):
    proc = cli("evaluate", "--checkpoint", str(straight_run[0]), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) >= {"loss", "token_accuracy", "exact_match"}  # and the text metrics (test_real_corpora)
    assert 0.0 <= result["exact_match"] <= 1.0 and result["loss"] > 0


def test_text_run_builds_its_vocabulary_and_trains(tmp_path):
    train = tmp_path / "train.tsv"
    pairs = [("a b c", "x y z"), ("b c", "y z"), ("c a", "z x"), ("a", "x")] * 4
    train.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    out = tmp_path / "mt"
    # One layer on each side, as TINY_RUN (which says why): the model of the other text runs of a b c -> x y z.
    proc = cli("train", "--data", str(train), "--out", str(out), "--preset", "tiny", "--layers", "1", "--steps", "6",
               "--batch-size", "4", "--max-len", "8", "--eval-every", "6", "--save-every", "6", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    vocab = json.loads((out / "vocab_source.json").read_text())["tokens"]
    assert vocab[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"] and set(vocab[4:]) == {"a", "b", "c"}
    assert RunDir(out).load_config().model.source_vocab_size == 7
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # a text run's plot: its text-metric panel too
    gen = cli("generate", "--checkpoint", str(out), "a zebra c")
    assert gen.returncode == 0, gen.stderr
    assert "1 unknown word(s) mapped to <unk>: zebra" in gen.stderr
    assert set(gen.stdout.split()) <= {"x", "y", "z", "<unk>"}


def test_columns_train_the_other_direction_of_a_three_column_file_and_evaluate_reads_it_so(tmp_path):
    # A Tatoeba-like file: source words, target words, an attribution column ignored.
    pairs = [("a b c", "x y z"), ("b c", "y z"), ("c a", "z x"), ("a", "x")] * 4
    train = tmp_path / "train.tsv"
    train.write_text("".join(f"{s}\t{t}\tCC-BY #{i}\n" for i, (s, t) in enumerate(pairs)))
    out = tmp_path / "mt"
    proc = cli("train", "--data", str(train), "--columns", "2,1", "--out", str(out), "--preset", "tiny", "--layers", "1",
               "--steps", "2", "--batch-size", "4", "--max-len", "8", "--eval-every", "2", "--save-every", "2",
               "--no-progress", "--no-plot")
    assert proc.returncode == 0, proc.stderr
    tokens = lambda side: set(json.loads((out / f"vocab_{side}.json").read_text())["tokens"][4:])  # noqa: E731
    assert tokens("source") == {"x", "y", "z"} and tokens("target") == {"a", "b", "c"}
    assert json.loads((out / "config.json").read_text())["data"]["columns"] == [2, 1]
    # evaluate --data reads a file with the run's columns; a two-column file, given its own.
    swapped = tmp_path / "swapped.tsv"
    swapped.write_text("".join(f"{t}\t{s}\n" for s, t in pairs))
    # --batch-size 1: the shapes of the held-out pair the text runs here evaluate while training,
    # so both scorings reuse that compiled evaluation and decoding (the scores do not depend on it).
    scores = [cli("evaluate", "--checkpoint", str(out), "--data", str(f), *extra, "--batch-size", "1", "--json")
              for f, extra in ((train, ()), (swapped, ("--columns", "1,2")))]
    assert [p.returncode for p in scores] == [0, 0], scores[0].stderr + scores[1].stderr
    assert json.loads(scores[0].stdout) == json.loads(scores[1].stdout)


@pytest.mark.parametrize("content, message", [
    ("a b\tx y\nno tab here\n", r"train.tsv:2"),
    ("", r"train.tsv"),
])
def test_bad_tsv_names_the_file_and_line(tmp_path, content, message):
    train = tmp_path / "train.tsv"
    train.write_text(content)
    proc = cli("train", "--data", str(train), "--out", str(tmp_path / "out"), "--preset", "tiny", "--steps", "2")
    assert proc.returncode == 2
    assert "error" in proc.stderr and re.search(message, proc.stderr), proc.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_out_holding_another_runs_config_is_refused_and_no_checkpoint_is_overwritten(straight_run):
    out = straight_run[0]
    before = {p: p.stat().st_mtime_ns for p in (out / "checkpoints").rglob("*") if p.is_file()}
    proc = cli("train", *TINY_RUN, "--steps", "80", "--seed", "1", "--out", str(out))
    assert proc.returncode == 2
    assert "train.seed (--seed): 0 in the run, 1 now" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / "checkpoints").rglob("*") if p.is_file()} == before


def test_unusable_options_exit_2():
    proc = cli("train", "--task", "reverse", "--out", "x", "--batch-size", "0")
    assert proc.returncode == 2 and "--batch-size" in proc.stderr
    proc = cli("train", "--task", "reverse", "--data", "t.tsv", "--out", "x")
    assert proc.returncode == 2 and "not allowed with" in proc.stderr


def test_batch_size_not_divisible_by_the_device_count_is_refused_before_anything_is_written(tmp_path):
    env = worker_env(8)
    out = tmp_path / "run"
    proc = run_process("train", *TINY_RUN, "--devices", "8", "--batch-size", "30", "--out", str(out), env=env)
    assert proc.returncode == 2
    assert "--batch-size 30 is not divisible by 8 devices" in proc.stderr
    assert not out.exists()


def test_more_devices_than_the_machine_has_is_refused(tmp_path):
    proc = cli("train", *TINY_RUN, "--devices", "3", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "asked for 3 devices" in proc.stderr


def library_greedy(out, texts):
    """What the library's cached greedy decoder gives for each of ``texts`` decoded alone, rendered
    as generate does. Each source is padded with PAD (masked keys) to the model's max_len, the
    width generate gives one short input: the one-input `generate` below reuses this program."""
    from flaxformer_mini.data import SyntheticTask, make_source
    from flaxformer_mini.decode.search import greedy_decode
    run = Run.open(out)
    d, max_len = run.config.data, run.config.model.max_len
    task = SyntheticTask(d.task, d.vocab_size, d.min_len, d.max_len)
    model = run.latest_state().model()
    rows = [np.asarray(greedy_decode(model, make_source([task.encode_text(t)], max_len), max_len))[0] for t in texts]
    return [task.decode_ids(row.tolist()) for row in rows]


def test_generate_prints_one_line_per_input_in_the_runs_token_format(straight_run):
    out = straight_run[0]
    # TINY_RUN_INPUTS: a batch of the held-out batch's shape, decoded by the program the run's
    # evaluation compiled. In this process: generate reading a real pipe is tests/test_generate_lines.py's.
    texts = TINY_RUN_INPUTS.splitlines()
    proc = cli("generate", "--checkpoint", str(out), stdin=TINY_RUN_INPUTS)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == library_greedy(out, texts)
    assert all(re.fullmatch(r"(\d+( \d+)*)?", line) for line in lines)
    # Words given as arguments are one input.
    args = cli("generate", "--checkpoint", str(out), *texts[0].split())
    assert args.returncode == 0 and args.stdout.splitlines() == lines[:1]


# Beam size 3 over TINY_RUN_INPUTS (the held-out batch's rows): generate's beam search below and
# evaluate's share one compiled program.
BEAM_SIZE = "3"


def test_generate_beam_and_sampling_run(straight_run):
    out = str(straight_run[0])
    beam = cli("generate", "--checkpoint", out, "--beam-size", BEAM_SIZE, stdin=TINY_RUN_INPUTS)
    sampled = [cli("generate", "--checkpoint", out, "--temperature", "1.5", "--top-k", "4", "--seed", "7", "4 1 2")
               for _ in range(2)]
    assert beam.returncode == 0 and len(beam.stdout.splitlines()) == 8, beam.stderr
    assert sampled[0].returncode == 0 and sampled[0].stdout == sampled[1].stdout  # seeded


@pytest.mark.parametrize("args, message", [
    (["--max-new-tokens", "99", "1 2"], "--max-new-tokens=99 exceeds max_len=6"),
    (["--beam-size", "0", "1 2"], "--beam-size must be >= 1"),
    (["x"], "token 'x' is not an integer"),
    (["--beam-size", "2", "--temperature", "0.5", "1"], "exclude each other"),
])
def test_generate_bad_input_names_the_limit(straight_run, args, message):
    proc = cli("generate", "--checkpoint", str(straight_run[0]), *args)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr


def test_generate_with_empty_input_is_refused(straight_run):
    proc = cli("generate", "--checkpoint", str(straight_run[0]), stdin="\n\n")
    assert proc.returncode == 2 and "empty input" in proc.stderr


def test_evaluate_with_beam_size_reports_the_best_beams_exact_match(straight_run):
    from flaxformer_mini.data import EOS
    from flaxformer_mini.decode import search

    proc = cli("evaluate", "--checkpoint", str(straight_run[0]), "--beam-size", BEAM_SIZE, "--json")
    assert proc.returncode == 0, proc.stderr
    # Recounted here: each held-out row's best beam, up to its EOS, against the row's target.
    run = Run.open(straight_run[0])
    model = run.trainer.model(run.latest_state().for_inference())

    def upto_eos(row):
        row = [int(t) for t in row]
        return row[: row.index(EOS) + 1] if EOS in row else row

    hits = []
    for batch in run.eval_batches():
        tokens, _ = search.beam_search(model, batch.source, run.config.model.max_len, beam_size=int(BEAM_SIZE))
        hits += [upto_eos(h) == upto_eos(t) for h, t in zip(np.asarray(tokens[:, 0]), np.asarray(batch.target_out),
                                                            strict=True)]
    assert len(hits) == run.config.data.eval_sequences
    assert json.loads(proc.stdout)["exact_match"] == sum(hits) / len(hits)


# --- a run's weights for PyTorch: `parity convert RUN OUT.pt` ---------------------------------


def test_parity_convert_of_a_run_exports_its_newest_checkpoint_for_torch_ref(straight_run, tmp_path, capsys):
    out, _ = straight_run
    assert assert_exported_state_dict_computes_the_runs_logits(out, tmp_path) == STRAIGHT_STEPS
    assert f"(training run, its newest checkpoint: step {STRAIGHT_STEPS})" in capsys.readouterr().out


def test_parity_convert_of_a_run_refuses_one_without_a_checkpoint_and_a_flax_format_out(straight_run, tmp_path,
                                                                                         capsys):
    from parity.cli import main as parity_main

    fresh = tmp_path / "fresh"  # a run that stopped before its first save: its config alone
    fresh.mkdir()
    (fresh / "config.json").write_bytes((straight_run[0] / "config.json").read_bytes())
    assert parity_main(["convert", str(fresh), str(tmp_path / "model.pt")]) == 2
    assert f"{fresh}: the run has no checkpoint yet" in capsys.readouterr().err
    assert parity_main(["convert", str(straight_run[0]), str(tmp_path / "flax_dir")]) == 2
    assert "a training run converts to a torch state dict" in capsys.readouterr().err
    assert parity_main(["convert", str(straight_run[0]), str(tmp_path / "model.pt"), "--heads", "5"]) == 2
    assert "--heads applies to a torch IN only" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh"]  # nothing written


@pytest.mark.parametrize("inside", ["one checkpoint", "the checkpoints directory"])
def test_parity_convert_of_a_runs_checkpoint_directory_names_the_run_directory_to_give(straight_run, tmp_path, capsys,
                                                                                     inside):
    from parity.cli import main as parity_main

    run = straight_run[0]
    given = next((run / "checkpoints").iterdir()) if inside == "one checkpoint" else run / "checkpoints"
    assert given.is_dir()
    assert parity_main(["convert", str(given), str(tmp_path / "model.pt")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"parity convert: error: {given}: this is {inside} of a training run; "
                           f"give the run directory ({run}) to export its newest checkpoint")
    assert not (tmp_path / "model.pt").exists()


def test_a_checkpoint_step_that_does_not_exist_is_named_missing_not_called_a_checkpoint(straight_run, tmp_path,
                                                                                       capsys):
    from parity.cli import main as parity_main

    missing = straight_run[0] / "checkpoints" / "999"
    assert parity_main(["convert", str(missing), str(tmp_path / "model.pt")]) == 2
    assert capsys.readouterr().err.strip() == f"parity convert: error: {missing}: no such file or directory"
    proc = cli("generate", "--checkpoint", str(missing), "1")
    assert proc.returncode == 2 and f"{missing}: no such directory" in proc.stderr, proc.stderr
