"""`flaxformer-mini average --checkpoint RUN --last N --out AVG`: AVG is a run directory holding
the mean of the parameters of RUN's newest N checkpoints (fairseq's average_checkpoints.py), at
the newest step with that step's optimizer state, which evaluate, generate and parity convert
read as any run and train refuses to continue."""

import contextlib
import importlib
import io
import json
import os
import signal
import time

import chex
import jax
import numpy as np
import pytest

from flaxformer_mini.cli.main import main
from flaxformer_mini.runs import average
from flaxformer_mini.runs.run import Run
from flaxformer_mini.train import checkpoint
from helpers import TINY_RUN, cli


def test_average_writes_a_run_of_the_last_checkpoints_mean_parameters(tmp_path):
    run, avg = tmp_path / "run", tmp_path / "avg"
    trained = cli("train", *TINY_RUN, "--steps", "20", "--save-every", "5", "--out", str(run))  # keeps 10, 15, 20
    assert trained.returncode == 0, trained.stderr
    averaged = cli("average", "--checkpoint", str(run), "--last", "3", "--out", str(avg))
    assert averaged.returncode == 0, averaged.stderr
    assert "checkpoints at steps 10, 15, 20 (read as a run at step 20)" in averaged.stdout

    source = Run.open(run)
    states = [checkpoint.restore(source.checkpoints(), source.trainer.state_template(), step) for step in (10, 15, 20)]
    # The mean in float64, added in step order as average adds them, rounded once to float32:
    # the same arithmetic, so equal bit for bit.
    expected = jax.tree.map(lambda a, b, c: ((np.float64(a) + np.float64(b) + np.float64(c)) / 3).astype(np.float32),
                            *(s.params for s in states))
    state = Run.open(avg).latest_state()
    assert int(state.step) == 20
    chex.assert_trees_all_equal(jax.device_get(state.params), expected)
    chex.assert_trees_all_equal(state.opt_state, states[-1].opt_state)
    config = json.loads((avg / "config.json").read_text())
    assert config["averaged"] == {"run": str(run.absolute()), "steps": [10, 15, 20]}

    scored = cli("evaluate", "--checkpoint", str(avg), "--json")
    assert scored.returncode == 0, scored.stderr
    assert cli("generate", "--checkpoint", str(avg), "1 2 3").returncode == 0
    from parity.cli import main as parity_main

    assert parity_main(["convert", str(avg), str(tmp_path / "avg.safetensors")]) == 0

    # Its optimizer state belongs to other parameters: train does not continue it.
    snapshot = lambda root: {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}  # noqa: E731
    before = snapshot(avg)
    refused = cli("train", *TINY_RUN, "--steps", "30", "--out", str(avg))
    assert refused.returncode == 2
    assert f"--out {avg} holds an average of checkpoints of {run.absolute()} (`flaxformer-mini average`)" in refused.stderr
    assert snapshot(avg) == before


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """A tiny run holding the checkpoints of steps 5 and 10."""
    run = tmp_path_factory.mktemp("average") / "run"
    trained = cli("train", *TINY_RUN, "--steps", "10", "--save-every", "5", "--out", str(run))
    assert trained.returncode == 0, trained.stderr
    return run


def test_average_into_the_working_directory_is_refused_and_writes_nothing(two_checkpoints, tmp_path, monkeypatch):
    # An empty working directory passes the emptiness check, but a directory in use cannot be
    # renamed onto: the staged average would be left beside it.
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    refused = cli("average", "--checkpoint", str(two_checkpoints), "--last", "2", "--out", ".")
    assert refused.returncode == 2
    assert "--out .: the working directory; give a new directory for the average (nothing was written)" in refused.stderr
    assert list(tmp_path.iterdir()) == [here] and list(here.iterdir()) == []


