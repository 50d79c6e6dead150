"""What the Flax train step's time depends on: variants timed side by side in one process.

``python -m tools.ablations [--preset base] [--reps 7] [--variants default no_dropout ...]``
(``--preset large --scan-layers`` on a GPU, where each variant compiles for most of a minute)

Timings of the same path differ by 10-20% from one process to the next on this machine
(the train step allocates ~650 MB of fresh temporaries per call, see docs/benchmarks.md),
so comparing variants across separate runs can mislead. Here every variant is built and
compiled in one process and timed interleaved, like the paths of the main benchmark:

    default        the benchmark's path: dropout 0.1, threefry keys (JAX's default)
    no_dropout     the same model built with dropout 0.0: the cost of dropout
    rbg_dropout    dropout 0.1 with keys of the 'rbg' implementation (XLA's RngBitGenerator)
                   instead of threefry: jax_default_prng_impl='rbg' while the model and
                   its step are built and compiled
    no_clipping    TrainConfig(clip_norm=None): the cost of the global-norm clipping
    nnx_linear     the model built with plain nnx.Linear layers, which multiply the (B, T, D)
                   input as it is, instead of flaxformer_mini's Linear, which flattens it to
                   (B*T, D) first (primitives.Linear: the kernel gradient's layout copies)
    layer_norm_recomputed  each LayerNorm recomputed in the backward pass (``nnx.remat``
                   around ``primitives.normalize``, prevent_cse=False as scanned.apply
                   under scan) instead of its float32 intermediates kept: three float32
                   (B, T, D) arrays per LayerNorm, which a scanned model also copies into
                   and out of (L, B, T, D) stacks (docs/benchmarks.md, "GPU")
    layer_norm_recomputed_cse  the same with prevent_cse=True (jax.checkpoint's default:
                   optimisation barriers keep XLA from merging the recomputation back)
    scan_x4        four train steps per compiled call (``lax.scan`` over the Trainer's step
                   function): XLA allocates its temporaries once per call, so this shows
                   what the per-call allocation (page faults) costs; time per step
    eval_forward_x3  three times the eval forward: what a train step would cost at the
                   forward pass's efficiency (backward = 2 forwards)

Nothing in flaxformer_mini changes; the variants are configurations of it.
"""

import argparse
import contextlib
import statistics
import sys

import jax
from flax import nnx

from benchmarks import flax_bench, flops, one_at_a_time
from benchmarks.__main__ import preset_from_args
from benchmarks.inputs import make_batch
from benchmarks.measure import Path, measure
from benchmarks.presets import PRESETS
from benchmarks.runner import check_device
from flaxformer_mini.model import layers
from flaxformer_mini.model import primitives
from flaxformer_mini.model.attention import ATTENTION_IMPLS
from flaxformer_mini.data import Batch
from flaxformer_mini.malloc_tunables import restart_keeping_freed_memory
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.step import train_step
from flaxformer_mini.train.trainer import Trainer
from tools import where_and_what


@contextlib.contextmanager
def prng_impl(name):
    old = jax.config.jax_default_prng_impl
    jax.config.update("jax_default_prng_impl", name)
    try:
        yield
    finally:
        jax.config.update("jax_default_prng_impl", old)


@contextlib.contextmanager
def plain_nnx_linear():
    """Models built inside use nnx.Linear where flaxformer_mini uses its own Linear."""
    old = primitives.Linear
    primitives.Linear = nnx.Linear
    try:
        yield
    finally:
        primitives.Linear = old


@contextlib.contextmanager
def layer_norms_recomputed(prevent_cse):
    """Models traced inside recompute each LayerNorm in the backward pass. A variant of the
    experiment only: inside ``nnx.remat`` a LayerNorm is traced as a copy, so parity's
    recording of intermediates would lose its rows, and graph-mode nnx.remat refuses a model
    closed over by a plain JAX transform."""
    old = layers.normalize
    layers.normalize = nnx.remat(primitives.normalize, prevent_cse=prevent_cse)
    try:
        yield
    finally:
        layers.normalize = old


def _train_variant(name, preset, jbatch, impl="threefry2x32", linear=contextlib.nullcontext,
                   traced=contextlib.nullcontext, **train_config):
    """A train-step Path whose model, state and executable are all made under ``impl``;
    ``linear`` holds while the model is built, ``traced`` while its step is traced too."""
    c, B, L = preset.model, preset.batch, preset.seq_len
    with prng_impl(impl), linear():
        trainer = Trainer(flax_bench._new_model(preset, 0),
                          TrainConfig(schedule="constant", learning_rate=1e-4, **train_config))
        holder = {"state": trainer.init_state()}
    compiled = {}

    def prepare():
        with prng_impl(impl), traced():
            if traced is not contextlib.nullcontext:
                # Its step has the default's function, structure and shapes: without this,
                # JAX's trace cache hands either one the other's program.
                jax.clear_caches()
            compiled["step"] = trainer.train_step.lower(holder["state"], jbatch).compile()
            if traced is not contextlib.nullcontext:
                jax.clear_caches()
        memory = compiled["step"].memory_analysis()  # None where the backend gives none
        if memory is not None:
            path.info["xla_temp_mb"] = memory.temp_size_in_bytes / 2**20

    def run():
        holder["state"], metrics = compiled["step"](holder["state"], jbatch)
        return jax.block_until_ready((holder["state"], metrics))

    path = Path("train_step", name, "jax", run, flops.train_step(c, B, L, L), prepare=prepare)
    return path


