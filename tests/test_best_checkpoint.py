"""`train --best-metric` and `--patience`: the best evaluation's state is kept
in OUT/best, the run stops after --patience evaluations without a better one, and a run stopped
and resumed (killed past its last checkpoint, or stopped in the middle of an evaluation) ends
bit-identical to one never stopped: the same parameters, the same best checkpoint, the same
evaluations logged, stopped early at the same step. Two processes take one process's decisions.
`evaluate`, `generate` and `parity convert` read OUT/best as a run at the best step."""

import json
import shutil

import chex
import pytest

import flaxformer_mini.runs.fit as fit_module
from flaxformer_mini.runs.directory import RunDir
from flaxformer_mini.runs.run import Run
from helpers import TINY_RUN, TINY_RUN_INPUTS, assert_same_training_state, cli, latest_state

# exact_match over the 16 held-out sequences ties often on the tiny model, so --patience 4 stops
# the run well before --steps (at step 50, its best at step 30). The rotating checkpoints are
# saved only where a run ends (a stop, an early stop, --steps), the states these tests compare and
# resume from; the killed run, which must resume from an earlier one, saves every SAVE_EVERY steps.
STEPS, SAVE_EVERY = 60, 10
COMMAND = ["train", *TINY_RUN, "--steps", str(STEPS), "--eval-every", "5", "--save-every", str(STEPS),
           "--best-metric", "exact_match", "--patience", "4"]


