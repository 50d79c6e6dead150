"""The training loop behind ``flaxformer-mini train``.

Resuming is exact: batches come from (seed, step), dropout keys from (seed, step), and a
checkpoint holds the parameters and optimizer state bit for bit. So a run interrupted at
any moment (Ctrl-C, SIGTERM, ``kill -9``) and started again with the same command ends with
the same parameters as a run that was never interrupted.

The loop reads each step's metrics one step late, so the host never waits for the device
except at logging, evaluation and checkpoint steps.
"""

import contextlib
import json
import math
import sys
import time

import jax
import numpy as np

from flaxformer_mini.data import PAD
from flaxformer_mini.decode.evaluation import evaluate
from flaxformer_mini.runs.config import RunConfigError
from flaxformer_mini.runs.plot import plot_metrics
from flaxformer_mini.runs.run import Run
from flaxformer_mini.runs.selection import Selection
from flaxformer_mini.runs.step_rate import StepRate, progress_bar
from flaxformer_mini.runs.tensorboard import open_writer
from flaxformer_mini.scale import distributed
from flaxformer_mini.scale.partitioning import format_mesh
from flaxformer_mini.scale.sharding import pad_to_data_groups, process_local_rows, shard_batch, shard_state, to_local
from flaxformer_mini.train import checkpoint
from flaxformer_mini.train.errors import NonFiniteLossError
from flaxformer_mini.train.step import check_batch
from flaxformer_mini.train.stop import StopNow, Stopped, StopRequests


def fit(run: Run, steps, *, log_every=50, eval_every=500, save_every=500, max_to_keep=3, progress=True,
        mesh=None, sharding="replicated", echo=print, stop=None, plot=True, patience=None):
    """Train ``run`` up to ``steps`` updates, resuming from its latest checkpoint if it has
    one. With a ``mesh`` (``sharding.training_mesh``) each batch is split over its 'data'
    axis and the state laid out by ``sharding`` ('replicated' or 'fsdp'; tensor parallel too
    on a mesh with a 'model' axis: ``partitioning.LOGICAL_AXIS_RULES``). Returns the last
    evaluation's metrics and its ``step`` (``steps``, or the run's own step where it had gone
    past them). Closes ``run`` (its lock) when done.

    ``stop``: a ``StopRequests`` installed by the caller (``train`` installs it before the
    runtime starts, so an early SIGTERM is remembered); without one, fit installs its own.
    A stop request raises ``Stopped`` (a KeyboardInterrupt) once the current step is saved
    (before the first step: at once, nothing new to save), on every process at the same step.

    ``plot``: draw ``loss.png`` from the metrics at the end (process 0); False leaves it out
    (sweeps, CI: matplotlib's import and a first drawing cost about a second of CPU).

    A run with a best metric (``run.config.evaluation.best_metric``) saves the state of each
    evaluation better than every earlier one in ``OUT/best`` (``runs/selection.py``); with
    ``patience`` N it stops after N evaluations in a row that were no better (the result then
    says ``"stopped_early": true``), and run again it stops there at once."""
    try:
        with contextlib.nullcontext(stop) if stop is not None else StopRequests() as stop:
            return _fit(run, steps, log_every, eval_every, save_every, max_to_keep, progress, mesh, sharding, echo,
                        stop, plot, patience)
    finally:
        run.close()


