"""Training on several real processes (JAX's multi-controller runtime over gloo, on this CPU)
computes what one process computes and resumes exactly; its faults and refusals are
tests/test_multiprocess_faults.py's, which launches processes with the helpers here.

Each test starts real processes (``subprocess``, a free port for the coordinator), as a user
would on several hosts. Two kinds of launch:

- the library path (``Run.create`` + ``fit``, what ``train`` calls), from this file run as
  ``--worker``: the equivalence runs, with Adam's epsilon raised (see ADAM_EPS);
- the CLI itself (``python -m flaxformer_mini train --coordinator ...``): the kill, SIGTERM
  and resume story (the refusals: tests/test_multiprocess_faults.py).

Time (2-core CPU shared with other jobs): see docs/scale-out.md; each launch costs a JAX
start-up and a compilation per process.
"""

import contextlib
import json
import re
import signal
import sys
import time

import chex
import jax
import numpy as np
import pytest

from helpers import (
    BATCH_SIZE,
    HEARTBEAT_S,
    STEPS,
    assert_all_ok,
    checkpoint_steps,
    cli,
    damage,
    final_state,
    finish,
    free_port,
    saved_step_in,
    start_processes,
    train_cli,
    wait_for,
    worker_config,
    write_corpus,
)

EQUIV_ATOL = 1e-6  # the bar for losses and parameters; reached, no looser tolerance needed

# ----------------------------------------------------------------------------- the worker


def _worker(spec):
    """Train each of ``spec['runs']`` for STEPS steps in this process (one of spec['n'])."""
    from flaxformer_mini.scale import distributed

    if spec["n"] > 1:
        import every_process_caches  # noqa: F401 - process 0 compiles what spans the processes, once

        distributed.start_runtime(spec["coordinator"], spec["n"], spec["process_id"], timeout_s=60)
    from flaxformer_mini.runs.fit import fit
    from flaxformer_mini.runs.run import Run
    from flaxformer_mini.scale.sharding import training_mesh

    for r in spec["runs"]:
        if "copy_from" in r:  # a checkpoint continued in this launch (single-process launches only)
            import shutil

            shutil.copytree(r["copy_from"], r["out"])
        batch_size = None if "text" in r else BATCH_SIZE  # --max-tokens: rows follow the lengths
        mesh = (training_mesh(None, r["sharding"], batch_size, mesh_shape=r["mesh"]) if "mesh" in r
                else training_mesh(r["devices"], r["sharding"], batch_size))
        run = Run.create(r["out"], worker_config(r.get("text")), echo=lambda m: None)
        if "text" in r:  # say how each micro-batch reaches the step: in its own shape (B, S), and B's split
            step = run.trainer.add_micro_batch
            layout = lambda a: getattr(a, "sharding", None) and a.sharding.spec  # noqa: E731
            run.trainer.add_micro_batch = lambda state, sums, batch: (print(
                f"{r['out']}: micro-batch {batch.source.shape} laid out {layout(batch.source)}", file=sys.stderr),
                step(state, sums, batch))[1]
        with _evaluating(r.get("evaluate", True)):
            fit(run, r.get("steps", STEPS), log_every=1, eval_every=STEPS, save_every=STEPS, progress=False, mesh=mesh,
                sharding=r["sharding"], echo=lambda m: print(f"{r['out']}: {m}", file=sys.stderr), plot=False)


@contextlib.contextmanager
def _evaluating(really):
    """fit's evaluations as they are, or (``really`` False) left out: the equivalence compares the
    training losses and parameters, and an evaluation's decoding loop costs every process a
    compilation (about 2 s of a 6.6 s one-process run here). The reference and the launch's
    tensor-parallel run evaluate: its state gathered from two processes scores as one process
    scores it (test_evaluation_gathered_from_two_processes_...)."""
    import flaxformer_mini.runs.fit as fit_module

    kept = fit_module.evaluate
    if not really:
        fit_module.evaluate = lambda *args, **kwargs: {"loss": 0.0, "token_accuracy": 0.0, "exact_match": 0.0}
    try:
        yield
    finally:
        fit_module.evaluate = kept


