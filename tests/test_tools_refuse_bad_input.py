"""The investigation tools under tools/ refuse bad options with one line before any work.

Each refusal comes before a model is built or a file written, so each case here costs a
parse: a tool's ``main([...])`` called in-process, its ``SystemExit`` caught.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from tools import xla_profile


def refusal(main, argv, capsys):
    """The one line a tool's ``main(argv)`` ends with, checked to be argparse's exit 2."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("option", ["--json", "--hlo"])
def test_xla_profile_refuses_an_output_in_a_missing_directory_before_profiling(option, tmp_path, capsys):
    path = tmp_path / "missing" / "out"
    assert refusal(xla_profile.main, [option, str(path)], capsys) == (
        f"python -m tools.xla_profile: error: {option} {path}: its directory {path.parent} does not exist")


@pytest.mark.parametrize("argv, problem", [
    (["--top", "-1"], "--top must be >= 0, got -1"),
    (["--batch", "0"], "invalid benchmark preset 'base': batch must be >= 1, got 0"),
    (["--seq-len", "0"], "invalid benchmark preset 'base': seq_len must be >= 1, got 0"),
    (["--dropout", "1.5"], "invalid ModelConfig: dropout must be in [0, 1), got 1.5"),
])
def test_xla_profile_refuses_options_that_make_no_profile(argv, problem, capsys):
    assert refusal(xla_profile.main, argv, capsys) == f"python -m tools.xla_profile: error: {problem}"


ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("setting, line", [
    ({"GPU_ITEMS": "check bogus"}, "GPU_ITEMS: unknown item bogus (known: train parity bench bench_scan "
     "bench_decode bench_compile bench_train check profile ablations ablate bfloat16 determinism)"),
    ({"GPU_ITEMS": "check", "LIMIT_CHECK": "0"}, "LIMIT_CHECK=0: must be a positive whole number of seconds"),
    ({"GPU_ITEMS": "train", "LIMIT_TRAN": "5"}, "LIMIT_TRAN: unknown limit (known: LIMIT_TRAIN LIMIT_PARITY "
     "LIMIT_BENCH LIMIT_SCAN LIMIT_DECODE LIMIT_COMPILE LIMIT_TRAIN_STEP LIMIT_CHECK LIMIT_PROFILE "
     "LIMIT_ABLATIONS LIMIT_ABLATE LIMIT_BFLOAT16 LIMIT_DETERMINISM)"),
])
def test_gpu_items_all_refuses_an_unknown_item_a_misspelt_limit_or_a_limit_that_is_no_limit_before_any_setup(setting, line, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIMIT_")}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "tools" / "gpu_items.sh"), "all"], env=dict(env, OUT=str(out), **setting),
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert not out.exists()  # nothing set up: not even the output directory


@pytest.fixture
def tsv_dir(tmp_path):
    """A --data directory with the two files the sweep reads (their content is never read here)."""
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train.tsv", "valid.tsv"):
        (data / split).write_text("a b\tb a\n")
    return data


@pytest.mark.parametrize("extra, problem", [
    (["--minutes", "0"], "--minutes must be > 0, got 0"),
    (["--eval-every", "0"], "--eval-every must be >= 1, got 0"),
    (["--beam-size", "0"], "--beam-size must be >= 1, got 0"),
])
def test_recipe_sweep_refuses_a_time_box_or_count_that_runs_nothing(extra, problem, tsv_dir, tmp_path, capsys):
    from tools import recipe_sweep

    out = tmp_path / "sweep"
    argv = ["--data", str(tsv_dir), "--out", str(out), *extra]
    assert refusal(recipe_sweep.main, argv, capsys) == f"python -m tools.recipe_sweep: error: {problem}"
    assert not out.exists()


def test_recipe_sweep_refuses_a_data_directory_without_its_validation_file(tsv_dir, tmp_path, capsys):
    from tools import recipe_sweep

    (tsv_dir / "valid.tsv").unlink()
    argv = ["--data", str(tsv_dir), "--out", str(tmp_path / "sweep")]
    assert refusal(recipe_sweep.main, argv, capsys) == (
        f"python -m tools.recipe_sweep: error: --data {tsv_dir}: valid.tsv not found there")


def test_recipe_sweep_refuses_an_out_that_is_a_file(tsv_dir, tmp_path, capsys):
    from tools import recipe_sweep

    out = tmp_path / "sweep"
    out.write_text("")
    argv = ["--data", str(tsv_dir), "--out", str(out)]
    assert refusal(recipe_sweep.main, argv, capsys) == f"python -m tools.recipe_sweep: error: --out {out}: is a file; give a directory"


@pytest.fixture
def failing_python(tmp_path, monkeypatch):
    """sys.executable replaced by a script that fails as a child command would, with its error last."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho 'starting' >&2\necho 'error: --data x.tsv: no such file' >&2\nexit 2\n")
    script.chmod(0o755)
    monkeypatch.setattr("sys.executable", str(script))


def test_recipe_sweep_reports_a_failed_train_with_the_last_line_of_its_log(failing_python, tsv_dir, tmp_path):
    from tools import recipe_sweep

    with pytest.raises(SystemExit) as e:
        recipe_sweep.train("small", [], tsv_dir, tmp_path, 1, 1)
    assert str(e.value) == "small: train exited 2: error: --data x.tsv: no such file"


def test_recipe_sweep_reports_a_failed_evaluate_with_its_stderr(failing_python, tsv_dir, tmp_path):
    from tools import recipe_sweep

    with pytest.raises(SystemExit) as e:
        recipe_sweep.score(tmp_path / "small", tsv_dir, 5)
    assert str(e.value) == (f"evaluate --checkpoint {tmp_path / 'small'} --beam-size 5 exited 2: "
                            "error: --data x.tsv: no such file")


def test_recipe_sweep_averages_every_logged_rate_the_first_window_too(tsv_dir, tmp_path, monkeypatch):
    from tools import recipe_sweep

    # A stand-in train writing the log a run writes: the rate of the steps that compiled nothing,
    # a line without one (every step of its window compiled) and an evaluation's line.
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n"
                      "while [ \"$1\" != --out ]; do shift; done\n"
                      "mkdir -p \"$2/checkpoints/30\"\n"
                      "cat > \"$2/metrics.jsonl\" <<'END'\n"
                      '{"step": 10, "loss": 3.0, "tokens_per_s": 100.0}\n'
                      '{"step": 20, "loss": 2.5}\n'
                      '{"step": 30, "loss": 2.0, "tokens_per_s": 400.0}\n'
                      '{"step": 30, "eval_loss": 2.1}\n'
                      "END\n")
    script.chmod(0o755)
    monkeypatch.setattr("sys.executable", str(script))
    record = recipe_sweep.train("small", [], tsv_dir, tmp_path, 1, 10)
    assert (record["steps"], record["exit_code"], record["tokens_per_s"]) == (30, 0, 250)  # (100 + 400) / 2

    # A log whose every line lacks a rate (each window compiled) has none to report, not 0.
    script.write_text(script.read_text().replace(', "tokens_per_s": 100.0', "").replace(', "tokens_per_s": 400.0', ""))
    assert recipe_sweep.train("small", [], tsv_dir, tmp_path, 1, 10)["tokens_per_s"] is None


def test_recipe_sweep_skips_a_configuration_with_a_result_and_trains_one_without_again(
        failing_python, tsv_dir, tmp_path, capsys):
    from tools import recipe_sweep

    out = tmp_path / "sweep"
    (out / "small" / "checkpoints").mkdir(parents=True)  # a run whose sweep stopped before its line
    (out / "d128x3").mkdir()
    (out / "results.jsonl").write_text('{"name": "d128x3"}\n')
    with pytest.raises(SystemExit):  # the stand-in train fails: the point is what came before it
        recipe_sweep.main(["--data", str(tsv_dir), "--out", str(out), "--configs", "d128x3", "small"])
    assert capsys.readouterr().err.splitlines() == [
        "d128x3: results.jsonl has its line; skipped",
        f"small: {out / 'small'} has no line in results.jsonl; trained again from the start"]
    assert not (out / "small" / "checkpoints").exists() and (out / "d128x3").exists()


def test_suite_profile_plugin_refuses_a_directory_holding_an_earlier_runs_files(tmp_path, monkeypatch):
    from tools import suite_profile

    (tmp_path / "main.json").write_text("{}")
    monkeypatch.setenv("SUITE_PROFILE_OUT", str(tmp_path))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the controller, whose check this is
    with pytest.raises(pytest.UsageError) as e:
        suite_profile.pytest_configure(None)
    assert str(e.value) == (f"SUITE_PROFILE_OUT={tmp_path}: holds files of an earlier run, which the summary would "
                            "merge into this one; give a new or empty directory")


@pytest.mark.parametrize("argv, problem", [
    (["{tmp}/profile.json"], "directory {tmp}/profile.json: is not a directory"),
    (["{tmp}", "--top", "0"], "--top must be >= 1, got 0"),
])
def test_suite_profile_summary_refuses_a_file_for_its_directory_or_an_empty_table(argv, problem, tmp_path, capsys):
    from tools import suite_profile

    (tmp_path / "profile.json").write_text('{"tests": [], "compiles": []}')
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert refusal(suite_profile.main, argv, capsys) == (
        "python -m tools.suite_profile: error: " + problem.format(tmp=tmp_path))


def test_suite_profile_summary_names_a_truncated_file(tmp_path):
    from tools import suite_profile

    (tmp_path / "gw0.json").write_text('{"tests": [["t.py::a", 1.0, 1.0, 0.0]], "comp')
    with pytest.raises(SystemExit) as e:
        suite_profile.main([str(tmp_path)])
    assert str(e.value).startswith(f"{tmp_path / 'gw0.json'}: not a whole profile file (JSONDecodeError: ")


@pytest.mark.parametrize("argv, problem", [
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--reps", "0"], "--reps must be >= 1, got 0"),
    (["--length", "0"], "--length must be between 1 and the small preset's max_len=11, got 0"),
    (["--length", "12"], "--length must be between 1 and the small preset's max_len=11, got 12"),
])
def test_dispatch_refuses_a_size_with_no_step_or_past_the_positional_table_before_building(argv, problem, capsys):
    from tools import dispatch

    assert refusal(dispatch.main, argv, capsys) == f"python -m tools.dispatch: error: {problem}"


@pytest.mark.parametrize("argv, problem", [
    (["--batch-size", "0"], "--dropout must be in (0, 1), --draws >= 2, --train-steps >= 0, --batch-size >= 1"),
    (["--preset", "tinny"], "argument --preset: invalid choice: 'tinny' (choose from "),
])
def test_dropout_expectation_refuses_an_empty_batch_or_unknown_preset_before_training(argv, problem, capsys):
    from tools import dropout_expectation

    line = refusal(dropout_expectation.main, argv, capsys)
    assert line.startswith(f"python -m tools.dropout_expectation: error: {problem}")


@pytest.mark.parametrize("value", [0, -2])
def test_a_positive_count_is_refused_naming_the_bound_that_holds_for_zero_and_negatives(value):
    from flaxformer_mini.data.batches import positive_int

    with pytest.raises(ValueError) as e:
        positive_int("batch_size", value)
    assert str(e.value) == f"batch_size must be >= 1, got {value}"


def test_measure_loading_refuses_an_empty_corpus(tmp_path, capsys):
    from tools import measure_loading

    argv = ["--lines", "0", "--file", str(tmp_path / "c.tsv"), "--workdir", str(tmp_path / "w")]
    assert refusal(measure_loading.main, argv, capsys) == "python tools/measure_loading.py: error: --lines must be >= 1, got 0"
    assert list(tmp_path.iterdir()) == []


def test_measure_loading_refuses_an_existing_corpus_of_another_length_naming_both_counts(tmp_path, capsys):
    from tools import measure_loading

    corpus = tmp_path / "c.tsv"
    corpus.write_text("a b\tb a\n" * 3)
    argv = ["--lines", "5", "--file", str(corpus), "--workdir", str(tmp_path / "w")]
    assert refusal(measure_loading.main, argv, capsys) == (
        f"python tools/measure_loading.py: error: --file {corpus}: holds 3 lines, not the 5 of --lines; remove it "
        "or give another --file")


@pytest.mark.parametrize("option", ["--file", "--workdir"])
def test_measure_loading_refuses_a_file_or_workdir_it_cannot_write(option, tmp_path, capsys):
    from tools import measure_loading

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    paths = {"--file": str(tmp_path / "c.tsv"), "--workdir": str(tmp_path / "w")}
    paths[option] = str(blocker / "below")  # under a file: no directory can be made there
    line = refusal(measure_loading.main, ["--lines", "2", *(x for kv in paths.items() for x in kv)], capsys)
    assert line == {
        "--file": f"python tools/measure_loading.py: error: --file {blocker / 'below'}: its directory {blocker} "
                  "does not exist",
        "--workdir": f"python tools/measure_loading.py: error: --workdir {blocker / 'below'}: {blocker} is a file, "
                     "not a directory",
    }[option]


def test_ablations_ctrl_c_lists_the_group_under_way_and_those_not_reached_as_not_run(tmp_path, monkeypatch, capsys):
    import json

    from tools import ablations

    def measured_then_ctrl_c(groups, preset, args, records, *_):
        records["default"].update(status="failed", reason="its group's process exited with code 1: x")
        raise KeyboardInterrupt

    monkeypatch.setattr(ablations, "run_groups", measured_then_ctrl_c)
    out = tmp_path / "a.json"
    code = ablations.main(["--preset", "tiny", "--reps", "1", "--json", str(out),
                           "--variants", "default", "no_dropout", "batch_x2"])
    assert code == 130
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m tools.ablations: stopped by Ctrl-C; wrote {out}"
    report = json.loads(out.read_text())
    assert report["complete"] is False
    assert {r["name"]: (r["status"], r["reason"]) for r in report["variants"]} == {
        "default": ("failed", "its group's process exited with code 1: x"),  # a finished group keeps its status
        "no_dropout": ("not_run", "stopped by Ctrl-C"),
        "batch_x2": ("not_run", "stopped by Ctrl-C")}


def test_measure_loading_interrupted_corpus_write_leaves_no_file_at_the_final_name(tmp_path, monkeypatch):
    """A write stopped after some lines (Ctrl-C here) leaves the final name as it was: absent,
    so the next run writes the corpus again rather than measuring a truncated one."""
    from tools import measure_loading

    class StopsMidWrite:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def writelines(self, lines):
            self.f.write(next(iter(lines)))  # one whole line on disk, then the interrupt
            self.f.flush()
            raise KeyboardInterrupt

    real_open = open
    monkeypatch.setattr(measure_loading, "open", lambda *a, **k: StopsMidWrite(real_open(*a, **k)), raising=False)
    corpus = tmp_path / "c.tsv"
    with pytest.raises(KeyboardInterrupt):
        measure_loading.write_corpus(corpus, 5)
    assert not corpus.exists()
    [partial] = tmp_path.iterdir()  # the line written went to the temporary name only
    assert partial.name == "c.tsv.partial" and partial.read_text().count("\n") == 1


def test_measure_loading_checks_its_options_without_loading_jax_into_its_childrens_parent():
    # Its children, started from this process, report their peak memory after their own imports,
    # and Linux carries a process's peak across fork and exec: with JAX here (about 140 MB), every
    # figure they wrote was that much too high.
    code = ("import sys; sys.argv = ['measure_loading']; from tools import measure_loading; "
            "print(sorted(m for m in ('jax', 'flax', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=pathlib.Path(__file__).parents[1])
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