def _fit(run, steps, log_every, eval_every, save_every, max_to_keep, progress, mesh, sharding, echo, stop, plot,
         patience):
    evaluation = run.config.evaluation
    if patience is not None and evaluation.best_metric is None:  # a run written before --best-metric existed
        raise RunConfigError(f"patience {patience}: the run in {run.path} has no best metric to count evaluations by")
    manager = run.checkpoints(max_to_keep)
    # Restored straight into the mesh's layout (whatever mesh the checkpoint was saved under).
    state = run.restore_or_init(manager, echo=echo, place=None if mesh is None else lambda s: shard_state(s, mesh, sharding))
    start = int(state.step)
    # Scale-out: process 0 alone writes the run's files and shows the bar; every process
    # trains, evaluates and takes part in orbax's saves and restores.
    main = distributed.is_main()
    progress = progress and main
    if main:
        run.dir.truncate_metrics(start, echo=echo)  # a killed run may have logged steps past its last checkpoint
    if start:
        echo(f"resuming {run.path} from step {start}")
    echo(describe_model(state.params, run.config.dtype, mesh, sharding))
    run_devices = None if mesh is None else tuple(mesh.devices.flat)  # the stop votes' (any_process_later)
    if not main:  # a host's own log says it joined; process 0's says the rest
        local = jax.local_device_count() if mesh is None else len(mesh.local_devices)
        print(f"process {distributed.process_index()} of {jax.process_count()}: {local} "
              f"{jax.devices()[0].platform} device(s) of this host in the run, from step {start}; process 0 writes "
              f"the run's files and logs its metrics", file=sys.stderr, flush=True)

    trainer, eval_batches = run.trainer, run.eval_batches(limit=run.config.data.eval_pairs)
    if run.describe_evaluation():
        echo(run.describe_evaluation())
    selection, logged_at_start = _evaluation_history(run, start)
    log = _StepLog(run, steps, start, log_every, progress, write=main)
    evaluations = _Evaluations(run, trainer, eval_batches, selection, log, run_devices, echo)
    if selection is not None:
        evaluations.check_best_held(state, start)
    last_eval, evaluated_at = {}, None
    # A signal that came while the runtime started, the run was restored or (on another
    # process) anything before this point: every process agrees, and stops before its first step.
    before_first_step = (" before the first step: nothing new to save"
                         + (f" (the run stays at step {start})" if start else ""))
    if distributed.any_process(stop.requested, run_devices):
        _interrupted(stop, log, echo, before_first_step)
    # The evaluation at the restored step was stopped by the stop request that saved it: done now,
    # as a run never stopped did it, before the next step.
    if start and start < steps and start % eval_every == 0 and not logged_at_start:
        echo(f"evaluating step {start}, whose evaluation the stop request had cut short")
        result = evaluations.at(start, state, stop=lambda: stop.requested)
        if result is None:
            _interrupted(stop, log, echo, before_first_step)
        last_eval, evaluated_at = result, start
    # Early means before --steps: a run whose patience ran out at its last evaluation finished.
    stopped_early = selection is not None and start < steps and selection.exhausted(patience)
    if stopped_early:
        echo(f"{run.path} stopped early at step {start}: {_no_better(selection, patience, run.dir.best)}"
             + ("" if last_eval else "; evaluating"))
    vote = None  # the previous step boundary's all-reduce of the stop flag
    place = None if mesh is None else lambda b: shard_batch(process_local_rows(b, mesh), mesh)
    try:
        for step in range(start, steps if not stopped_early else start):
            tokens = [0]  # the update's target tokens, counted as its micro-batches are drawn
            micro = _prepared(run.train_batches(step), trainer.model_config, mesh, place, tokens)
            if run.config.accumulate == 1:
                state, metrics = trainer.train_step(state, next(micro))
            else:
                # --accumulate K: one update from K micro-batches, each in its own shape, split over
                # 'data' as a lone batch is, drawn one at a time. A stop request is voted on between
                # them, as at step boundaries, so every process abandons the update at the same one.
                update = trainer.accumulate(state, micro, stop=_votes(stop, run_devices))
                if update is None:
                    _stop_mid_update(stop, manager, state, step, log, echo)
                state, metrics = update
            done = step + 1
            log.push(done, metrics, tokens[0])
            if done % eval_every == 0 or done == steps:
                log.flush()  # also checks the loss is finite
                # Each process evaluates alone; a stop request ends the evaluation between batches,
                # and the run stops here, saved, its metrics unlogged: run again, it evaluates this
                # step first, so its log, best checkpoint and patience are a run never stopped's. Not
                # the last step's: the run is finished then, its result is that evaluation, and a
                # second signal still stops the process at once.
                until = None if done == steps else (lambda: stop.requested)
                result = evaluations.at(done, state, stop=until)
                if result is None:
                    log.flush()
                    checkpoint.save(manager, state)
                    _interrupted(stop, log, echo, f": saved step {done}",
                                 note=f"the evaluation at step {done} was stopped; the resumed run does it first")
                last_eval, evaluated_at = result, done
                stopped_early = selection is not None and done < steps and selection.exhausted(patience)
            # Every process must save the same step: a SIGTERM seen by one stops all. Each boundary
            # queues an all-reduce of the stop flag and reads the previous boundary's, which the
            # devices have finished by now (the host waits only where logging already waited):
            # a signal stops the run one step after the boundary that saw it. The flag is read,
            # never written back: a signal handled after it was read would be erased (a SIGTERM
            # lost); it counts at the next boundary.
            stopping = vote is not None and vote()
            vote = distributed.any_process_later(stop.requested, run_devices)
            if done % save_every == 0 or done == steps or stopping or stopped_early:
                log.flush()  # never checkpoint a NaN state; the saved step's metrics are on disk first
                checkpoint.save(manager, state)
            if stopped_early:  # saved: run again, the run stops here at once
                echo(f"stopping early at step {done}: {_no_better(selection, patience, run.dir.best)}")
                break
            if stopping and done < steps:  # a signal at the last step: the run is finished anyway
                _interrupted(stop, log, echo, f": saved step {done}")
        log.flush()
    except StopNow:
        # A second Ctrl-C: the CLI then ends the process without Python's shutdown, which would
        # have flushed the TensorBoard events (tensorboardX writes them every 30 s otherwise).
        log.close()
        raise
    except NonFiniteLossError as e:
        log.close()
        kept = manager.latest_step()
        where = (f"The last good checkpoint (step {kept}) is kept in {run.dir.checkpoints}" if kept is not None
                 else "No checkpoint had been saved yet")
        remedy = "a lower --lr" + (" or --dtype float32" if run.config.dtype != "float32" else "")
        raise NonFiniteLossError(f"{e}; stopped. {where}. Try {remedy}.") from None
    except BaseException:  # any other error: the bar, and its listener of JAX's compilations, end here
        log.close()
        raise
    log.close()
    if not last_eval and (start >= steps or stopped_early):
        if not stopped_early:
            echo(f"{run.path} has already reached step {start} (asked for {steps}); evaluating")
        last_eval, evaluated_at = evaluations.again(state), start
    if main and plot:
        plot_metrics(run.dir)
    result = {"step": steps if evaluated_at is None else evaluated_at, **last_eval}
    if selection is not None:
        result.update(selection.summary())
        if patience is not None:
            result["stopped_early"] = stopped_early
    return result