def launch_workers(n, runs, devices_per_process=1):
    port = free_port()

    def argv(i):
        spec = {"n": n, "process_id": i, "coordinator": f"127.0.0.1:{port}", "runs": runs}
        return [sys.executable, __file__, "--worker", json.dumps(spec)]

    results = finish(start_processes(argv, n, devices_per_process))
    assert_all_ok(results)
    return results


def losses(out):
    from flaxformer_mini.runs.directory import RunDir

    return {r["step"]: r["loss"] for r in RunDir(out).read_metrics() if "loss" in r}


def max_param_diff(a, b):
    worst, where = 0.0, None
    flat_b = dict(jax.tree_util.tree_flatten_with_path(b.params)[0])
    for path, x in jax.tree_util.tree_flatten_with_path(a.params)[0]:
        d = float(np.abs(np.asarray(x, np.float64) - np.asarray(flat_b[path], np.float64)).max())
        if d >= worst:
            worst, where = d, jax.tree_util.keystr(path)
    return worst, where


# ----------------------------------------------------------------------------- equivalence

# Each process of the 2-process launch has two devices (LAUNCH_DEVICES): its 2x1 run (the
# reference's checkpoint continued replicated, CONTINUED below) uses the first of each. FSDP over
# 2 processes x 2 devices is the text run's (test_max_tokens_and_accumulate_...), and tensor
# parallelism's (below).
LAUNCH_DEVICES = 2
# Tensor parallelism across processes (--mesh data=2,model=2 on 2 processes x 2 devices): each
# process's two devices split the heads and feed-forward units (make_mesh_2d keeps a row of
# the mesh inside a process), the data axis and FSDP span the processes.
TENSOR_PARALLEL = "2x2_mesh_data=2,model=2_fsdp"


# Token-budget batches with accumulation over 2 processes of 2 devices, FSDP (--max-tokens 60
# --accumulate 2 of a word-vocabulary text run), against the same run in one process on one device.
TEXT_RUN = "text_max_tokens_accumulate"
TEXT_REFERENCE, TEXT_2X2 = f"{TEXT_RUN}_reference", f"{TEXT_RUN}_2x2"
TEXT_MAX_TOKENS = 60


# Checkpoints across meshes: a run saved at STEPS under one layout, continued to 2 * STEPS
# under another, against its single-process source continued on its own mesh (OWN_MESH).
OWN_MESH = {
    # name: (the run whose step-STEPS checkpoint it continues, its sharding on one device)
    "continued_on_1_process": ("reference", "replicated"),
    "text_continued_on_1_process": (TEXT_REFERENCE, "fsdp"),
}
CONTINUED = {
    # name: (the run whose step-STEPS checkpoint it starts from, processes, devices per process,
    #        sharding, the OWN_MESH run it is compared with)
    # The launch's 2x1 layout: one device of each process, every parameter replicated on both.
    "1_process_to_2_processes": ("reference", 2, 1, "replicated", "continued_on_1_process"),
    # One device, in the text reference's own sharding: the same compiled steps as its continuation.
    "fsdp_4_devices_to_1_device": (TEXT_2X2, 1, 1, "fsdp", "text_continued_on_1_process"),
}