def result_of(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def evaluations(out):
    """{step: exact match} of every evaluation the run logged."""
    return {r["step"]: r["eval_exact_match"] for r in RunDir(out).read_metrics() if "eval_exact_match" in r}


def best_state(out):
    run = Run.open(out / "best")
    return run.latest_state()


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The run never stopped: its directory and its result line."""
    out = tmp_path_factory.mktemp("straight") / "run"
    return out, result_of(cli(*COMMAND, "--out", str(out)))


def test_the_best_evaluation_is_kept_and_the_run_stops_after_patience_evaluations_without_a_better_one(straight):
    out, result = straight
    logged = evaluations(out)
    best = max(logged.values())
    first_best = min(step for step, value in logged.items() if value == best)  # a tie is no better
    assert result["best_step"] == first_best and result["best_exact_match"] == best
    # Stopped at the fourth evaluation after the best, each no better, before --steps.
    assert result["stopped_early"] is True and result["step"] == first_best + 4 * 5 < STEPS
    assert max(logged) == result["step"]
    assert [int(p.name) for p in (out / "best").iterdir()] == [first_best]
    # Run again, it stops there at once: the same result, nothing trained.
    again = cli(*COMMAND, "--out", str(out))
    assert f"stopped early at step {result['step']}: no better exact_match in 4 evaluation(s)" in again.stderr
    assert result_of(again) == result
    assert latest_state(out)[0] == result["step"]


def test_a_run_whose_patience_runs_out_at_its_last_step_finished_without_stopping_early(straight, tmp_path):
    # The straight run's evaluations until its early stop, with --steps there: the run reaches
    # --steps, so it finished; stopping "early" is only before it.
    out, result = straight
    last = cli(*COMMAND, "--steps", str(result["step"]), "--out", str(tmp_path / "run"))
    assert result_of(last) == {**result, "stopped_early": False}
    assert "stopping early" not in last.stderr and "stopped early" not in last.stderr


def test_evaluate_generate_and_parity_convert_read_run_best_at_the_best_step(straight, tmp_path):
    out, result = straight
    best = str(out / "best")
    # evaluate scores the best state as the evaluation during training did (the same held-out
    # sequences, all decoded greedily).
    scored = cli("evaluate", "--checkpoint", best)
    assert scored.returncode == 0, scored.stderr
    assert f"{best} at step {result['best_step']}: " in scored.stdout
    assert f"exact match {result['best_exact_match']:.4f}" in scored.stdout
    generated = cli("generate", "--checkpoint", best, stdin=TINY_RUN_INPUTS)
    assert generated.returncode == 0 and generated.stdout.count("\n") == TINY_RUN_INPUTS.count("\n"), generated.stderr
    from parity.cli import main as parity_main

    assert parity_main(["convert", best, str(tmp_path / "best.safetensors")]) == 0
    from parity.convert import state_dict_from_run

    _, _, step = state_dict_from_run(best)
    assert step == result["best_step"] != latest_state(out)[0]


def test_a_run_killed_past_its_last_checkpoint_resumes_to_the_same_best_checkpoint_and_early_stop(straight, tmp_path):
    out, result = straight
    killed = tmp_path / "run"
    # What `kill -9` leaves between saving a new best (step 30 here) and the rotating checkpoint of
    # the same step: OUT/best one evaluation past the newest checkpoint (step 20), the log past it too.
    kill_at = 30
    assert result["best_step"] == kill_at, "the case needs a best evaluation after the checkpoint resumed from"
    command = [*COMMAND, "--save-every", str(SAVE_EVERY)]  # the last --save-every wins
    result_of(cli(*command, "--steps", str(kill_at), "--out", str(killed)))
    shutil.rmtree(killed / "checkpoints" / str(kill_at))
    assert sorted(int(p.name) for p in (killed / "best").iterdir()) == [kill_at]
    resumed = cli(*command, "--out", str(killed))
    assert f"resuming {killed} from step {kill_at - SAVE_EVERY}" in resumed.stderr
    # The count of evaluations without a better one (two at step 20) went on from the log.
    assert result_of(resumed) == result
    assert evaluations(killed) == evaluations(out)
    (s1, a), (s2, b) = latest_state(out), latest_state(killed)
    assert s1 == s2 == result["step"]
    assert_same_training_state(a, b)
    chex.assert_trees_all_equal(best_state(out).params, best_state(killed).params)


def test_a_stop_during_an_evaluation_saves_that_step_and_the_resumed_run_evaluates_it_first(straight, tmp_path,
                                                                                            monkeypatch):
    out, result = straight
    stopped = tmp_path / "run"
    real, calls = fit_module.evaluate, []

    def stopped_at_the_third(*args, stop=None, **kwargs):  # as a SIGTERM between its batches would
        calls.append(1)
        return real(*args, stop=(lambda: True) if len(calls) == 3 else stop, **kwargs)

    monkeypatch.setattr(fit_module, "evaluate", stopped_at_the_third)
    proc = cli(*COMMAND, "--out", str(stopped))
    assert proc.returncode == 130, proc.stderr
    assert "the evaluation at step 15 was stopped; the resumed run does it first" in proc.stderr
    assert latest_state(stopped)[0] == 15 and 15 not in evaluations(stopped)
    monkeypatch.setattr(fit_module, "evaluate", real)
    resumed = cli(*COMMAND, "--out", str(stopped))
    assert "evaluating step 15, whose evaluation the stop request had cut short" in resumed.stderr
    assert result_of(resumed) == result
    assert evaluations(stopped) == evaluations(out)
    assert_same_training_state(latest_state(out)[1], latest_state(stopped)[1])
    chex.assert_trees_all_equal(best_state(out).params, best_state(stopped).params)


def test_two_processes_keep_the_best_checkpoint_and_stop_early_where_one_process_does(straight, tmp_path):
    # Every process takes the decisions from its own evaluation, one vote each (saving OUT/best is
    # collective): the run keeps the best checkpoint and stops early where one process does.
    from helpers import assert_all_ok, finish, start_processes, train_cli

    one, expected = straight
    two = tmp_path / "two"
    argv, options = train_cli(two, 2), COMMAND[COMMAND.index("--steps"):]  # one coordinator port; TINY_RUN's own
    results = finish(start_processes(lambda i: argv(i) + options, 2))
    assert_all_ok(results)
    got = json.loads(results[0][1].strip().splitlines()[-1])
    assert got["stopped_early"] is True
    assert (got["step"], got["best_step"], got["best_exact_match"]) == (
        expected["step"], expected["best_step"], expected["best_exact_match"])
    assert [p.name for p in (two / "best").iterdir()] == [str(expected["best_step"])]
    assert evaluations(two) == evaluations(one)
    # Parameters are not compared: with the CLI's Adam epsilon, round-off in the attention key
    # biases' zero gradients grows to 1e-3 over the steps (tests/test_multiprocess.py's ADAM_EPS
    # says why); what is checked here is that every decision is one process's.
