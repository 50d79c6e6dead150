"""What a train step costs to launch: back-to-back steps with and without traced token checks.

``python -m tools.dispatch [--preset small] [--batch 16] [--length 10] [--reps 7]``

A training loop calls the jitted step many times without waiting for each result, so a small
model's step time includes JAX's per-call dispatch. A jitted function whose jaxpr carries an
effect (here the ``ErrorEffect`` of a ``checkify.debug_check``, which XLA compiles away)
leaves JAX's C++ fast path for Python dispatch on every call. Until the traced check became
opt-in (``fm.traced_checks``), every train, eval and decoding step carried it.

Both variants are ``training.train_step`` under ``jax.jit`` with the state donated, as the
``Trainer`` builds it, each jitted from its own function (jax.jit shares its trace cache
between jits of one function). Each repetition times 20 steps back to back per variant,
interleaved, in one process; the table gives ms per step.
"""

import argparse
import contextlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import flaxformer_mini as fm
from benchmarks import one_at_a_time
from flaxformer_mini.data import Batch
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.step import train_step
from flaxformer_mini.train.trainer import Trainer
from tools import where_and_what

STEPS_PER_REP = 20


def _batch(config, batch, length, seed=0):
    rng = np.random.default_rng(seed)
    source = rng.integers(3, config.source_vocab_size, (batch, length), dtype=np.int32)
    target = rng.integers(3, config.target_vocab_size, (batch, length + 1), dtype=np.int32)
    return Batch(jnp.asarray(source), jnp.asarray(target[:, :-1]), jnp.asarray(target[:, 1:]))


def _variant(config, batch, token_checks):
    """(jitted step, state, the step's jaxpr effects) with the first call (the compile) done."""
    trainer = Trainer(fm.Transformer.from_config(config, rngs=nnx.Rngs(0)),
                      TrainConfig(schedule="constant", learning_rate=1e-4))
    step = jax.jit(lambda state, batch: train_step(state, batch), donate_argnums=0)
    state = trainer.init_state()
    with fm.traced_checks() if token_checks else contextlib.nullcontext():
        effects = step.trace(state, batch).jaxpr.effects
        state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    return step, state, effects


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.dispatch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", choices=sorted(fm.PRESETS))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    config = fm.get_preset(args.preset)
    for option, value in (("--batch", args.batch), ("--reps", args.reps)):
        if value < 1:
            parser.error(f"{option} must be >= 1, got {value}")
    # The positional table has max_len rows: a longer sequence is refused by the model, after a build.
    if not 1 <= args.length <= config.max_len:
        parser.error(f"--length must be between 1 and the {args.preset} preset's max_len={config.max_len}, "
                     f"got {args.length}")
    if argv is None:  # a command, not a test's call: one timing run per host at a time
        one_at_a_time.hold_the_machine_or_exit(parser.prog)
    batch = _batch(config, args.batch, args.length)
    variants = {name: list(_variant(config, batch, checks)) for name, checks in (("plain", False), ("token_checks", True))}
    times = {name: [] for name in variants}
    for _ in range(args.reps):
        for name, v in variants.items():
            step, state, _ = v
            start = time.perf_counter()
            for _ in range(STEPS_PER_REP):
                state, metrics = step(state, batch)
            jax.block_until_ready((state, metrics))
            times[name].append((time.perf_counter() - start) / STEPS_PER_REP)
            v[1] = state
    print(f"preset {args.preset}, batch {args.batch}x{args.length}; {args.reps} repetitions of "
          f"{STEPS_PER_REP} back-to-back steps, interleaved, one process")
    print(where_and_what())
    print(f"{'variant':<14} {'median ms':>10} {'best ms':>8}  jaxpr effects")
    for name, ts in times.items():
        print(f"{name:<14} {statistics.median(ts) * 1e3:>10.2f} {min(ts) * 1e3:>8.2f}  "
              f"{sorted(type(e).__name__ for e in variants[name][2]) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