def _scan_variant(preset, jbatch, steps=4):
    """``steps`` train steps in one compiled call: ``lax.scan`` with ``training.train_step``
    (the function the Trainer jits) as its body."""
    c, B, L = preset.model, preset.batch, preset.seq_len
    trainer = Trainer(flax_bench._new_model(preset, 0), TrainConfig(schedule="constant", learning_rate=1e-4))
    holder = {"state": trainer.init_state()}
    batches = jax.tree.map(lambda x: jax.numpy.stack([x] * steps), jbatch)

    def many(state, batches):
        return jax.lax.scan(train_step, state, batches)

    jitted = jax.jit(many, donate_argnums=0)
    compiled = {}

    def prepare():
        compiled["steps"] = jitted.lower(holder["state"], batches).compile()

    def run():
        holder["state"], metrics = compiled["steps"](holder["state"], batches)
        return jax.block_until_ready((holder["state"], metrics))

    return Path("train_step", f"scan_x{steps}", "jax", run, flops.train_step(c, B, L, L) * steps, prepare=prepare,
                info={"steps_per_call": steps})


def _forward_x3(preset, jbatch):
    (path,) = flax_bench.make_paths(preset, Batch(*jbatch), ["forward"])
    inner = path.run

    def run():
        for _ in range(3):
            out = inner()
        return out

    return Path("train_step", "eval_forward_x3", "jax", run, path.flops * 3, prepare=path.prepare)


VARIANTS = ("default", "no_dropout", "rbg_dropout", "no_clipping", "nnx_linear", "layer_norm_recomputed",
            "layer_norm_recomputed_cse", "scan_x4", "eval_forward_x3")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.ablations", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", choices=sorted(PRESETS))
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="which variants, timed in this order (default: all; 'default' is the one the others "
                             "are compared with, and always runs first)")
    parser.add_argument("--scan-layers", action="store_true", default=None, help="every variant with its layers "
                        "scanned, as python -m benchmarks --scan-layers")
    parser.add_argument("--attention", dest="attention_impl", choices=ATTENTION_IMPLS,
                        help="the Flax attention (default: the preset's)")
    parser.add_argument("--force", action="store_true", help="run a GPU preset without a GPU")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    restart_keeping_freed_memory()  # as python -m benchmarks does: the process restarts once with GLIBC_TUNABLES
    if argv is None:  # a command, not a test's call: one timing run per host at a time
        one_at_a_time.hold_the_machine_or_exit(parser.prog)
    preset = preset_from_args(args)  # the preset with --scan-layers and --attention, as python -m benchmarks
    # Before the large preset's model is built on a CPU for minutes (and after the restart:
    # on a GPU this starts the backend, which would start again in the restarted process).
    check_device(preset, args.force)
    jbatch = Batch(*(jax.numpy.asarray(x) for x in make_batch(preset)))
    no_dropout = preset.replace(model=preset.model.replace(dropout=0.0))
    make = {
        "default": lambda: _train_variant("default", preset, jbatch),
        "no_dropout": lambda: _train_variant("no_dropout", no_dropout, jbatch),
        "rbg_dropout": lambda: _train_variant("rbg_dropout", preset, jbatch, impl="rbg"),
        "no_clipping": lambda: _train_variant("no_clipping", preset, jbatch, clip_norm=None),
        "nnx_linear": lambda: _train_variant("nnx_linear", preset, jbatch, linear=plain_nnx_linear),
        "layer_norm_recomputed": lambda: _train_variant("layer_norm_recomputed", preset, jbatch,
                                                        traced=lambda: layer_norms_recomputed(False)),
        "layer_norm_recomputed_cse": lambda: _train_variant("layer_norm_recomputed_cse", preset, jbatch,
                                                            traced=lambda: layer_norms_recomputed(True)),
        "scan_x4": lambda: _scan_variant(preset, jbatch),
        "eval_forward_x3": lambda: _forward_x3(preset, jbatch),
    }
    paths = [make[v]() for v in ["default"] + [v for v in args.variants if v != "default"]]
    results = measure(paths, reps=args.reps, warmup=1)
    base = statistics.median(results[0].times_s)
    print(f"{preset.summary()}; {args.reps} interleaved repetitions, one process")
    print(where_and_what())
    print("times per train step (a scan_xK call does K steps); sys ms: kernel time per step, mostly page faults; "
          "temp MB: the compiled step's temporaries (XLA's memory analysis)")
    print(f"{'variant':<26} {'median ms':>10} {'best ms':>9} {'vs default':>11} {'sys ms':>7} {'temp MB':>8}")
    for r in results:
        k = r.info.get("steps_per_call", 1)
        temp = f"{r.info['xla_temp_mb']:.0f}" if "xla_temp_mb" in r.info else "-"
        print(f"{r.variant:<26} {r.median_s * 1e3 / k:>10.1f} {r.best_s * 1e3 / k:>9.1f} {r.median_s / k / base:>10.2f}x "
              f"{r.info['system_ms_per_call'] / k:>7.0f} {temp:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
