"""How the train step's cost grows: time, peak memory and compile time against sequence
length, batch size and depth, for Flax (``jax.jit``) and torch (eager, ``torch.compile``).

``python -m benchmarks.scaling [--sweeps length batch depth] [--json OUT] [--plot OUT.png]``

Each point is one model and batch, built fresh; its paths are timed side by side
(``benchmarks.measure``: median of ``--reps`` interleaved calls after a first, compiling
call). Reported per point and path: median step time, peak resident memory above the
pre-call level during one step (activations and temporaries), and the first call's excess
over the median (tracing and compiling; for Flax also XLA's compile time alone).

Paths (``--paths``): torch eager and ``torch.compile``; Flax with per-layer blocks
(``flax_jit``), with scanned layers (``flax_jit_scan``: one ``nnx.scan`` over stacked blocks,
so XLA compiles one block whatever the depth) and scanned with rematerialisation
(``flax_jit_scan_remat``: activations recomputed in the backward pass; not run unless named,
e.g. ``--sweeps length --values 256 1024 --paths flax_jit_scan flax_jit_scan_remat``). Flax
rows also give XLA's temporary-buffer size (``xla_temp_mb``), the memory remat trades for time.
``--values`` replaces one sweep's points (``--sweeps depth --values 2 6 12 24``).

Sweeps (the base model's width, D=512, 8 heads, unless ``--width``):

    length  S = T in 64 .. 1024 at batch 4, 6 + 6 layers
    batch   B in 4 .. 32 at length 64, 6 + 6 layers
    depth   2 .. 24 layers on each side at batch 16, length 64: step time and compile time

``--quick``: the tests' tiny model, two points per sweep, one repetition, torch.compile's
"eager" backend (tracing only): a smoke test of seconds, not a measurement.
"""

import argparse
import os
import sys
import textwrap

from benchmarks.stopping import exit_interrupted, stop_on_signals, stopping_while_importing

NOTHING_MEASURED = "no point had been measured: nothing written"

# The presets' import of JAX and flax takes seconds: a Ctrl-C then is one line too.
with stopping_while_importing(__name__, f"interrupted: {NOTHING_MEASURED}"):
    from benchmarks import code_version, machine, one_at_a_time
    from benchmarks.__main__ import write_json
    from benchmarks.outputs import output_problem
    from benchmarks.inputs import make_batch
    from benchmarks.measure import log, measure
    from benchmarks.presets import get_bench_preset
    from flaxformer_mini.malloc_tunables import restart_keeping_freed_memory

SWEEPS = {
    "length": dict(axis="seq_len", values=(64, 128, 256, 512, 1024), fixed=dict(batch=4, num_layers=6)),
    "batch": dict(axis="batch", values=(4, 8, 16, 32), fixed=dict(seq_len=64, num_layers=6)),
    "depth": dict(axis="num_layers", values=(2, 6, 12, 24), fixed=dict(batch=16, seq_len=64)),
}
QUICK = {
    "length": dict(axis="seq_len", values=(4, 8), fixed=dict(batch=2, num_layers=1)),
    "batch": dict(axis="batch", values=(1, 2), fixed=dict(seq_len=4, num_layers=1)),
    "depth": dict(axis="num_layers", values=(1, 2), fixed=dict(batch=2, seq_len=4)),
}
VARIANTS = ("torch_eager", "torch_compile", "flax_jit", "flax_jit_scan", "flax_jit_scan_remat")
# The Flax paths: the model's layer layout of each (flaxformer_mini/model/scanned.py).
FLAX_VARIANTS = {
    "flax_jit": dict(scan_layers=False, remat=False),
    "flax_jit_scan": dict(scan_layers=True, remat=False),  # one block body compiled, whatever the depth
    "flax_jit_scan_remat": dict(scan_layers=True, remat=True),  # activations recomputed in the backward pass
}
# Without --paths: all but remat, which is for long sequences (--sweeps length --paths
# flax_jit_scan flax_jit_scan_remat), not for the depth and batch sweeps.
DEFAULT_PATHS = tuple(v for v in VARIANTS if v != "flax_jit_scan_remat")