def _no_better(selection, patience, best_dir):
    return (f"no better {selection.metric} in {patience} evaluation(s) since step {selection.best_step}'s "
            f"{selection.best_value:.6g} (its checkpoint: {best_dir})")


def _evaluation_history(run, start):
    """``(selection, logged)`` from the evaluations metrics.jsonl logs up to ``start`` (cut there
    on resume): the best-metric ``Selection`` replayed (None without a best metric), and whether
    the evaluation at ``start`` is logged. Process 0 reads the file; every process takes its
    reading, so all of them decide alike from here on (best saves are collective)."""
    metric = run.config.evaluation.best_metric
    payload = b""
    if distributed.is_main():
        records = [r for r in run.dir.read_metrics() if isinstance(r.get("step"), int) and r["step"] <= start]
        selection = Selection.replay(metric, records, start) if metric is not None else None
        logged = any(r["step"] == start and "eval_loss" in r for r in records)
        payload = json.dumps({"selection": selection and selection.to_json(), "logged": logged}).encode()
    if distributed.is_multiprocess():
        payload = distributed.allgather_bytes(payload)[0]
    history = json.loads(payload)
    selection = history["selection"] and Selection.from_json(history["selection"])
    return selection or None, history["logged"]


class _Evaluations:
    """The evaluations during training: each scored (with the run's --eval-beam-size), logged,
    and with a best metric compared with the best so far, its state saved to OUT/best when better."""

    def __init__(self, run, trainer, eval_batches, selection, log, run_devices, echo):
        self.run, self.trainer, self.batches, self.selection = run, trainer, eval_batches, selection
        self.log, self.devices, self.echo = log, run_devices, echo
        e = run.config.evaluation
        # Scored as text (BLEU, chrF, WER, CER): the first eval_decode_lines examples.
        self.scoring = dict(codec=run.codec, decode_lines=run.config.data.eval_decode_lines, beam_size=e.beam_size,
                            alpha=e.length_penalty)
        self.best = run.best_checkpoints() if selection is not None else None

    def again(self, state):
        """The evaluation of a step already evaluated (a finished or stopped-early run): its result alone."""
        return evaluate(self.trainer, evaluation_state(state), self.batches, **self.scoring)

    def at(self, step, state, stop=None):
        """Evaluate ``state`` at ``step``: its metrics, or None when a stop request on any process
        ended it (every process agrees: the best checkpoint's saves are collective)."""
        result = evaluate(self.trainer, evaluation_state(state), self.batches, stop=stop, **self.scoring)
        if distributed.any_process(result is None, self.devices):
            return None
        self.log.eval(step, result)
        if self.selection is not None:
            value = self.selection.value_of(result)
            # Decided alike on every process (one vote), whatever each one's last bits.
            improved = distributed.any_process(self.selection.better(value), self.devices)
            if self.selection.observe(step, value, improved):
                self.save_best(state, step)
        return result

    def save_best(self, state, step):
        """``state`` as the one checkpoint in OUT/best. A step it already holds, or a later one (a
        killed run's, replayed since), is deleted first: orbax keeps the newest step."""
        for held in sorted(self.best.all_steps()):
            if held >= step:
                self.best.delete(held)
        checkpoint.save(self.best, state)

    def check_best_held(self, state, start):
        """On resume: OUT/best should hold the best step of the evaluations replayed, or a later
        one that a killed run saved past the restored step (the resumed run evaluates it again).
        Saved again when it is the restored step itself; said when it is gone."""
        best = self.selection.best_step
        held = self.best.all_steps()
        if best is None or best in held or any(step > start for step in held):
            return
        if best == start:
            self.save_best(state, start)
            return
        self.echo(f"warning: {self.run.dir.best} does not hold step {best}, the best evaluation so far "
                  f"({self.selection.metric} {self.selection.best_value:.6g}); the next better evaluation's state "
                  f"is saved there")