def test_sigterm_while_the_average_is_written_stops_it_and_leaves_no_staging(two_checkpoints, tmp_path, monkeypatch):
    def terminated(*args, **kwargs):
        # Without the CLI's handler, SIGTERM's default action would end the test's own process.
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises in this thread before the sleep ends
        raise AssertionError("SIGTERM did not interrupt the write")

    monkeypatch.setattr(checkpoint, "save", terminated)
    before = signal.getsignal(signal.SIGTERM)
    stopped = cli("average", "--checkpoint", str(two_checkpoints), "--last", "2", "--out", str(tmp_path / "avg"))
    assert stopped.returncode == 130, stopped.stderr
    assert list(tmp_path.iterdir()) == []  # neither AVG nor its .avg.averaging-PID staging directory
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_sigterm_during_the_rename_is_answered_after_it_saying_the_average_was_written(two_checkpoints, tmp_path,
                                                                                       monkeypatch):
    out, rename, sent = tmp_path / "avg", os.rename, []
    out.mkdir()  # an empty OUT: the rename puts the average in its place

    def terminated_first(src, dst):
        if str(dst) == str(out) and not sent:  # held until the rename is done
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        rename(src, dst)

    monkeypatch.setattr(average.os, "rename", terminated_first)
    before = signal.getsignal(signal.SIGTERM)
    stopped = cli("average", "--checkpoint", str(two_checkpoints), "--last", "2", "--out", str(out))
    monkeypatch.setattr(average.os, "rename", rename)
    assert sent and stopped.returncode == 130 and f"stopped once {out} was written" in stopped.stderr, stopped.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["avg"] and (out / "checkpoints").is_dir()  # no staging left
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_out_filled_by_another_program_during_the_write_is_kept_and_named(two_checkpoints, tmp_path, monkeypatch):
    # The empty OUT passed the check; a file put there before the rename makes the rename fail,
    # and OUT is kept as it is (never removed to make room).
    out, rename = tmp_path / "avg", os.rename
    out.mkdir()

    def filled_first(src, dst):
        if str(dst) == str(out):
            (out / "theirs.txt").write_text("another program's file")
        rename(src, dst)

    monkeypatch.setattr(average.os, "rename", filled_first)
    refused = cli("average", "--checkpoint", str(two_checkpoints), "--last", "2", "--out", str(out))
    assert refused.returncode == 2 and f"{out}: Directory not empty (nothing was written)" in refused.stderr, refused.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["avg"] and [p.name for p in out.iterdir()] == ["theirs.txt"]


def test_a_signal_after_the_rename_still_says_the_average_was_written(two_checkpoints, tmp_path, monkeypatch):
    command = importlib.import_module("flaxformer_mini.cli.average")  # the module main() runs

    out, sent = tmp_path / "avg", []

    def terminated_before_printing(*args, **kwargs):  # the command's line after the rename
        sent.append(signal.SIGTERM)  # before the kill: the handler raises as os.kill returns
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises in this thread before the sleep ends

    monkeypatch.setattr(command, "print", terminated_before_printing, raising=False)
    stopped = cli("average", "--checkpoint", str(two_checkpoints), "--last", "2", "--out", str(out))
    assert sent and stopped.returncode == 130 and f"stopped once {out} was written" in stopped.stderr, stopped.stderr
    assert (out / "checkpoints").is_dir()


def test_a_signal_as_the_command_flushes_its_line_says_its_work_was_finished(two_checkpoints, tmp_path):
    # Past the command's own handling: main flushes stdout and removes its handlers. A signal
    # there stops nothing the command was writing, and says so rather than a bare "stopped".
    out, sent = tmp_path / "avg", []

    class SignalledAtFlush(io.StringIO):
        def flush(self):
            if not sent:
                sent.append(signal.SIGTERM)  # before the kill: the handler raises as os.kill returns
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises in this thread before the sleep ends

    stdout, stderr = SignalledAtFlush(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["average", "--checkpoint", str(two_checkpoints), "--last", "2", "--out", str(out)])
    assert sent and code == 130, stderr.getvalue()
    assert "stopped after the command had finished its work" in stderr.getvalue()
    assert f"{out}: the mean parameters" in stdout.getvalue() and (out / "checkpoints").is_dir()
