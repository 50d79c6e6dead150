"""`train --best-metric --patience` on two real processes (gloo on this CPU): every process takes
the same decisions from its own evaluation (one vote each: saving OUT/best is collective), so the
run keeps the best checkpoint and stops early where one process does, and never hangs."""

import json

from flaxformer_mini.runs.directory import RunDir
from test_best_checkpoint import COMMAND
from test_multiprocess import assert_all_ok, finish, start_processes, train_cli
from test_train_cli import cli

OPTIONS = COMMAND[COMMAND.index("--steps"):]  # the options after TINY_RUN's


def test_two_processes_keep_the_best_checkpoint_and_stop_early_where_one_process_does(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    alone = cli(*COMMAND, "--out", str(one))
    assert alone.returncode == 0, alone.stderr
    argv = train_cli(two, 2)  # one coordinator port for both
    results = finish(start_processes(lambda i: argv(i) + OPTIONS, 2))
    assert_all_ok(results)
    expected = json.loads(alone.stdout.strip().splitlines()[-1])
    got = json.loads(results[0][1].strip().splitlines()[-1])
    assert got["stopped_early"] is True and expected["stopped_early"] is True
    assert (got["step"], got["best_step"], got["best_exact_match"]) == (
        expected["step"], expected["best_step"], expected["best_exact_match"])
    assert [p.name for p in (two / "best").iterdir()] == [str(expected["best_step"])]
    exact = [{r["step"]: r["eval_exact_match"] for r in RunDir(out).read_metrics() if "eval_loss" in r}
             for out in (one, two)]
    assert exact[0] == exact[1]
    # Parameters are not compared: with the CLI's Adam epsilon, round-off in the attention key
    # biases' zero gradients grows to 1e-3 over the steps (tests/test_multiprocess.py's ADAM_EPS
    # says why); what is checked here is that every decision is one process's.