def _prepared(batches, model_config, mesh, place, tokens):
    """Each micro-batch checked on the host (before any sharding), its target tokens added to
    ``tokens[0]``, its rows padded to the mesh's data-parallel groups (--max-tokens batches)
    and placed on the devices."""
    for batch in batches:
        check_batch(batch, model_config)
        tokens[0] += int(np.sum(batch.target_out != PAD))
        if mesh is not None:
            batch = pad_to_data_groups(batch, mesh)
        yield batch if place is None else place(batch)


def _votes(stop, devices):
    """A function every process calls at the same points: True on every process once any
    process's stop request has been voted on, one call after the call that saw it (each call
    queues an all-reduce and reads the previous one's, as the step boundaries do)."""
    pending = None

    def stopping():
        nonlocal pending
        agreed = pending is not None and pending()
        pending = distributed.any_process_later(stop.requested, devices)
        return agreed

    return stopping


def _stop_mid_update(stop, manager, state, step, log, echo):
    """A stop voted between an update's micro-batches: its sums are dropped, and ``state``,
    the last complete update's, is saved where no checkpoint holds that step yet."""
    log.flush()
    if manager.latest_step() != step:
        checkpoint.save(manager, state)
    _interrupted(stop, log, echo, f" during update {step + 1}'s micro-batches: saved step {step}")


def _interrupted(stop, log, echo, where, note=None):
    """End a run stopped by a stop request: the log closed, ``note`` and then what was kept
    (``where``) said, after which the stop watcher says nothing (``StopRequests.settled``), and
    ``Stopped`` raised with that message."""
    log.close()
    stop.settled()
    if note is not None:
        echo(note)
    message = f"interrupted{where}; run the same command to resume"
    echo(message)
    raise Stopped(message)


def describe_model(params, dtype, mesh=None, sharding="replicated"):
    """The run's start line: its parameters' count and dtype, the compute dtype (parameters
    stay float32 whatever --dtype computes in: docs/design.md, Numerics), and the devices. The mesh
    is said here, not stored in config.json: a run may resume under another mesh (checkpoints
    hold whole arrays; orbax restores them into the new mesh's layout)."""
    leaves = jax.tree.leaves(params)
    n_params, param_dtypes = sum(x.size for x in leaves), "/".join(sorted({str(x.dtype) for x in leaves}))
    return (f"model: {n_params:,} {param_dtypes} parameters, {dtype} compute, on {1 if mesh is None else mesh.size} "
            f"{jax.devices()[0].platform} device(s)"
            + (f", mesh {format_mesh(mesh)}, {sharding} sharding" if mesh is not None else ""))


