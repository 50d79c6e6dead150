"""What the Flax train step's time depends on: variants timed side by side, by name.

``python -m tools.ablations [--preset base] [--reps 7] [--variants default no_dropout ...]
[--json OUT] [--budget-s S]`` (``--list``: every variant and what it measures;
``--preset large --scan-layers`` on a GPU: ``bash tools/gpu_items.sh decide`` runs it)

Timings of the same path differ by 10-20% from one process to the next on a shared CPU (the
train step allocates ~650 MB of fresh temporaries per call, see docs/benchmarks.md), so
comparing variants across separate runs can mislead. The variants are timed in groups, each
group in one process, its variants built and compiled there and timed interleaved with
``default``, like the paths of the main benchmark:

- ``main``: every variant that can share a process with ``default``;
- ``batch`` (the larger batches) and ``unscanned``, each with ``default`` beside it: their
  memory, or their compile's minutes on a GPU, stay out of ``main``;
- one process per XLA flag variant: ``default`` with that flag added to ``XLA_FLAGS``, which
  XLA reads once, when its backend starts (and aborts on a flag it does not know: that
  process alone ends). Its ratio is to ``main``'s ``default``, another process: said so.

This process only starts them, one after the other, and merges what they write: each gets the
whole device (JAX's GPU client takes 75% of the GPU's memory for itself when it starts, so a
process holding the ``main`` variants would leave a child a quarter), and with JAX's persistent
compilation cache set (``JAX_COMPILATION_CACHE_DIR``), a child's ``default`` is compiled once
in the whole run. ``tools/ablation_variants.py`` holds the variants.

Each variant reports its time per step, its share of the matmul peak measured once in the run
(``benchmarks/matmul_peak.py`` in ``main``'s process, in the preset's dtype: bfloat16 on the
large preset; the model's FLOPs as ``benchmarks/flops.py`` counts them, recomputation not
counted), XLA's memory analysis of its program, and the device's peak memory
(``device.memory_stats()``'s peak after the variant's first call: its process's peak so far,
not resettable, so within a group it can only rise; "n/a" where the backend reports none, as
on CPU).

``--budget-s S``: no variant starts after S seconds (a lent GPU's minutes); one not started
is listed as not run, with the reason, and so is a group stopped at the budget. A variant that
fails (a compile refused, memory exhausted) is listed with its error and the others run on.
``--json`` is written after each group, so a run cut short keeps what it measured.

Nothing in flaxformer_mini changes; the variants are configurations of it.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks import matmul_peak, one_at_a_time
from benchmarks.__main__ import preset_from_args, write_json
from benchmarks.outputs import output_problem
from benchmarks.measure import log, measure
from benchmarks.presets import PRESETS
from flaxformer_mini.malloc_tunables import (
    ENV_SWITCH,
    keeping_freed_memory,
    restart_keeping_freed_memory,
)
from flaxformer_mini.model.attention import ATTENTION_IMPLS
from tools import where_and_what
from tools.ablation_variants import VARIANTS

MAIN = "main"  # the group of the variants that share default's process
# A group needs JAX's start and at least one compile: with less of the budget left it is not
# started (the large scanned step's compile took 50-70 s on an H100 without a cache).
MIN_GROUP_S = 30
# After its budget a group may still finish the compile under way and time what it compiled.
GRACE_S = 90
# Lines of a group's output kept in the JSON (all of them go to this process's log).
TAIL_LINES = 30
# What a variant's record holds, measured or not (None where it has no value).
RECORD_KEYS = ("name", "what", "status", "reason", "process", "xla_flags", "batch", "steps_per_call",
               "median_ms", "best_ms", "times_ms", "vs_default", "default_median_ms", "gflop_per_step",
               "tflops_per_s", "fraction_of_peak", "first_call_s", "xla_temp_mb", "xla_peak_estimate_mb",
               "device_peak_mb")
STATUSES = ("measured", "skipped", "failed", "not_run", "timed_out")
# JAX's own memory handling for the groups: this process sets it off for itself (below).
PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"


def _record(name, **values):
    rec = dict.fromkeys(RECORD_KEYS)
    rec.update(name=name, what=VARIANTS[name].what, xla_flags=VARIANTS[name].xla_flags or None, **values)
    return rec


def device_peak_mb():
    """The process's peak device memory so far (MB), or "n/a" where the backend reports none."""
    import jax

    stats = jax.devices()[0].memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return "n/a"
    return stats["peak_bytes_in_use"] / 2**20


def _first_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _budget_reason(budget_s):
    return f"the run's budget (--budget-s {budget_s:g}) was spent before it started"


# --- one group, in its own process (--group) -------------------------------------------------