def point_preset(base, width, backend, seq_len, batch, num_layers):
    """The benchmark preset of one point: ``base``'s model at this depth, length and batch."""
    model = base.model.replace(num_layers=num_layers, max_len=max(base.model.max_len, seq_len))
    if width is not None:
        model = model.replace(embed_size=width)
    return base.replace(name=f"{base.name}-L{num_layers}-B{batch}-S{seq_len}", model=model, batch=batch,
                        seq_len=seq_len, new_tokens=min(base.new_tokens, model.max_len),
                        torch_compile_backend=backend or base.torch_compile_backend)


def measure_point(preset, variants, reps):
    """[row per path] of one point: step time, memory and compile time."""
    from benchmarks import flax_bench

    batch = make_batch(preset)
    paths = []
    torch_variants = [v for v in variants if v not in FLAX_VARIANTS]
    if torch_variants:
        from benchmarks import torch_bench

        torch_bench.setup_threads()
        paths += torch_bench.make_paths(preset, batch, ["train_step"], torch_variants)
    for v in (v for v in FLAX_VARIANTS if v in variants):
        paths += flax_bench.make_paths(preset.replace(**FLAX_VARIANTS[v]), batch, ["train_step"])
    rows = []
    for r in measure(paths, reps=reps, warmup=0):
        m = r.memory
        xla_memory = r.info.get("xla_memory_mb")
        rows.append({
            "variant": r.variant, "median_ms": r.median_s * 1e3, "times_ms": [t * 1e3 for t in r.times_s],
            "gflops_per_s": r.gflops_per_s,
            "peak_mb": m.get("peak_rss_delta_mb", m.get("peak_device_delta_mb")),
            "first_call_overhead_s": r.first_call_overhead_s, "xla_compile_s": r.info.get("xla_compile_s"),
            "trace_lower_s": r.info.get("trace_lower_s"),
            # XLA's own count of the step's temporary buffers (activations kept for the backward
            # pass among them): what remat shrinks, independent of the allocator's RSS.
            "xla_temp_mb": xla_memory.get("temporaries") if isinstance(xla_memory, dict) else None,
        })
    return rows


def base_preset(quick):
    return get_bench_preset("tiny" if quick else "base")


def run(sweeps, quick=False, width=None, variants=DEFAULT_PATHS, reps=3, values=None, progress=None):
    """``values``: the swept axis's values in place of the sweep's own (one sweep).
    ``progress(report)``, if given, gets the report so far (``"complete": False``) after each
    point: a sweep cut short keeps the points it measured."""
    base = base_preset(quick)
    table = QUICK if quick else SWEEPS
    if values:
        table = {name: dict(table[name], values=tuple(values)) for name in sweeps}
    # When, on what and with which code: a report read later says where its numbers hold.
    out = {"date_utc": machine.date_utc(),
           "machine": machine.describe(), "code": code_version.code_version(), "quick": quick,
           "reps": 1 if quick else reps, "points": [],
           "sweeps": {name: table[name] for name in sweeps}, "complete": False}
    seen = set()  # the shapes measured so far: a later point of the same shapes reuses their compiles
    for name in sweeps:
        sweep = table[name]
        for value in sweep["values"]:
            dims = dict(sweep["fixed"], **{sweep["axis"]: value})
            preset = point_preset(base, width, "eager" if quick else None, **dims)
            log(f"scaling {name}: {preset.summary()}")
            key = tuple(sorted(dims.items()))
            for row in measure_point(preset, variants, 1 if quick else reps):
                out["points"].append({"sweep": name, **dims, "embed_size": preset.model.embed_size, **row,
                                      "compiled_earlier": key in seen})
            seen.add(key)
            if progress is not None:
                progress(dict(out, points=list(out["points"])))
    out["complete"] = True
    return out