@pytest.fixture(scope="module")
def equivalence_runs(tmp_path_factory):
    """One launch of 2 processes with 2 devices each, running its runs one after another, and
    the single-process runs in this process: the reference first (the 2-process runs continue
    its checkpoint), then the launch, then the single-process runs that continue its 2x2 FSDP
    run or need none (a launch costs a JAX start-up per process, and every process compiles
    the programs it runs alone: tests/every_process_caches.py).

    Two processes, not more: every property here shows with two, and each process more is a
    JAX start-up and every program's compilation more (docs/testing.md, "What was cut and why"). The 2-process
    layouts share one launch of processes with two devices each: the 2x1 layout uses one device
    of each, as ``--devices 1`` does on such a host. That aborts every process if the stop votes
    run on all of each host's devices and the train step on the mesh's (XLA:CPU's collectives
    then take one program's data for the other's); the 2x1 run here is its test, and
    it continues the reference's checkpoint (a 2-process run of its own would start, restore
    and compile once more in each process)."""
    import shutil

    root = tmp_path_factory.mktemp("equivalence")
    t0 = time.time()
    run = lambda name, d, sharding, **kw: {"out": str(root / name), "devices": d, "sharding": sharding, **kw}  # noqa: E731
    text = {"train": str(write_corpus(root / "train.tsv", 60)), "valid": str(write_corpus(root / "valid.tsv", 7)),
            "max_tokens": TEXT_MAX_TOKENS, "accumulate": 2}
    # The text runs and the runs below but the reference leave fit's evaluations out (_evaluating says why).
    _worker({"n": 1, "runs": [run("reference", 1, "replicated")]})  # one process on one device: this one (no launch to pay)
    launch = [run(TENSOR_PARALLEL, None, "fsdp", mesh={"data": 2, "model": 2}),
              run(TEXT_2X2, 2, "fsdp", text=text, evaluate=False)]
    data = lambda source: {"text": text} if source.startswith(TEXT_RUN) else {}  # noqa: E731 - a text run's files
    one_process = [run(TEXT_REFERENCE, 1, "fsdp", text=text, evaluate=False)]
    one_process += [run(name, 1, sharding, steps=2 * STEPS, copy_from=str(root / source), evaluate=False, **data(source))
                    for name, (source, sharding) in OWN_MESH.items()]
    for name, (source, n, d, sharding, _) in CONTINUED.items():
        if n == 1:  # continued in this process, once its source exists
            one_process.append(run(name, d, sharding, steps=2 * STEPS, copy_from=str(root / source), evaluate=False,
                                   **data(source)))
        else:  # copied here, once, not by each process of the launch
            assert source == "reference"  # it exists before the launch
            shutil.copytree(root / source, root / name)
            launch.append(run(name, d, sharding, steps=2 * STEPS, evaluate=False))
    results = launch_workers(2, launch, devices_per_process=LAUNCH_DEVICES)
    (root / "2x2_launch.stderr").write_text(results[0][2])  # what process 0 said of its runs
    _worker({"n": 1, "runs": one_process})
    print(f"equivalence launches: {time.time() - t0:.0f}s", file=sys.stderr)
    return root


def test_the_reference_run_moves_the_parameters_well_beyond_the_tolerance(equivalence_runs):
    from flaxformer_mini.runs.run import Run

    run = Run.open(equivalence_runs / "reference")
    moved, _ = max_param_diff(final_state(equivalence_runs / "reference"), run.initial_state())
    assert moved > 1000 * EQUIV_ATOL
    assert sorted(losses(equivalence_runs / "reference")) == list(range(1, STEPS + 1))


def test_multiprocess_losses_and_parameters_equal_one_process(equivalence_runs):
    # The 2x1 layout's equivalence: test_a_checkpoint_continues_on_another_mesh_as_on_its_own.
    ref, got = losses(equivalence_runs / "reference"), losses(equivalence_runs / TENSOR_PARALLEL)
    assert sorted(got) == sorted(ref), "process 0 logs every step once"
    worst = max(abs(ref[s] - got[s]) for s in ref)
    assert worst <= EQUIV_ATOL, f"{TENSOR_PARALLEL}: losses differ by {worst:.2e}"
    chex.assert_trees_all_close(final_state(equivalence_runs / TENSOR_PARALLEL).params,
                                final_state(equivalence_runs / "reference").params, atol=EQUIV_ATOL, rtol=0)


