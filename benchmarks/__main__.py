"""``python -m benchmarks [--preset base] [--json OUT]``: see the package docstring."""

import argparse
import json
import os
import sys

import benchmarks
from benchmarks.outputs import output_problem
from benchmarks.stopping import exit_interrupted, stop_on_signals, stopping_while_importing

NOTHING_FINISHED = "no operation had finished: nothing written"

# The presets' import of JAX and flax takes seconds: a Ctrl-C then is one line too.
with stopping_while_importing(__name__, f"interrupted: {NOTHING_FINISHED}"):
    from benchmarks import one_at_a_time
    from benchmarks.presets import PRESETS, get_bench_preset
    from benchmarks.runner import DEFAULT_OPS, OPS, VARIANTS
    from flaxformer_mini.model.attention import ATTENTION_IMPLS
    from flaxformer_mini.malloc_tunables import restart_keeping_freed_memory


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=benchmarks.__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", choices=sorted(PRESETS), help="benchmark settings (default: base)")
    parser.add_argument("--json", metavar="OUT", help="also write the full report as JSON to OUT")
    parser.add_argument("--reps", type=int, help="timed repetitions of forward and train step (preset default)")
    parser.add_argument("--decode-reps", type=int, help="timed repetitions of each decoding path (preset default)")
    parser.add_argument("--warmup", type=int,
                        help="untimed calls after the first one of forward and train step (preset default); "
                             "decoding keeps the preset's own (decode_warmup)")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(DEFAULT_OPS),
                        help=f"operations to time (default: {' '.join(DEFAULT_OPS)})")
    parser.add_argument("--paths", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="paths to time (default: all)")
    parser.add_argument("--dropout", type=float, help="override the model's dropout rate (both twins)")
    parser.add_argument("--attention", dest="attention_impl", choices=ATTENTION_IMPLS,
                        help="the Flax path's attention (default: the preset's; einsum on CPU, cudnn for large)")
    parser.add_argument("--scan-layers", action="store_true", default=None,
                        help="the Flax path with its layers stacked and run by nnx.scan (flax_jit_scan): XLA compiles "
                             "one block whatever the depth")
    parser.add_argument("--remat", action="store_true", default=None,
                        help="the Flax path recomputing activations in the backward pass (flax_jit_remat)")
    parser.add_argument("--torch-compile-backend", help="torch.compile backend (default: inductor, torch's default)")
    parser.add_argument("--reuse-compile-cache", action="store_true",
                        help="let torch.compile reuse its on-disk cache from earlier runs (default: a fresh one)")
    parser.add_argument("--force", action="store_true",
                        help="run a GPU preset, or --attention cudnn, without a GPU")
    args = parser.parse_args(argv)
    if args.json and (problem := output_problem(args.json)):
        parser.error(problem)  # before minutes of timing, not after them
    try:
        args.bench_preset = preset_from_args(args)  # --reps 0 and the like: refused here, by name
    except ValueError as e:
        parser.error(str(e))
    if problem := torch_compile_backend_problem(args) or gpu_attention_problem(args):
        parser.error(problem)
    return args


def torch_compile_backends():
    """(every backend name torch.compile accepts, the ones to suggest: its non-debug ones and
    eager). torch is imported here, not at the module's import, as a Flax-only run needs none."""
    import torch._dynamo

    every = {*torch._dynamo.list_backends(exclude_tags=()), "inductor"}
    return every, sorted({*torch._dynamo.list_backends(), "inductor", "eager"})


def torch_compile_backend_problem(args):
    """Why ``--torch-compile-backend`` cannot run (None if it can, or no torch_compile path runs)."""
    backend = args.torch_compile_backend
    if backend is None or "torch_compile" not in args.paths:
        return None
    every, suggested = torch_compile_backends()
    if backend in every:
        return None
    return (f"--torch-compile-backend {backend}: torch.compile has no such backend; choose one of "
            f"{', '.join(suggested)} (torch._dynamo.list_backends())")


def gpu_attention_problem(args):
    """Why the Flax path's cuDNN attention cannot run here (None if it can): on a CPU preset,
    asked for by --attention, with no GPU for JAX and no --force. A GPU preset's own cudnn is
    the device check's (runner.check_device), after the GPU's memory is shared out."""
    if args.attention_impl != "cudnn" or args.force or "flax_jit" not in args.paths:
        return None
    if args.bench_preset.device == "gpu":
        return None
    import jax

    backend = jax.default_backend()
    if backend == "gpu":
        return None
    return f"--attention cudnn: cuDNN's attention needs a GPU and JAX sees none ({backend}); --force runs it anyway"


def preset_from_args(args):
    """``args.preset`` with the options given (those left None keep the preset's). The tools'
    commands (tools/xla_profile.py, tools/ablations.py) use it too, with those options of
    these names that they have."""
    preset = get_bench_preset(args.preset)
    changes = {k: getattr(args, k, None) for k in ("reps", "decode_reps", "warmup", "torch_compile_backend",
                                                       "attention_impl", "scan_layers", "remat")}
    changes = {k: v for k, v in changes.items() if v is not None}
    if getattr(args, "dropout", None) is not None:
        changes["model"] = preset.model.replace(dropout=args.dropout)
    return preset.replace(**changes) if changes else preset


def main(argv=None):
    command = argv is None
    if command:
        stop_on_signals()  # before parse_args: its import of torch._dynamo takes seconds
    args, finished = None, []  # --json is written after each operation too, see below
    try:
        args = parse_args(argv)
        if command:
            # As `flaxformer-mini train --keep-freed-memory` does: the process restarts once with
            # glibc's malloc tunables set, or the base train step page-faults its temporaries in
            # on every call. Process-wide, so the torch paths run under it too;
            # FLAXFORMER_MINI_KEEP_FREED_MEMORY=0 turns it off. (Not when called as a function:
            # it would replace the caller's process.)
            restart_keeping_freed_memory()
            # (a command only: the suite's workers call main() side by side)
            one_at_a_time.hold_the_machine_or_exit("python -m benchmarks")
        rep = _run(args, finished)
    except KeyboardInterrupt:
        if not finished:
            kept = NOTHING_FINISHED
        elif args.json:
            kept = f"{args.json} holds the operations finished before it"
        else:
            kept = f"{len(finished)} operation(s) had finished; no --json given, nothing written"
        return exit_interrupted(f"interrupted: {kept}", command=command)
    from benchmarks import earlier_runs, report

    print(report.format_table(rep))
    earlier = earlier_runs.format_lines(rep)  # this CPU's committed runs, where it has any
    if earlier:
        print("\n" + "\n".join(earlier))
    if args.json:
        write_json(rep, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _run(args, finished):
    """The benchmark of ``args``, each operation's report appended to ``finished`` as it ends:
    --json is written then too ("complete": false), so a run stopped midway keeps what it
    measured; the last write is the whole report."""
    from benchmarks import runner

    def progress(rep):
        if args.json:
            write_json(rep, args.json)
        finished.append(rep)

    # runner.run removes its inductor cache directory on the way out, Ctrl-C included.
    return runner.run(args.bench_preset, ops=args.ops, variants=args.paths, force=args.force,
                      fresh_caches=not args.reuse_compile_cache, progress=progress)


def write_json(rep, path):
    """``rep`` to ``path`` whole or not at all: written beside it, then renamed over it (the
    partial file removed if either fails)."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(rep, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise


if __name__ == "__main__":
    sys.exit(main())
