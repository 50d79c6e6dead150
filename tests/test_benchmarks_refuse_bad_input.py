"""The benchmarks refuse bad input in one line before any work, and Ctrl-C keeps what finished.

Every refusal here comes before a model is built or timed: the commands' ``main`` or
``parse_args`` is called in this process and its SystemExit caught; the runs that Ctrl-C stops
are stand-ins that report progress and then raise KeyboardInterrupt. Ctrl-C during the options'
import of torch._dynamo is one line too, and a second Ctrl-C while the first's line is made
(the finished seeds written) is ignored. A signal while a command imports JAX is sent from inside
that import in a process of its own (``python -m``). Nothing is compiled.
"""

import copy
import json
import os

import jax
import pytest

import benchmarks.__main__ as benchmarks_main
from benchmarks import scaling, train_parity


def _refused(call, argv, capsys):
    """The one line ``call(argv)`` exits 2 with."""
    with pytest.raises(SystemExit) as stop:
        call(argv)
    assert stop.value.code == 2, argv
    return capsys.readouterr().err.strip().splitlines()[-1]


# --------------------------------------------------------------------- python -m benchmarks

def test_an_unknown_torch_compile_backend_is_refused_by_name_when_a_compiled_path_runs(monkeypatch, capsys):
    # torch._dynamo's own list takes seconds to import: a stand-in of its shape.
    monkeypatch.setattr(benchmarks_main, "torch_compile_backends", lambda: ({"eager", "inductor", "aot_eager"},
                                                                              ["eager", "inductor"]))
    line = _refused(benchmarks_main.parse_args, ["--preset", "tiny", "--torch-compile-backend", "bogus"], capsys)
    assert line == ("python -m benchmarks: error: --torch-compile-backend bogus: torch.compile has no such backend; "
                    "choose one of eager, inductor (torch._dynamo.list_backends())")
    assert benchmarks_main.parse_args(["--preset", "tiny", "--torch-compile-backend", "aot_eager"]).bench_preset \
        .torch_compile_backend == "aot_eager"
    # Without a torch_compile path the backend is never used, and torch is not asked.
    monkeypatch.setattr(benchmarks_main, "torch_compile_backends", lambda: pytest.fail("torch was asked"))
    assert benchmarks_main.parse_args(["--preset", "tiny", "--paths", "flax_jit", "--torch-compile-backend", "bogus"])


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN's attention runs on a GPU")
def test_cudnn_attention_without_a_gpu_is_refused_unless_forced(capsys):
    line = _refused(benchmarks_main.parse_args, ["--preset", "tiny", "--attention", "cudnn"], capsys)
    assert line == (f"python -m benchmarks: error: --attention cudnn: cuDNN's attention needs a GPU and JAX sees none "
                    f"({jax.default_backend()}); --force runs it anyway")
    forced = benchmarks_main.parse_args(["--preset", "tiny", "--attention", "cudnn", "--force"])
    assert forced.bench_preset.attention_impl == "cudnn"


@pytest.mark.parametrize("finished", [0, 2])
def test_ctrl_c_without_json_counts_the_operations_that_had_finished(monkeypatch, capsys, finished):
    from benchmarks import runner

    def interrupted(preset, progress=None, **kw):
        for _ in range(finished):
            progress({"complete": False})
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", interrupted)
    assert benchmarks_main.main(["--preset", "tiny"]) == 130
    said = ("2 operation(s) had finished; no --json given, nothing written" if finished
            else "no operation had finished: nothing written")
    assert capsys.readouterr().err.strip().splitlines() == [f"interrupted: {said}"]