def test_evaluation_gathered_from_two_processes_scores_as_one_process(equivalence_runs):
    # The tensor-parallel run's parameters are split over both mesh axes, 'data' across the
    # processes (FSDP) and 'model' within each: gathered, they score as the reference's.
    from flaxformer_mini.runs.directory import RunDir

    def evaluation(name):
        (record,) = [r for r in RunDir(equivalence_runs / name).read_metrics() if "eval_loss" in r]
        return record

    got, ref = evaluation(TENSOR_PARALLEL), evaluation("reference")
    assert got["step"] == ref["step"] == STEPS
    assert sorted(got) == sorted(ref) and "eval_exact_match" in ref
    for key in ref:
        assert got[key] == pytest.approx(ref[key], abs=EQUIV_ATOL), key


def test_the_tensor_parallel_run_used_the_2d_mesh_over_both_processes(equivalence_runs):
    said = (equivalence_runs / "2x2_launch.stderr").read_text()
    assert f"{equivalence_runs / TENSOR_PARALLEL}: model: " in said
    assert "on 4 cpu device(s), mesh data=2,model=2, fsdp sharding" in said, said[-2000:]


@pytest.mark.parametrize("name", CONTINUED)
def test_a_checkpoint_continues_on_another_mesh_as_on_its_own(equivalence_runs, name):
    own, other = equivalence_runs / CONTINUED[name][-1], equivalence_runs / name
    assert int(final_state(own).step) == int(final_state(other).step) == 2 * STEPS
    ref, got = losses(own), losses(other)
    assert sorted(got) == list(range(1, 2 * STEPS + 1))
    worst = max(abs(ref[s] - got[s]) for s in range(STEPS + 1, 2 * STEPS + 1))
    assert worst <= EQUIV_ATOL, f"{name}: continued losses differ by {worst:.2e}"
    chex.assert_trees_all_close(final_state(other).params, final_state(own).params, atol=EQUIV_ATOL, rtol=0)


def test_only_process_0_writes_the_run_files(equivalence_runs):
    # Two processes, one metrics log with each step once (not two interleaved copies): the
    # reference's steps, copied with its checkpoint, then the 2-process continuation's.
    from flaxformer_mini.runs.directory import RunDir

    for name in (TENSOR_PARALLEL, "1_process_to_2_processes"):
        records = [r for r in RunDir(equivalence_runs / name).read_metrics() if "loss" in r]
        assert [r["step"] for r in records] == list(range(1, (2 if name in CONTINUED else 1) * STEPS + 1)), name