def time_group(names, preset, jbatch, reps, records, deadline=None, budget_s=None):
    """Build, compile (first call) and time ``names`` interleaved in this process; fill their
    ``records``. No compile starts after ``deadline`` (time.monotonic(); ``budget_s``: the
    seconds its group was given); a variant that fails is recorded and the others go on."""
    paths = {}
    for name in names:
        if deadline is not None and time.monotonic() > deadline:
            records[name].update(status="not_run", reason=f"the run's budget was spent before it started (its "
                                                          f"group was given {budget_s:.0f} s of it)")
            continue
        log(f"{name}: build and first call (compiles) ...")
        start = time.perf_counter()
        try:
            path = VARIANTS[name].build(preset, jbatch)
            path.prepare()
            path.run()
        except Exception as e:  # noqa: BLE001 - one variant's failure must not lose the others' figures
            records[name].update(status="failed", reason=_first_line(e))
            log(f"{name}: failed: {records[name]['reason']}")
            continue
        first = time.perf_counter() - start
        path.prepare = None  # compiled: measure()'s first call is then a warm-up call
        records[name].update(first_call_s=first, device_peak_mb=device_peak_mb())
        log(f"{name}: first call {first:.2f} s")
        paths[name] = path
    if not paths:
        return
    results = measure(list(paths.values()), reps=reps, warmup=0)
    for name, result in zip(paths, results):
        k = result.info.get("steps_per_call", 1)
        records[name].update(
            status="measured", batch=result.info.get("batch"), steps_per_call=k,
            median_ms=result.median_s * 1e3 / k, best_ms=result.best_s * 1e3 / k,
            times_ms=[t * 1e3 / k for t in result.times_s], gflop_per_step=result.flops / k / 1e9,
            xla_temp_mb=result.info.get("xla_temp_mb"), xla_peak_estimate_mb=result.info.get("xla_peak_estimate_mb"))


def run_group(args):
    """``--group``: the variants asked for, all in this process; the JSON for the parent."""
    import jax

    from benchmarks.inputs import make_batch
    from flaxformer_mini.data import Batch

    deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    preset = preset_from_args(args)
    names = list(dict.fromkeys(args.variants))
    records = {name: _record(name) for name in names}
    out = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "matmul_peak": None,
           "variants": []}
    if args.measure_peak:  # once per run, before the compiles: every group is compared with it
        out["matmul_peak"] = {k: v for k, v in matmul_peak.jax_peak(preset.matmul_size, preset.dtype).items()
                              if k != "sizes"}
    jbatch = Batch(*(jax.numpy.asarray(x) for x in make_batch(preset)))
    time_group(names, preset, jbatch, args.reps, records, deadline, args.budget_s)
    out["variants"] = [records[name] for name in names]
    write_json(out, args.json)
    return 0


# --- the run: every group in a child, one after the other -----------------------------------

