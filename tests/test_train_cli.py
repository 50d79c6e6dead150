"""`flaxformer-mini train` and `evaluate` as a user runs them: real processes, real signals."""

import json
import re
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from flaxformer_mini import checkpoint
from flaxformer_mini.fit import build_trainer
from flaxformer_mini.run import RunDir

# A run small enough for a test: the tiny preset on `copy` with short sequences.
TINY_RUN = ["--task", "copy", "--preset", "tiny", "--vocab-size", "11", "--max-len", "5", "--batch-size", "8",
            "--warmup", "5", "--eval-sequences", "16", "--eval-every", "1000", "--log-every", "5", "--no-progress"]


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "flaxformer_mini", *args], capture_output=True, text=True, timeout=timeout)


def start(*args):
    return subprocess.Popen([sys.executable, "-m", "flaxformer_mini", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def latest_state(out):
    config = RunDir(out).load_config()
    manager = checkpoint.open_manager(RunDir(out).checkpoints.absolute())
    return manager.latest_step(), checkpoint.restore(manager, build_trainer(config).init_state())


def assert_same_training_state(a, b):
    for x, y in zip(jax.tree.leaves((a.params, a.opt_state)), jax.tree.leaves((b.params, b.opt_state))):
        np.testing.assert_array_equal(x, y)


def wait_for_checkpoint(out, at_least, proc, timeout=240):
    deadline = time.time() + timeout
    ckpts = out / "checkpoints"
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended before checkpoint {at_least}: {proc.stderr.read()}")
        steps = [int(p.name) for p in ckpts.iterdir() if p.name.isdigit()] if ckpts.exists() else []
        if steps and max(steps) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint {at_least} within {timeout}s")


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """The uninterrupted reference: 60 steps, checkpoints every 10."""
    out = tmp_path_factory.mktemp("straight") / "run"
    proc = cli("train", *TINY_RUN, "--steps", "60", "--save-every", "10", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_train_prints_final_metrics_and_writes_the_run(straight_run):
    out, proc = straight_run
    final = json.loads(proc.stdout.strip().splitlines()[-1])
    assert final["step"] == 60 and set(final) >= {"loss", "token_accuracy", "exact_match"}
    assert (out / "loss.png").exists() and (out / "config.json").exists()
    assert "parameters" in proc.stderr


def test_kill_9_then_resume_ends_bit_identical_to_the_uninterrupted_run(straight_run, tmp_path):
    out = tmp_path / "run"
    proc = start("train", *TINY_RUN, "--steps", "60", "--save-every", "10", "--out", str(out))
    wait_for_checkpoint(out, 20, proc)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up or save
    proc.wait()
    resumed = cli("train", *TINY_RUN, "--steps", "60", "--save-every", "10", "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    (s1, a), (s2, b) = latest_state(straight_run[0]), latest_state(out)
    assert s1 == s2 == 60
    assert_same_training_state(a, b)


def test_ctrl_c_saves_then_resume_ends_bit_identical(straight_run, tmp_path):
    out = tmp_path / "run"
    proc = start("train", *TINY_RUN, "--steps", "60", "--save-every", "10", "--out", str(out))
    wait_for_checkpoint(out, 10, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted: saved step" in err
    saved = int(err.split("interrupted: saved step ")[1].split(";")[0])
    assert latest_state(out)[0] == saved  # the step it was at, not only the last periodic save
    resumed = cli("train", *TINY_RUN, "--steps", "60", "--save-every", "10", "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert_same_training_state(latest_state(straight_run[0])[1], latest_state(out)[1])


def test_evaluate_json_prints_the_three_metrics(straight_run):
    proc = cli("evaluate", "--checkpoint", str(straight_run[0]), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) == {"loss", "token_accuracy", "exact_match"}
    assert 0.0 <= result["exact_match"] <= 1.0 and result["loss"] > 0


def test_text_run_builds_its_vocabulary_and_trains(tmp_path):
    train = tmp_path / "train.tsv"
    pairs = [("a b c", "x y z"), ("b c", "y z"), ("c a", "z x"), ("a", "x")] * 4
    train.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    out = tmp_path / "mt"
    proc = cli("train", "--data", str(train), "--out", str(out), "--preset", "tiny", "--steps", "6", "--batch-size", "4",
               "--max-len", "8", "--eval-every", "6", "--save-every", "6", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    vocab = json.loads((out / "vocab_source.json").read_text())["tokens"]
    assert vocab[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"] and set(vocab[4:]) == {"a", "b", "c"}
    assert RunDir(out).load_config().model.source_vocab_size == 7


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
    assert "train.seed: 0 in the run, 1 now" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / "checkpoints").rglob("*") if p.is_file()} == before


def test_evaluate_without_a_run_names_the_directory(tmp_path):
    proc = cli("evaluate", "--checkpoint", str(tmp_path / "nothing"))
    assert proc.returncode == 2
    assert "nothing" in proc.stderr and "config.json is missing" in proc.stderr


def test_unusable_options_exit_2():
    proc = cli("train", "--task", "reverse", "--out", "x", "--batch-size", "0")
    assert proc.returncode == 2 and "--batch-size" in proc.stderr
    proc = cli("train", "--task", "reverse", "--data", "t.tsv", "--out", "x")
    assert proc.returncode == 2 and "not allowed with" in proc.stderr


def test_batch_size_not_divisible_by_the_device_count_is_refused_before_anything_is_written(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "flaxformer_mini", "train", *TINY_RUN, "--devices", "8",
                           "--batch-size", "30", "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    assert "--batch-size 30 is not divisible by 8 devices" in proc.stderr
    assert not out.exists()


def test_more_devices_than_the_machine_has_is_refused(tmp_path):
    proc = cli("train", *TINY_RUN, "--devices", "3", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "asked for 3 devices" in proc.stderr