def markdown(rep):
    """One table per sweep: a row per point, time / memory / compile per path."""
    lines = []
    for name, sweep in rep["sweeps"].items():
        points = [p for p in rep["points"] if p["sweep"] == name]
        if not points:
            continue
        axis = sweep["axis"]
        variants = [v for v in VARIANTS if any(p["variant"] == v for p in points)]
        lines += [f"{name} ({', '.join(f'{k}={v}' for k, v in sweep['fixed'].items())}): "
                  "step ms / peak MB / first-call overhead s", "",
                  f"| {axis} | " + " | ".join(variants) + " | torch eager / flax_jit |",
                  "| ---: | " + " | ".join("---:" for _ in variants) + " | ---: |"]
        reused = False
        mark = lambda p: "*" if p.get("compiled_earlier") else ""  # noqa: E731
        for value in sorted({p[axis] for p in points}):
            row = {p["variant"]: p for p in points if p[axis] == value}
            cells = [f"{row[v]['median_ms']:.0f} / {row[v]['peak_mb'] or 0:.0f} / "
                     f"{row[v]['first_call_overhead_s']:.1f}{mark(row[v])}" if v in row else "-" for v in variants]
            reused = reused or any(mark(p) for p in row.values())
            ratio = (row["torch_eager"]["median_ms"] / row["flax_jit"]["median_ms"]
                     if {"torch_eager", "flax_jit"} <= set(row) else None)
            lines.append(f"| {value} | " + " | ".join(cells) + f" | {'-' if ratio is None else f'{ratio:.2f}x'} |")
        if reused:
            lines.append("\n\\* the shapes of an earlier point: compiled there, so this overhead holds no compile")
        lines.append("")
    return "\n".join(lines)


def title(rep):
    """The plot's heading: the machine, then when and on which commit (as train_parity's plot),
    and for --quick that its numbers are no measurement."""
    lines = [machine.one_line(rep["machine"]), f"{rep['date_utc']}, {code_version.describe(rep['code'])}"]
    if rep.get("quick"):
        lines.append("--quick: a smoke test (tiny model, one step per point), not a measurement")
    return "\n".join(lines)