def evaluation_state(state):
    """What evaluation reads of ``state`` (its parameters, or with --ema their moving average:
    ``TrainState.for_inference``, through ``trainer.evaluate`` and ``state.model()``), on this
    process's own device(s). The optimizer state is left out: with FSDP, gathering it too (Adam's
    two moments) moved and held three times the bytes on one device of every host, for nothing."""
    return to_local(state.for_inference())


class _StepLog:
    """The metrics log and the progress bar. Each step's metrics are read back one step late
    (``push``), so logging never makes the host wait for the device. The logged tokens/s counts
    only the steps during which nothing compiled (``StepRate.step_done``), as the bar's rate does:
    a compilation's seconds say nothing of the steps that follow it."""

    def __init__(self, run, steps, start, log_every, progress, write=True, clock=time.perf_counter):
        self.run, self.log_every, self.steps, self.write = run, log_every, steps, write
        self.rate = StepRate(clock)  # the bar's rate and ETA and the logged tokens/s, compilations left out
        if progress or write:
            self.rate.watch_compilations()
        self.bar = progress_bar(self.rate, total=steps, initial=start, desc="train", unit="step",
                                disable=not progress, dynamic_ncols=True)
        self.pending = None  # (step, metrics, tokens/s, logged) not yet read back
        self.tokens, self.seconds = 0, 0.0  # of the steps since the last line that compiled nothing
        self.events = None  # TensorBoard writer, opened at the first logged line (tensorboardX loads then)

    def push(self, step, metrics, tokens):
        self.flush()
        seconds = self.rate.step_done()
        if seconds is not None:
            self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds
        # Every log_every steps and at the run's last step, so a run shorter than log_every (or
        # not a multiple of it) still logs its final loss. An interrupted run logs no extra line,
        # so resumed its log equals an uninterrupted run's; a run continued to a larger --steps
        # keeps the line of the end it had reached.
        logged = step % self.log_every == 0 or step == self.steps
        rate = None
        if logged:
            # A window whose every step compiled has no rate to log: its line leaves tokens_per_s out.
            rate = self.tokens / self.seconds if self.seconds > 0 else None
            self.tokens, self.seconds = 0, 0.0
        self.pending = (step, metrics, rate, logged)
        self.bar.update(1)

    def flush(self):
        if self.pending is None:
            return
        step, metrics, rate, logged = self.pending
        self.pending = None
        metrics = jax.device_get(metrics)
        loss = float(metrics["loss"])
        if not math.isfinite(loss):
            raise NonFiniteLossError(f"loss is {loss} at step {step}")
        if logged and self.write:
            record = {k: float(v) for k, v in metrics.items()}
            if rate is not None:
                record["tokens_per_s"] = rate
            self.run.dir.log({"step": step, **record})
            self._scalars(step, {f"train/{k}": v for k, v in record.items()})
            self.bar.set_postfix(loss=f"{loss:.4g}", **({} if rate is None else {"tok_s": f"{rate:,.0f}"}))

    def eval(self, step, result):
        if self.write:
            self.run.dir.log({"step": step, **{f"eval_{k}": v for k, v in result.items()}})
            self._scalars(step, {f"eval/{k}": v for k, v in result.items()})
        self.bar.set_postfix_str(f"eval loss {result['loss']:.4g}, exact {result['exact_match']:.3f}"
                                 + (f", BLEU {result['bleu']:.1f}" if "bleu" in result else ""))

    def _scalars(self, step, values):
        """The same values into OUT/tensorboard/ (``tensorboard --logdir runs/``). A resumed run
        writes a new event file; steps it replays after its checkpoint appear twice there
        (metrics.jsonl, truncated on resume, holds each step once)."""
        if self.events is None:
            self.events = open_writer(self.run.dir.tensorboard)
        self.events.scalars(step, values)

    def close(self):
        self.rate.stop_watching()
        self.bar.close()
        if self.events is not None:
            self.events.close()
            self.events = None