def test_max_tokens_and_accumulate_on_two_processes_of_two_devices_train_as_one_device(equivalence_runs):
    # --max-tokens batches keep the rows they have on one device (max_tokens // max(S, T): here
    # 7, which the 4 data-parallel groups do not divide, so the mesh fills them up with PAD rows),
    # and each of --accumulate's micro-batches (B, S) keeps its own shape, split along B across hosts.
    from flaxformer_mini.runs.run import Run

    one, two = equivalence_runs / TEXT_REFERENCE, equivalence_runs / TEXT_2X2
    reference = Run.open(one)
    assert (reference.config.max_tokens, reference.config.accumulate) == (TEXT_MAX_TOKENS, 2)
    rows = {len(b.source) for step in range(STEPS) for b in reference.train_batches(step)}
    assert any(r % 4 for r in rows), f"every batch already divisible by 4 ({rows}): nothing padded"
    assert reference.config.model.dropout > 0  # the dropout masks too must be the single device's
    said = (equivalence_runs / "2x2_launch.stderr").read_text()
    assert f"{two}: model: 31,101 float32 parameters, float32 compute, on 4 cpu device(s), mesh data=4, fsdp" in said, said[-2000:]
    # Every micro-batch's rows split over 'data' (filled up to a multiple of 4), not handed whole to
    # every device, each in the shape one device trains it in (not padded to its update's largest).
    shapes = re.findall(rf"{re.escape(str(two))}: micro-batch \((\d+), (\d+)\) laid out P\('data',\)", said)
    expected = [(-(-len(b.source) // 4) * 4, b.source.shape[1]) for step in range(STEPS)
                for b in reference.train_batches(step)]
    assert [(int(b), int(s)) for b, s in shapes] == expected, said[-2000:]
    ref, got = losses(one), losses(two)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    worst = max(abs(ref[s] - got[s]) for s in ref)
    assert worst <= EQUIV_ATOL, f"losses differ by {worst:.2e}"
    assert max_param_diff(final_state(one), reference.initial_state())[0] > 1000 * EQUIV_ATOL
    chex.assert_trees_all_close(final_state(two).params, final_state(one).params, atol=EQUIV_ATOL, rtol=0)


def test_only_process_0_checks_the_token_budget_before_the_tokenizers_are_agreed(tmp_path, monkeypatch):
    # Another process may hold a unigram tokenizer of its own until follow_main adopts process
    # 0's files; its lengths would then refuse or accept other pairs than the run trains on.
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.runs.run import Run
    files = {"train": str(write_corpus(tmp_path / "train.tsv", 20)), "valid": str(write_corpus(tmp_path / "valid.tsv", 3))}
    config = worker_config(dict(files, max_tokens=4, accumulate=1))
    with pytest.raises(ValueError, match="--max-tokens 4 is smaller than the longest example"):
        Run.create(tmp_path / "main", config)
    monkeypatch.setattr(distributed, "is_main", lambda: False)
    assert Run.create(tmp_path / "other", config).config.max_tokens == 4
    assert not (tmp_path / "main").exists() and not (tmp_path / "other").exists()


# ----------------------------------------------------------------------------- the CLI: a run's life

# The 2-process CLI run of the tests below, and the uninterrupted reference of the SIGTERM /
# kill -9 / resume story. 30 steps, checkpoints every 5: the story's signals land mid-run (a
# 2-process step takes 50-100 ms here, 300 ms on a loaded machine, and the test acts within
# one 50 ms poll of what it waits for, 5 or more steps before the run would end).
CLI_STEPS, SAVE_EVERY = 30, 5


def assert_bit_identical(a, b):
    assert int(a.step) == int(b.step)
    chex.assert_trees_all_equal((a.params, a.opt_state), (b.params, b.opt_state))  # structure and every bit


def two_process_command(out, port=None, plot=False):
    argv = train_cli(out, 2, port=port, plot=plot)
    return lambda i: argv(i) + ["--steps", str(CLI_STEPS), "--save-every", str(SAVE_EVERY)]


@pytest.fixture(scope="module")
def straight_two_process_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight2") / "run"
    results = finish(start_processes(two_process_command(out, plot=True), 2))  # its loss.png is looked at
    assert_all_ok(results)
    return out, results


def test_two_process_cli_run_writes_one_set_of_files_from_process_0(straight_two_process_run):
    out, results = straight_two_process_run
    (_, out0, err0), (_, out1, err1) = results
    # stdout is the result alone: gloo's "[Gloo] Rank 1 is connected ..." lines go to stderr
    assert len(out0.splitlines()) == 1 and json.loads(out0)["step"] == CLI_STEPS, out0
    assert out1 == "", "only process 0 prints the result"
    assert "parameters" in err0 and "parameters" not in err1
    # Process 1's own log says it joined (it holds more than jax's and gloo's lines).
    assert "process 1 of 2: 1 cpu device(s) of this host in the run, from step 0; process 0 writes" in err1, err1
    assert "process 0 of 2" not in err0
    assert (out / "config.json").exists() and (out / "loss.png").exists()
    from flaxformer_mini.runs.directory import RunDir

    assert [r["step"] for r in RunDir(out).read_metrics() if "loss" in r] == list(range(1, CLI_STEPS + 1))


def test_evaluate_and_generate_read_a_multiprocess_run_in_one_process(straight_two_process_run):
    out = straight_two_process_run[0]
    result = cli("evaluate", "--checkpoint", str(out), "--json")
    assert result.returncode == 0, result.stderr
    trained = json.loads(straight_two_process_run[1][0][1].strip().splitlines()[-1])
    assert abs(json.loads(result.stdout)["loss"] - trained["loss"]) <= 1e-5  # the same model, restored on 1 device
    gen = cli("generate", "--checkpoint", str(out), "5 3 6")
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.split() and set(gen.stdout.split()) <= set("0123456")


def test_sigterm_then_a_killed_process_then_a_damaged_checkpoint_then_resume_ends_bit_identical(straight_two_process_run, tmp_path):
    # Preemption, a lost host and a restart, as a scheduler would cause them; the same command
    # every time, as a user (or a job's restart policy) would run it.
    out, port = tmp_path / "run", free_port()
    command = two_process_command(out, port)

    # 1. SIGTERM to process 0 only, at its first logged step (before the first checkpoint, where
    #    issue #12's SIGTERM could be lost): both processes save the same step and exit like Ctrl-C.
    procs = start_processes(command, 2)
    metrics = out / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().strip(), procs, "a first logged step")
    procs[0].send_signal(signal.SIGTERM)
    results = finish(procs)
    for code, _, err in results:
        assert code == 130, err[-2000:]
    saved = saved_step_in(results[0][2])
    assert saved_step_in(results[1][2]) == saved  # each process's log says what was saved, not only process 0's
    assert checkpoint_steps(out)[-1] == saved < CLI_STEPS

    # 2. Resume; kill -9 process 1 mid-run: process 0 stops with an error within the heartbeat
    #    bound, never hangs, and the last checkpoint stays intact.
    procs = start_processes(command, 2)
    wait_for(lambda: checkpoint_steps(out)[-1] >= saved + SAVE_EVERY, procs, "a checkpoint after resuming")
    procs[1].kill()
    t0 = time.time()
    (code, _, err), _ = finish(procs, timeout=HEARTBEAT_S * 6 + 60)
    assert code == 1, err[-3000:]
    assert "lost contact with another process" in err, err[-3000:]
    # Noticed within --distributed-timeout (HEARTBEAT_S) of the kill, then ended at once; the
    # rest is room for a loaded machine, below finish's own timeout.
    assert time.time() - t0 < HEARTBEAT_S * 3
    # Process 0 ended at once (os._exit, no atexit handler) and still removed its process-id
    # lock; the killed process could not remove its own, which is left to this test.
    from flaxformer_mini.scale.host_guards import _slot_path

    assert not _slot_path(f"127.0.0.1:{port}", 0).exists()
    _slot_path(f"127.0.0.1:{port}", 1).unlink(missing_ok=True)
    kept = checkpoint_steps(out)[-1]
    assert saved + SAVE_EVERY <= kept < CLI_STEPS

    # 3. The newest checkpoint is then found damaged (its array files cut short, as a copy
    #    interrupted by a full disk leaves them). The same command on every process resumes from
    #    the one before, moves the damaged one aside, saves that step again on every process
    #    (each process's manager rereads the directory; otherwise process 1 would raise
    #    StepAlreadyExistsError there while process 0 waits) and ends bit-identical to the
    #    uninterrupted run.
    damage(out / "checkpoints" / str(kept))
    previous = checkpoint_steps(out)[-2]
    results = finish(start_processes(command, 2))
    assert_all_ok(results)
    assert f"checkpoint {kept} cannot be read" in results[0][2] and f"resuming {out} from step {previous}" in results[0][2]
    assert [p.name.split(".")[0] for p in (out / "damaged_checkpoints").iterdir()] == [str(kept)]
    assert_bit_identical(final_state(straight_two_process_run[0]), final_state(out))


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    from flaxformer_mini.collector import collecting_rarely

    with collecting_rarely():  # as a command runs: flaxformer_mini/collector.py
        _worker(json.loads(sys.argv[2]))