def plot_problem(path):
    """Why matplotlib cannot write ``path`` (None if it can): its extension names the format."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    extension = os.path.splitext(path)[1].lstrip(".").lower()
    if extension in formats:
        return None
    return (f"--plot {path}: matplotlib cannot write {f'.{extension}' if extension else 'a file without an extension'}; "
            f"the extension names the format: one of {', '.join(f'.{e}' for e in sorted(formats))}")


def plot(rep, path):
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    sweeps = list(rep["sweeps"])
    hollow = []  # the columns with points drawn hollow
    width = max(4.5 * len(sweeps), 9.0)  # room for the title's lines
    fig, axes = plt.subplots(2, len(sweeps), figsize=(width, 7), squeeze=False)
    for col, name in enumerate(sweeps):
        axis = rep["sweeps"][name]["axis"]
        for v in VARIANTS:
            pts = sorted((p[axis], p) for p in rep["points"] if p["sweep"] == name and p["variant"] == v)
            if not pts:
                continue
            xs = [x for x, _ in pts]
            line, = axes[0][col].plot(xs, [p["median_ms"] for _, p in pts], marker="o", label=v)
            if name == "depth":
                # A point of an earlier point's shapes compiled nothing: its overhead is no compile
                # time, so it is drawn hollow, off the curve.
                fresh = [(x, p) for x, p in pts if not p.get("compiled_earlier")]
                reused = [(x, p) for x, p in pts if p.get("compiled_earlier")]
                axes[1][col].plot([x for x, _ in fresh], [p["first_call_overhead_s"] for _, p in fresh],
                                  marker="o", color=line.get_color(), label=v)
                if reused:
                    hollow.append(col)
                    axes[1][col].plot([x for x, _ in reused], [p["first_call_overhead_s"] for _, p in reused],
                                      linestyle="none", marker="o", markerfacecolor="none", color=line.get_color())
            else:
                axes[1][col].plot(xs, [p["peak_mb"] or 0 for _, p in pts], marker="o", label=v)
        axes[0][col].set(title=f"train step vs {axis}", xlabel=axis, ylabel="ms", xscale="log", yscale="log")
        axes[1][col].set(xlabel=axis, xscale="log",
                         ylabel="first-call overhead (compile) s" if name == "depth" else "peak MB above baseline")
        axes[0][col].legend(fontsize=8)
        if col in hollow:
            axes[1][col].plot([], [], linestyle="none", marker="o", markerfacecolor="none", color="grey",
                              label="hollow: shapes compiled at an earlier point (no compile)")
            axes[1][col].legend(fontsize=8)
    # About 15 characters an inch at 9 points: longer lines are wrapped, not cut off at the edges.
    fig.suptitle("\n".join(textwrap.fill(line, int(15 * width)) for line in title(rep).split("\n")), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweeps", nargs="+", choices=sorted(SWEEPS), default=list(SWEEPS))
    parser.add_argument("--paths", nargs="+", choices=VARIANTS, default=list(DEFAULT_PATHS),
                        help=f"default: {' '.join(DEFAULT_PATHS)}")
    parser.add_argument("--values", nargs="+", type=int, metavar="N",
                        help="the swept axis's values instead of the sweep's own (one sweep only)")
    parser.add_argument("--reps", type=int, help="timed steps per point and path (median; default 3)")
    parser.add_argument("--width", type=int, help="model width D instead of the base model's 512")
    parser.add_argument("--quick", action="store_true", help="tiny smoke test (seconds), not a measurement")
    parser.add_argument("--json", metavar="OUT", help="write every point as JSON")
    parser.add_argument("--plot", metavar="OUT", help="write a plot; its format follows the extension (.png, .svg, .pdf)")
    args = parser.parse_args(argv)
    if args.values and len(args.sweeps) != 1:
        parser.error("--values goes with one --sweeps name")
    if args.values and min(args.values) < 1:
        parser.error(f"--values must be >= 1, got {min(args.values)}")
    if args.reps is not None and args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    if args.quick and args.reps is not None:
        parser.error("--quick times one step per point: leave --reps out")
    if args.width is not None:
        heads = base_preset(args.quick).model.heads
        if args.width < 1 or args.width % heads:
            parser.error(f"--width must be a positive multiple of the {'tiny' if args.quick else 'base'} model's "
                         f"{heads} heads (each head takes width / heads), got {args.width}")
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path and (problem := output_problem(path, option)):
            parser.error(problem)  # before the sweep, not after it
    if args.plot and (problem := plot_problem(args.plot)):
        parser.error(problem)
    return args


def main(argv=None):
    command = argv is None
    if command:
        stop_on_signals()  # before the options' checks: --plot's check imports matplotlib
    args, measured = None, []

    def progress(rep):
        if args.json:  # after each point, as python -m benchmarks after each operation
            write_json(rep, args.json)
        measured.append(rep)

    try:
        args = parse_args(argv)
        if command:  # as python -m benchmarks: restart once under glibc's malloc tunables, one run at a time
            restart_keeping_freed_memory()
            one_at_a_time.hold_the_machine_or_exit("python -m benchmarks.scaling")
        rep = run(args.sweeps, quick=args.quick, width=args.width, variants=args.paths, reps=args.reps or 3,
                  values=args.values, progress=progress)
    except KeyboardInterrupt:
        if not measured:
            kept = NOTHING_MEASURED
        elif args.json:
            kept = f"{args.json} holds the {len(measured)} point(s) measured before it (\"complete\": false)"
        else:
            kept = f"{len(measured)} point(s) had been measured; no --json given, nothing written"
        return exit_interrupted(f"interrupted: {kept}", command=command)
    print(f"{machine.one_line(rep['machine'])}; {rep['date_utc']}")
    print(f"code: {code_version.describe(rep['code'])}")
    if rep["quick"]:
        print("--quick: a smoke test of the sweep (tiny model, one step per point), not a measurement")
    print(markdown(rep))
    if args.json:
        write_json(rep, args.json)
    if args.plot:
        plot(rep, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
