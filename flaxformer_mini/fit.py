"""The training loop behind ``flaxformer-mini train``, and evaluation of a finished run.

Resuming is exact: batches come from (seed, step), dropout keys from (seed, step), and a
checkpoint holds the parameters and optimizer state bit for bit. So a run interrupted at
any moment (Ctrl-C, ``kill -9``) and started again with the same command ends with the same
parameters as a run that was never interrupted.

The loop reads each step's metrics one step late, so the host never waits for the device
except at logging, evaluation and checkpoint steps.
"""

import dataclasses
import math
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxformer_mini import checkpoint
from flaxformer_mini.data import PAD
from flaxformer_mini.decoding import decode, exact_match
from flaxformer_mini.model import Transformer
from flaxformer_mini.run import RunConfig, RunDir, load_data, save_vocabularies
from flaxformer_mini.sharding import STRATEGIES, make_mesh, shard_batch, shard_state
from flaxformer_mini.training import Trainer, check_batch

COMPUTE_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the run stopped and kept its last good checkpoint."""


def build_trainer(config: RunConfig):
    model = Transformer.from_config(config.model, dtype=COMPUTE_DTYPES[config.dtype], rngs=nnx.Rngs(config.train.seed))
    return Trainer(model, config.train)


def eval_batches(config: RunConfig, eval_data):
    if config.data.kind == "synthetic":
        n = max(1, math.ceil(config.data.eval_sequences / config.batch_size))
        return eval_data.eval_batches(config.train.seed, n, config.batch_size)
    return list(eval_data.iter_eval_batches(config.batch_size))


def evaluate(trainer, state, batches, with_exact_match=True, beam_size=1):
    """Teacher-forced loss and token accuracy, and exact-match accuracy of cached greedy
    decoding (or of the best beam, with ``beam_size`` > 1)."""
    result = trainer.evaluate(state, batches)
    if with_exact_match:
        model = trainer.model(state)
        hits = [exact_match(decode(model, b.source, b.target_out.shape[1], beam_size=beam_size), b.target_out)
                for b in batches]
        result["exact_match"] = float(np.concatenate(hits).mean())
    return result


class _Interrupt:
    """First Ctrl-C: finish the current step, save, stop. Second: stop at once."""

    def __init__(self):
        self.requested = False

    def __enter__(self):
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._previous)
        return False


def _finite(metrics, step):
    loss = float(metrics["loss"])
    if not math.isfinite(loss):
        raise NonFiniteLossError(f"loss is {loss} at step {step}")
    return loss


def fit(config: RunConfig, out, steps, *, log_every=50, eval_every=500, save_every=500, max_to_keep=3,
        progress=True, data=None, devices=1, sharding="replicated", echo=print):
    """Train ``config`` into the run directory ``out`` up to ``steps`` updates, resuming from
    its latest checkpoint if it has one. ``data`` is ``load_data(config.data, RunDir(out))``
    when the caller has it already. ``devices`` > 1 shards each batch over that many devices
    (``sharding``: 'replicated' parameters, or 'fsdp'). Returns the last evaluation's metrics."""
    from tqdm.auto import tqdm

    mesh = None
    if devices is None or devices > 1:
        mesh = make_mesh(devices)
        if config.batch_size % mesh.size:  # before anything is written
            raise ValueError(f"--batch-size {config.batch_size} is not divisible by {mesh.size} devices; "
                             f"use a multiple of {mesh.size}")
        if sharding not in STRATEGIES:
            raise ValueError(f"unknown --sharding {sharding!r}; choose one of {', '.join(STRATEGIES)}")
    run = RunDir(out)
    train_data, eval_data, vocabs = data if data is not None else load_data(config.data, run)
    run.start_or_resume(config)
    save_vocabularies(run, vocabs)

    trainer = build_trainer(config)
    state = trainer.init_state()
    manager = checkpoint.open_manager(run.checkpoints.absolute(), max_to_keep=max_to_keep)
    if manager.latest_step() is not None:
        state = checkpoint.restore(manager, state)
    if mesh is not None:
        state = shard_state(state, mesh, sharding)
    start = int(state.step)
    run.truncate_metrics(start)  # a killed run may have logged steps past its last checkpoint
    if start:
        echo(f"resuming {run.path} from step {start}")
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    n_dev = 1 if mesh is None else mesh.size
    echo(f"model: {n_params:,} parameters, {config.dtype}, on {n_dev} {jax.devices()[0].platform} device(s)"
         + (f", {sharding} sharding" if mesh is not None else ""))

    batches_eval = eval_batches(config, eval_data)
    last_eval = {}
    seed, bs = config.train.seed, config.batch_size
    bar = tqdm(total=steps, initial=start, desc="train", unit="step", disable=not progress, dynamic_ncols=True)
    pending = None  # (step number after the update, metrics, tokens/s or None) not yet read back
    tokens, t0 = 0, time.perf_counter()
    try:
        with _Interrupt() as interrupt:
            for step in range(start, steps):
                batch = train_data.batch(seed, step, bs)
                if mesh is None:
                    state, metrics = trainer.step(state, batch)
                else:  # check on the host, then split the rows over the devices
                    check_batch(batch, trainer.model_config)
                    state, metrics = trainer.train_step(state, shard_batch(batch, mesh))
                tokens += int(np.sum(batch.target_out != PAD))
                if pending is not None:
                    _read(pending, run, bar)
                done = step + 1
                rate = None
                if done % log_every == 0:  # target tokens per second since the last log line
                    now = time.perf_counter()
                    rate, tokens, t0 = tokens / max(now - t0, 1e-9), 0, now
                pending = (done, metrics, rate)
                bar.update(1)
                must_save = done % save_every == 0 or done == steps or interrupt.requested
                if done % eval_every == 0 or done == steps:
                    _finite(metrics, done)
                    last_eval = evaluate(trainer, state, batches_eval)
                    run.log({"step": done, **{f"eval_{k}": v for k, v in last_eval.items()}})
                    bar.set_postfix_str(f"eval loss {last_eval['loss']:.4g}, exact {last_eval['exact_match']:.3f}")
                if must_save:
                    _finite(metrics, done)  # never checkpoint a NaN state
                    checkpoint.save(manager, state)
                if interrupt.requested:
                    _read(pending, run, bar)
                    bar.close()
                    echo(f"interrupted: saved step {done}; run the same command to resume")
                    raise KeyboardInterrupt
            if pending is not None:
                _read(pending, run, bar)
    except NonFiniteLossError as e:
        bar.close()
        kept = manager.latest_step()
        raise NonFiniteLossError(
            f"{e}; stopped. The last good checkpoint (step {kept if kept is not None else 'none'}) is kept in "
            f"{run.checkpoints}. Try a lower --lr or --dtype float32."
        ) from None
    bar.close()
    if not last_eval and start >= steps:
        echo(f"{run.path} has already reached step {start} (asked for {steps}); evaluating")
        last_eval = evaluate(trainer, state, batches_eval)
    plot_metrics(run)
    return last_eval