def _group_env(xla_flags, preallocate):
    env = dict(os.environ)
    # The user's setting of JAX's preallocation, not this process's own (off, see main()).
    env.pop(PREALLOCATE, None)
    if preallocate is not None:
        env[PREALLOCATE] = preallocate
    if xla_flags:
        env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS"), xla_flags]))
    if not keeping_freed_memory():
        env[ENV_SWITCH] = "0"  # the group allocates as this process does (no malloc tunables)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run_process(label, argv, env, timeout):
    """(exit code, or None if it ran past ``timeout`` and was stopped; its last lines;
    seconds): its output goes to this process's log as it comes, each line marked ``label``."""
    tail = collections.deque(maxlen=TAIL_LINES)
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def pump():
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            print(f"  [{label}] {line}", end="", file=sys.stderr, flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    except KeyboardInterrupt:  # the group ends with the run, not on its own after it
        proc.kill()
        proc.wait()
        raise
    reader.join(timeout=10)
    return code, list(tail), time.monotonic() - start


def _group_argv(preset, args, variants, json_path, budget_s, measure_peak):
    argv = [sys.executable, "-m", "tools.ablations", "--group", "--preset", preset.name, "--reps", str(args.reps),
            "--attention", preset.attention_impl, "--json", json_path, "--variants", *variants]
    if preset.scan_layers:
        argv.append("--scan-layers")
    if args.force:
        argv.append("--force")
    if budget_s is not None:
        argv += ["--budget-s", f"{budget_s:.0f}"]
    if measure_peak:
        argv.append("--measure-peak")
    return argv


def _merge(group, names, flags, child, code, tail, left, records, main_default):
    """The group's records (``child``: its JSON, or None) into ``records``: a flag's group
    timed ``default`` under that flag, which is the variant, compared with ``main``'s default."""
    theirs = {r["name"]: r for r in child["variants"]} if child else {}
    own_default = theirs.get("default", {}).get("median_ms")
    for name in names:
        got = theirs.get("default" if flags else name)
        if got is not None and got["status"] is not None:
            records[name].update({k: got[k] for k in RECORD_KEYS if k not in ("name", "what", "xla_flags")},
                                 process=group)
            if got["status"] == "measured":
                base = main_default if flags else own_default
                records[name].update(default_median_ms=base, vs_default=got["median_ms"] / base if base else None)
        elif code is None:
            records[name].update(status="timed_out", process=group,
                                 reason=f"its group ran past {left + GRACE_S:.0f} s (the run's budget and "
                                        f"{GRACE_S} s to finish) and was stopped")
        else:
            unknown = next((line for line in tail if "Unknown flag" in line), None)
            reason = (f"XLA refused the flag: {unknown.split('] ', 1)[-1]}" if unknown
                      else f"its group's process exited with code {code}: {tail[-1] if tail else 'no output'}")
            records[name].update(status="failed", process=group, reason=reason[:300])


def run_groups(groups, preset, args, records, deadline, report, preallocate, save):
    """Each group in a process of its own, in order, while the budget lasts."""
    for group, names in groups.items():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < MIN_GROUP_S:
            for name in names:
                records[name].update(status="not_run", process=group, reason=_budget_reason(args.budget_s)
                                     + f" (a group needs at least {MIN_GROUP_S} s)")
            continue
        flags = VARIANTS[names[0]].xla_flags
        asked = ["default"] if flags else list(dict.fromkeys(["default", *names]))  # a flag's variant is default
        with tempfile.TemporaryDirectory(prefix="ablations-") as tmp:
            out = os.path.join(tmp, "group.json")
            log(f"group {group}: {' '.join(asked)}" + (f", XLA_FLAGS {flags}" if flags else "")
                + ("" if left is None else f"; budget {left:.0f} s"))
            argv = _group_argv(preset, args, asked, out, left, measure_peak=group == MAIN)
            code, tail, wall = _run_process(group, argv, _group_env(flags, preallocate),
                                            None if left is None else left + GRACE_S)
            child = None
            if os.path.exists(out):
                with open(out) as f:
                    child = json.load(f)
        report["groups"].append({"group": group, "variants": names, "xla_flags": flags or None, "exit_code": code,
                                 "wall_s": wall, "budget_s": left, "log_tail": tail})
        if group == MAIN and child:
            report["matmul_peak"] = child["matmul_peak"]
            report["environment"].update(backend=child["backend"], device=child["device"])
        _merge(group, names, flags, child, code, tail, left, records,
               records["default"]["median_ms"] if records["default"]["status"] == "measured" else None)
        save()


def _with_peak(records, peak):
    for rec in records.values():
        if rec["status"] == "measured":
            rec["tflops_per_s"] = rec["gflop_per_step"] / rec["median_ms"]  # GFLOP / ms = TFLOP/s
            rec["fraction_of_peak"] = None if peak is None else rec["tflops_per_s"] * 1e3 / peak["best_gflops"]


def format_table(report):
    peak = report["matmul_peak"]
    lines = [report["preset"]["summary"] + f"; {report['reps']} interleaved repetitions in each group's process",
             report["where"],
             (f"matmul peak (JAX, {peak['dtype']}, {peak['n']}^2, in group main): {peak['best_gflops'] / 1e3:.2f} "
              "TFLOP/s" if peak else "matmul peak: not measured (group main did not run)"),
             "ms per train step (a scan_xK call does K steps); vs default: to the default timed in the same group's "
             "process (an XLA flag's group: to main's); % peak: of the matmul peak; temp MB: XLA's temporaries; "
             "dev. peak MB: the group's peak device memory after the variant's first call",
             f"{'variant':<30} {'median ms':>10} {'best ms':>9} {'vs default':>11} {'% peak':>7} {'temp MB':>8} "
             f"{'dev. peak MB':>12}  group"]
    for rec in report["variants"]:
        if rec["status"] != "measured":
            lines.append(f"{rec['name']:<30} {rec['status']}: {rec['reason']}")
            continue
        vs = "-" if rec["vs_default"] is None else f"{rec['vs_default']:.2f}x"
        share = "-" if rec["fraction_of_peak"] is None else f"{100 * rec['fraction_of_peak']:.1f}"
        temp = "-" if rec["xla_temp_mb"] is None else f"{rec['xla_temp_mb']:.0f}"
        dev = rec["device_peak_mb"] if isinstance(rec["device_peak_mb"], str) else f"{rec['device_peak_mb']:.0f}"
        lines.append(f"{rec['name']:<30} {rec['median_ms']:>10.2f} {rec['best_ms']:>9.2f} {vs:>11} {share:>7} "
                     f"{temp:>8} {dev:>12}  {rec['process']}")
    return "\n".join(lines)


def _list():
    lines = []
    for v in VARIANTS.values():
        where = (f"a group of its own, XLA_FLAGS {v.xla_flags}" if v.xla_flags
                 else f"group {v.group}" if v.group else f"group {MAIN}")
        lines.append(f"{v.name:<30} [{where}{'; GPU only: ' + v.gpu_only if v.gpu_only else ''}]\n    {v.what}")
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tools.ablations", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", choices=sorted(PRESETS))
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                        help="which variants (default: all), in this order within each group; groups run in the "
                             "order of their first variant, main first ('default' always runs, first)")
    parser.add_argument("--scan-layers", action="store_true", default=None, help="every variant with its layers "
                        "scanned, as python -m benchmarks --scan-layers")
    parser.add_argument("--attention", dest="attention_impl", choices=ATTENTION_IMPLS,
                        help="the Flax attention (default: the preset's)")
    parser.add_argument("--json", metavar="OUT", help="the table as JSON (every variant, measured or not, and why)")
    parser.add_argument("--budget-s", type=float, help="start no variant after this many seconds")
    parser.add_argument("--list", action="store_true", help="list the variants and what each measures")
    parser.add_argument("--force", action="store_true", help="run a GPU preset without a GPU")
    # A group's process, started by the run: its variants in this process, JSON for the run.
    parser.add_argument("--group", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure-peak", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    if args.budget_s is not None and not args.budget_s >= MIN_GROUP_S:  # nan too
        parser.error(f"--budget-s must be >= {MIN_GROUP_S} (the least a group needs to start), got {args.budget_s:g}")
    if args.json and (problem := output_problem(args.json)):
        parser.error(problem)
    if args.group and not args.json:
        parser.error("--group writes its results for the run that started it: give --json")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        print(_list())
        return 0
    preallocate = os.environ.get(PREALLOCATE)
    if argv is None:  # a command, not a test's call (which would replace the caller's process)
        restart_keeping_freed_memory()  # as python -m benchmarks does: the process restarts once with GLIBC_TUNABLES
        if args.group:
            return run_group(args)
        one_at_a_time.hold_the_machine_or_exit("python -m tools.ablations")  # one timing run per host at a time
        # This process times nothing: it leaves the device to its groups (set before its backend starts).
        os.environ[PREALLOCATE] = "false"
    elif args.group:
        return run_group(args)
    import jax

    from benchmarks import runner

    started = time.monotonic()
    deadline = None if args.budget_s is None else started + args.budget_s
    preset = preset_from_args(args)  # the preset with --scan-layers and --attention, as python -m benchmarks
    runner.check_device(preset, args.force)  # before a GPU preset is built on a CPU for minutes
    backend = jax.default_backend()
    names = list(dict.fromkeys(["default", *args.variants]))
    records = {name: _record(name) for name in names}
    groups = {}
    for name in names:
        v = VARIANTS[name]
        reason = v.skip(preset) or (f"needs a GPU ({v.gpu_only}); JAX's backend here is {backend}"
                                    if v.gpu_only and backend != "gpu" else None)
        if reason:
            records[name].update(status="skipped", reason=reason)
        else:
            groups.setdefault(name if v.xla_flags else v.group or MAIN, []).append(name)
    report = {
        "tool": "python -m tools.ablations", "argv": sys.argv if argv is None else ["python -m tools.ablations", *argv],
        "complete": False,
        "preset": {"name": preset.name, "summary": preset.summary(), "batch": preset.batch, "seq_len": preset.seq_len,
                   "dtype": preset.dtype, "scan_layers": preset.scan_layers, "attention_impl": preset.attention_impl,
                   **{k: getattr(preset.model, k) for k in ("embed_size", "heads", "num_layers", "dropout",
                                                             "target_vocab_size")}},
        "environment": {**runner.environment(), "XLA_PYTHON_CLIENT_PREALLOCATE": preallocate or "",
                        "jax_compilation_cache_dir": os.environ.get("JAX_COMPILATION_CACHE_DIR", "")},
        "where": where_and_what(), "reps": args.reps, "budget_s": args.budget_s, "matmul_peak": None,
        "groups": [], "variants": [],
    }

    def save(complete=False):
        _with_peak(records, report["matmul_peak"])
        report["variants"] = [records[name] for name in names]
        report["wall_s"] = time.monotonic() - started
        report["complete"] = complete
        if args.json:
            write_json(report, args.json)

    try:
        run_groups(groups, preset, args, records, deadline, report, preallocate, save)
    except KeyboardInterrupt:
        # The group under way and those not reached are listed with why, so the JSON stays whole.
        for rec in records.values():
            if rec["status"] is None:
                rec.update(status="not_run", reason="stopped by Ctrl-C")
        save()
        print("python -m tools.ablations: stopped by Ctrl-C" + (f"; wrote {args.json}" if args.json else ""),
              file=sys.stderr)
        return 130
    save(complete=True)
    print(format_table(report))
    if args.json:
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