def test_ctrl_c_while_torch_dynamo_is_imported_is_one_line_too(monkeypatch, capsys):
    def importing():
        raise KeyboardInterrupt  # pressed during `import torch._dynamo`, in parse_args

    monkeypatch.setattr(benchmarks_main, "torch_compile_backends", importing)
    assert benchmarks_main.main(["--preset", "tiny", "--torch-compile-backend", "eager"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["interrupted: no operation had finished: nothing written"]


# ------------------------------------------------------------------- python -m benchmarks.scaling

def test_the_sweep_refuses_a_plot_format_matplotlib_cannot_write(tmp_path, capsys):
    line = _refused(scaling.main, ["--quick", "--plot", str(tmp_path / "s.txt")], capsys)
    assert line.startswith(f"python -m benchmarks.scaling: error: --plot {tmp_path / 's.txt'}: matplotlib cannot "
                           f"write .txt; the extension names the format: one of ")
    assert ".png" in line and ".svg" in line and ".pdf" in line
    assert scaling.plot_problem(str(tmp_path / "s.SVG")) is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("width", ["0", "-8", "7"])
def test_the_sweep_refuses_a_width_that_is_not_a_positive_multiple_of_the_heads(capsys, width):
    line = _refused(scaling.main, ["--width", width], capsys)
    assert line == (f"python -m benchmarks.scaling: error: --width must be a positive multiple of the base model's 8 "
                    f"heads (each head takes width / heads), got {width}")
    line = _refused(scaling.main, ["--quick", "--width", width], capsys)
    assert "the tiny model's 5 heads" in line and line.endswith(f"got {width}")


@pytest.mark.parametrize("json_given", [False, True])
def test_ctrl_c_keeps_the_sweeps_measured_points(monkeypatch, tmp_path, capsys, json_given):
    def interrupted(*args, progress=None, **kw):
        progress({"points": [{"sweep": "depth", "num_layers": 1}], "complete": False})
        progress({"points": [{"sweep": "depth", "num_layers": 1}, {"sweep": "depth", "num_layers": 2}],
                  "complete": False})
        raise KeyboardInterrupt

    monkeypatch.setattr(scaling, "run", interrupted)
    out = tmp_path / "s.json"
    assert scaling.main(["--quick", *(["--json", str(out)] if json_given else [])]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    if json_given:
        assert err == [f'interrupted: {out} holds the 2 point(s) measured before it ("complete": false)']
        assert json.loads(out.read_text()) == {"points": [{"sweep": "depth", "num_layers": 1},
                                                          {"sweep": "depth", "num_layers": 2}], "complete": False}
    else:
        assert err == ["interrupted: 2 point(s) had been measured; no --json given, nothing written"]
    assert [p.name for p in tmp_path.iterdir()] == (["s.json"] if json_given else [])


# -------------------------------------------------------------- python -m benchmarks.train_parity

TRAIN = ["--task", "reverse", "--steps", "2", "--eval-every", "1"]
PARITY_ERROR = "python -m benchmarks.train_parity: error: "


@pytest.mark.parametrize("argv, said", [
    (["--lr", "-1"], "--lr must be a finite number > 0, got -1.0"),
    (["--dropout", "2"], "invalid ModelConfig: --dropout must be in [0, 1), got 2.0"),
    (["--preset", "nope"], "--preset: unknown preset 'nope'; choose one of base, medium, seed, small, tiny, "
                           "transformer-base"),
    (["--label-smoothing", "2"], "--label-smoothing must be in [0, 1), got 2.0"),
    (["--clip-norm", "-1"], "--clip-norm must be a finite number > 0 or 0 (no clipping), got -1.0"),
    (["--min-len", "20", "--max-len", "10"], "--min-len=20 is greater than --max-len=10"),
    (["--max-tokens", "1"], "--max-tokens goes with --data (synthetic tasks have fixed-size batches), got "
                            "--max-tokens 1"),
])
def test_train_parity_refuses_a_recipe_that_cannot_run_naming_the_option(capsys, argv, said):
    assert _refused(train_parity.parse_args, [*TRAIN, *argv], capsys) == PARITY_ERROR + said


def test_train_parity_refuses_an_out_directory_it_cannot_make(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    line = _refused(train_parity.parse_args, [*TRAIN, "--out", str(tmp_path / "file" / "out")], capsys)
    assert line == PARITY_ERROR + f"--out {tmp_path / 'file' / 'out'}: {tmp_path / 'file'} is a file, not a directory"
    if os.path.isdir("/proc/self"):  # a directory root may write to, by its mode, where the kernel makes nothing
        line = _refused(train_parity.parse_args, ["--merge", str(tmp_path / "file"), "--out", "/proc/x"], capsys)
        assert line.startswith(PARITY_ERROR + "--out /proc/x: cannot be written under /proc (")
    assert train_parity.parse_args([*TRAIN, "--out", str(tmp_path / "new" / "deeper")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # the probe left nothing


@pytest.mark.parametrize("option", [["--steps", "5"], ["--lr", "0.1"], ["--seeds", "1"], ["--preset", "tiny"]])
def test_a_training_option_beside_merge_is_refused_as_having_no_effect(tmp_path, capsys, option):
    (tmp_path / "r.json").write_text("{}")
    line = _refused(train_parity.parse_args, ["--merge", str(tmp_path / "r.json"), *option], capsys)
    assert line == PARITY_ERROR + f"{option[0]} has no effect with --merge (the reports' recipe is kept)"


def test_ctrl_c_in_train_parity_writes_the_finished_seeds_or_says_none_were(monkeypatch, tmp_path, capsys):
    finished = {"benchmark": "train_parity", "seeds": {"0": {}, "1": {}}}

    def interrupted(args, argv=(), log=None, progress=None):
        progress({"benchmark": "train_parity", "seeds": {"0": {}}})
        progress(finished)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_parity, "run_all", interrupted)
    out = tmp_path / "out"
    assert train_parity.main([*TRAIN, "--seeds", "0", "1", "2", "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        f"interrupted: {out / 'train_parity.json'} holds seed(s) 0 1, finished before it (no plot drawn)"]
    assert json.loads((out / "train_parity.json").read_text()) == finished
    assert [p.name for p in out.iterdir()] == ["train_parity.json"]

    def at_once(args, argv=(), log=None, progress=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_parity, "run_all", at_once)
    assert train_parity.main([*TRAIN, "--out", str(tmp_path / "none")]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["interrupted: no seed had finished: nothing written"]
    assert not (tmp_path / "none").exists()


def test_a_refusal_found_once_the_data_is_read_ends_in_one_line(monkeypatch, tmp_path, capsys):
    def refused(args, argv=(), log=None, progress=None):
        raise train_parity.Refused("--max-tokens 1 is smaller than the longest example")

    monkeypatch.setattr(train_parity, "run_all", refused)
    assert train_parity.main([*TRAIN, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == PARITY_ERROR + "--max-tokens 1 is smaller than the longest example\n"
    assert not (tmp_path / "out").exists()


def test_the_evaluation_line_names_the_data_directorys_valid_file_not_a_valid_option(tmp_path):
    class Run:
        def describe_evaluation(self):
            return "evaluating on 32 of 200 held-out pairs from --valid; --valid-size sets how many"

    args = train_parity.parse_args(["--task", "reverse", "--steps", "2", "--eval-every", "1"])
    args.data, args.task = str(tmp_path), None
    assert train_parity.describe_evaluation(Run(), args) == (
        f"evaluating on 32 of 200 held-out pairs from {tmp_path / 'valid.tsv'} (--data); --valid-size sets how many")


# ---------------------------------------------------------------------------- --merge's checks

def _report(seed, wer=0.5):
    """A train_parity report of one seed with what merge() and verdict() read."""
    final = {"step": 2, "loss": 1.0, "token_accuracy": 0.5, "exact_match": 1 - wer, "word_error_rate": wer,
             "token_error_rate": 0.2}
    twin = {"final": final, "target_tokens_per_s": 100.0, "target_tokens_per_s_steady": 110.0}
    return {"benchmark": "train_parity", "date_utc": f"2026-01-0{seed + 1} 00:00 UTC",
            "code": {"commit": f"{seed}" * 40, "modified": False}, "argv": ["--seeds", str(seed)], "wall_s": 1.0,
            "load_average": {"start": [1.0], f"after_seed_{seed}": [2.0], "end": [3.0]},
            "machine": {"cpu": {"model_name": "CPU", "family": 6, "model": 85}, "cores": 2},
            "torch_threads": 2, "XLA_FLAGS": "", "GLIBC_TUNABLES": "",
            "recipe": {"model": {"dropout": 0.0}, "train": {"seed": seed}, "seeds": [seed],
                       "data": {"kind": "tsv", "train_path": "/a/train.tsv", "valid_path": "/a/valid.tsv"},
                       "data_sha256": {"data.train_path": "t" * 64, "data.valid_path": "v" * 64}},
            "seeds": {str(seed): {"flax": twin, "torch": twin}}, "summary": {}}


@pytest.mark.parametrize("key, value", [("torch_threads", 1), ("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=false"),
                                        ("GLIBC_TUNABLES", "glibc.malloc.arena_max=1")])
def test_merge_refuses_reports_timed_under_other_settings_naming_both_values(key, value):
    other = dict(_report(1), **{key: value})
    with pytest.raises(ValueError) as e:
        train_parity.merge([_report(0), other], ["a.json", "b.json"])
    assert str(e.value) == (f"b.json: measured with another {key} than a.json ({value!r} against "
                            f"{_report(0)[key]!r}): their times cannot be compared")


def _without(rep, path):
    rep = copy.deepcopy(rep)
    *parents, last = path.split(".")
    holder = rep
    for key in parents:
        holder = holder[key]
    del holder[last]
    return rep


@pytest.mark.parametrize("broken, said", [
    (lambda r: _without(r, "machine.cpu"), "b.json: a train_parity report without machine.cpu"),
    (lambda r: _without(r, "load_average.end"), "b.json: a train_parity report without load_average.end"),
    (lambda r: dict(r, seeds=[r["seeds"]["1"]]), "b.json: seeds is a list in a train_parity report, not a JSON object"),
    (lambda r: dict(r, merged_from=[{"name": "x"}]),
     "b.json: merged_from[0] lacks one of name, seeds, date_utc, code, argv, wall_s, load_average"),
])
def test_merge_refuses_a_malformed_report_naming_the_missing_path(broken, said):
    with pytest.raises(ValueError) as e:
        train_parity.merge([_report(0), broken(_report(1))], ["a.json", "b.json"])
    assert str(e.value) == said


def test_merging_a_merged_report_keeps_each_runs_own_entry():
    first = train_parity.merge([_report(0), _report(1)], ["a.json", "b.json"])
    again = train_parity.merge([first, _report(2)], ["ab.json", "c.json"])
    assert [(m["name"], m["seeds"], m["date_utc"], m["code"]["commit"][0], m["argv"]) for m in again["merged_from"]] == [
        ("a.json", [0], "2026-01-01 00:00 UTC", "0", ["--seeds", "0"]),
        ("b.json", [1], "2026-01-02 00:00 UTC", "1", ["--seeds", "1"]),
        ("c.json", [2], "2026-01-03 00:00 UTC", "2", ["--seeds", "2"])]
    assert list(again["seeds"]) == ["0", "1", "2"] and again["recipe"]["seeds"] == [0, 1, 2]


def test_merge_takes_the_same_data_at_another_path_by_its_sha256_and_refuses_other_contents():
    moved = _report(1)
    moved["recipe"]["data"] = {"kind": "tsv", "train_path": "/b/train.tsv", "valid_path": "/b/valid.tsv"}
    assert list(train_parity.merge([_report(0), moved], ["a.json", "b.json"])["seeds"]) == ["0", "1"]
    changed = copy.deepcopy(moved)
    changed["recipe"]["data_sha256"]["data.train_path"] = "u" * 64
    with pytest.raises(ValueError) as e:
        train_parity.merge([_report(0), changed], ["a.json", "b.json"])
    assert str(e.value) == (f"b.json: another recipe than a.json's (recipe.data_sha256.data.train_path: {'u' * 64!r} "
                            f"against {'t' * 64!r})")
    # Reports that do not both record the files' sha256 are compared by path, as the only record.
    unrecorded = _without(moved, "recipe.data_sha256")
    with pytest.raises(ValueError) as e:
        train_parity.merge([_report(0), unrecorded], ["a.json", "b.json"])
    assert str(e.value) == "b.json: another recipe than a.json's (recipe.data.train_path: '/b/train.tsv' against '/a/train.tsv')"


def test_a_second_ctrl_c_while_the_finished_seeds_are_written_is_ignored(monkeypatch, tmp_path, capsys):
    import signal

    from benchmarks.stopping import STOP_SIGNALS, stop_on_signals

    finished, written = {"benchmark": "train_parity", "seeds": {"0": {}}}, []
    real_write = benchmarks_main.write_json

    def interrupted(args, argv=(), log=None, progress=None):
        progress(finished)
        signal.raise_signal(signal.SIGINT)  # the first Ctrl-C: KeyboardInterrupt from here

    def write_pressed_again(rep, path):
        signal.raise_signal(signal.SIGINT)  # the second, while the finished seed is written
        written.append(path)
        real_write(rep, path)

    monkeypatch.setattr(train_parity, "run_all", interrupted)
    monkeypatch.setattr(benchmarks_main, "write_json", write_pressed_again)
    before = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    stop_on_signals()  # the command's handlers, as `python -m benchmarks.train_parity` installs them
    try:
        assert train_parity.main([*TRAIN, "--out", str(tmp_path / "out")]) == 130
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    path = tmp_path / "out" / "train_parity.json"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"interrupted: {path} holds seed(s) 0, finished before it (no plot drawn)"]
    assert written == [path] and json.loads(path.read_text()) == finished


# ------------------------------------------------------------- Ctrl-C while a command imports JAX

# Loaded at the interpreter's start (sitecustomize): the first `import jax` sends this process
# SIGINT (or SIGTERM) from inside the import, as a Ctrl-C pressed while JAX loads, and says so
# in a file; the command goes on from there.
SIGNAL_DURING_JAX_IMPORT = '''
import os, signal, sys


class SignalDuringJaxImport:
    def find_spec(self, name, path=None, target=None):
        if name == "jax":
            sys.meta_path.remove(self)
            with open(os.environ["SIGNALLED_AT"], "w") as f:
                f.write(name)
            os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL_DURING_JAX_IMPORT"]))
        return None


sys.meta_path.insert(0, SignalDuringJaxImport())
'''


@pytest.mark.parametrize("command, nothing, signal_name", [
    (["benchmarks", "--preset", "tiny", "--json", "{out}/bench.json"], "no operation had finished", "SIGINT"),
    (["benchmarks.scaling", "--quick", "--json", "{out}/scaling.json"], "no point had been measured", "SIGINT"),
    (["benchmarks.train_parity", *TRAIN, "--out", "{out}"], "no seed had finished", "SIGINT"),
    (["benchmarks", "--preset", "tiny", "--json", "{out}/bench.json"], "no operation had finished", "SIGTERM"),
])
def test_ctrl_c_while_a_command_imports_jax_is_one_line_and_writes_nothing(tmp_path, command, nothing, signal_name):
    import subprocess
    import sys
    from pathlib import Path

    hook, out, signalled = tmp_path / "hook", tmp_path / "out", tmp_path / "signalled"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SIGNAL_DURING_JAX_IMPORT)
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook), str(repo)]), SIGNALLED_AT=str(signalled),
               SIGNAL_DURING_JAX_IMPORT=signal_name)
    proc = subprocess.run([sys.executable, "-m", *(a.format(out=out) for a in command)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert signalled.read_text() == "jax"  # the signal came while JAX was being imported
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, f"interrupted: {nothing}: nothing written\n", "")
    assert not out.exists()