def _read(pending, run, bar):
    step, metrics, rate = pending
    metrics = jax.device_get(metrics)
    loss = _finite(metrics, step)
    if rate is not None:
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}, "tokens_per_s": rate}
        run.log(record)
        bar.set_postfix(loss=f"{loss:.4g}", tok_s=f"{rate:,.0f}")


def plot_metrics(run: RunDir):
    """Draw the training and evaluation curves of ``run`` into ``loss.png``."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    records = run.read_metrics()
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    if not train and not evals:
        return None
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    if train:
        ax_loss.plot(*zip(*train), label="train loss", lw=1)
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="eval loss")
        ax_acc.plot([r["step"] for r in evals], [r["eval_token_accuracy"] for r in evals], "o-", label="token accuracy")
        if "eval_exact_match" in evals[0]:
            ax_acc.plot([r["step"] for r in evals], [r["eval_exact_match"] for r in evals], "s-", label="exact match")
    ax_loss.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="loss")
    ax_acc.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02), title="held-out accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(str(run.path))
    fig.tight_layout()
    fig.savefig(run.plot_path, dpi=100)
    plt.close(fig)
    return run.plot_path


def load_run(out):
    """(run config, trainer, state restored from the latest checkpoint) of the run in ``out``."""
    run = RunDir(out)
    config = run.load_config()
    trainer = build_trainer(config)
    manager = checkpoint.open_manager(run.checkpoints.absolute())
    if manager.latest_step() is None:
        raise FileNotFoundError(f"{run.path}: the run has no checkpoint yet")
    return config, trainer, checkpoint.restore(manager, trainer.init_state())


def evaluate_run(out, batch_size=None, with_exact_match=True, beam_size=1):
    """Evaluate the latest checkpoint of the run in ``out`` on its held-out data."""
    config, trainer, state = load_run(out)
    if batch_size:
        config = dataclasses.replace(config, batch_size=batch_size)
    _, eval_data, _ = load_data(config.data, RunDir(out))
    result = evaluate(trainer, state, eval_batches(config, eval_data), with_exact_match, beam_size)
    return {"step": int(state.step), **result}

