"""Where the compiled Flax train step (or forward) spends its time, by kind of HLO operation.

``python -m tools.xla_profile [--preset base] [--op train_step] [--steps 3] [--top 15]``
(``--preset large --scan-layers`` on a GPU)

Runs the same Flax path as the benchmark under ``jax.profiler.trace``, reads the trace back
with ``jax.profiler.ProfileData`` and adds up, per HLO instruction of the compiled program,
the time spent executing it. On a CPU, XLA's runtime makes each executed instruction (a
"thunk") a trace event carrying an ``hlo_op`` stat; the instructions of a while loop's body
are thunks of their own, and the loop's own event covers only its control. On a GPU the
events are the kernels on the device's plane (``/device:GPU:N``), each with the ``hlo_op``
that launched it; the host's events for the same instructions (launches) are left out, and
the wall time not covered by kernels is reported as the GPU's idle time (launches, host
work, synchronisation). Each instruction is put in one category from the optimised HLO text:

    matmul        dot / convolution, or a fusion around one (or a library GEMM call:
                  cuBLAS custom calls, Triton GEMM fusions)
    attention     a fused attention library call (cuDNN's flash attention, its backward)
    rng           a fusion doing threefry arithmetic (dropout's random bits), rng ops
    reduction     fusions with a reduce: softmax, LayerNorm, the loss, norms, sums
    elementwise   other fusions: adds, scaling, masks, ReLU, Adam's update, ...
    copy/layout   copy, transpose, or a fusion around one (layout changes XLA could not fuse
                  into a GEMM; often with an elementwise op fused in, e.g. a bias add); the
                  dynamic slicing and stacking of a scanned loop (each layer's weights and
                  saved activations taken out of and put into the stacked arrays) and the
                  broadcasts that fill those stacks before the loop
    other         gather/scatter (embeddings), while loops, ...

and in one phase from the JAX op name in its metadata: ``forward`` (for a gradient, the
ops traced under ``jvp``), ``backward`` (``transpose(jvp)``), ``update`` (clipping, Adam,
metrics: outside the gradient), ``unattributed`` (no op name: instructions XLA made itself,
such as a scanned loop's slicing and stacking).

An instruction the trace names but the compiled text read here does not hold (seen on the
H100: the scanned loop's slicing fusions) is put in a category by its name, which XLA:GPU
forms as ``<kind>_<root opcode>_fusion`` (``loop_dynamic_update_slice_fusion.142``).

XLA:GPU runs sequences of kernels as CUDA graphs ("command buffers"), which a trace shows as
one event each (``command_buffer_310``), hiding the kernels inside. The profile turns them
off (``--xla_gpu_enable_command_buffer=`` in XLA_FLAGS, unless XLA_FLAGS names that flag
already, or ``--keep-command-buffers``); on the H100 the ``large`` train step's wall time was
71.5 ms with them and 72.7 ms without (medians of 3 calls each, in two calls of the device
tool on one machine, 2026-11-27, docs/benchmarks.md "GPU").

Times are summed over the instructions' events: on a CPU, two instructions running side by
side on the two cores both count, so the total can exceed the wall time, while a GEMM's
helper threads do not appear (they carry no event). The op-level view says where the time goes;
benchmarks.flops says how much of it is useful.

The decode ops are profiled through ``flaxformer_mini.decode.search``'s jitted loops, whose HLO
text is read by lowering those (private) functions: profiling only, never timing.
"""

import argparse
import collections
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time

import jax

from benchmarks import flax_bench, one_at_a_time
from benchmarks.__main__ import preset_from_args
from benchmarks.outputs import output_problem
from benchmarks.inputs import make_batch
from benchmarks.presets import PRESETS
from benchmarks.runner import check_device
from flaxformer_mini.model.attention import ATTENTION_IMPLS
from flaxformer_mini.malloc_tunables import restart_keeping_freed_memory
from tools import where_and_what

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*? ([a-z][a-z0-9\-]*)\(")
_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+) .*\{\s*$")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_SHAPE = re.compile(r" = (\S+) ")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')

MATMUL_OPS = {"dot", "convolution"}
RNG_OPS = {"rng", "rng-bit-generator", "rng-get-and-update-state"}
# threefry2x32 is rotations and xors of uint32 words: shifts + xor + add, in u32
_RNG_HINT = {"shift-left", "shift-right-logical", "xor"}


def parse_hlo(text):
    """{instruction name: (opcode, shape, opcodes it reaches through called computations,
    whether those use uint32, the JAX op_name of its metadata, the custom-call targets it
    is or reaches)}."""
    computations = collections.defaultdict(set)  # computation -> opcodes inside it
    computation_calls = collections.defaultdict(set)
    computation_has_u32 = collections.defaultdict(bool)
    computation_targets = collections.defaultdict(set)
    instructions = {}
    op_names = {}
    current = None
    for line in text.splitlines():
        m = _INSTR.match(line)
        if m and current is not None:
            name, opcode = m.groups()
            shape = (_SHAPE.search(line) or [None, ""])[1]
            calls = _CALLS.findall(line)
            op_names[name] = (_OP_NAME.search(line) or [None, ""])[1]
            targets = set(_TARGET.findall(line))
            instructions[name] = (opcode, shape, calls, current, targets)
            computation_targets[current] |= targets
            computations[current].add(opcode)
            computation_calls[current].update(calls)
            if "u32[" in line:
                computation_has_u32[current] = True
            continue
        m = _COMP.match(line)
        if m and not _INSTR.match(line):
            current = m.group(1)

    def reach(comp, seen=None):
        seen = seen if seen is not None else set()
        if comp in seen:
            return set(), False, set()
        seen.add(comp)
        ops, u32, targets = set(computations[comp]), computation_has_u32[comp], set(computation_targets[comp])
        for c in computation_calls[comp]:
            o, u, t = reach(c, seen)
            ops |= o
            u32 = u32 or u
            targets |= t
        return ops, u32, targets

    out = {}
    for name, (opcode, shape, calls, _, targets) in instructions.items():
        inner, u32, reached = set(), False, set(targets)
        for c in calls:
            o, u, t = reach(c)
            inner |= o
            u32 = u32 or u
            reached |= t
        out[name] = (opcode, shape, inner, u32, op_names[name], reached)
    return out


# Custom-call targets by library: cuDNN's fused attention ("__cudnn$fmha..."), cuBLAS's and
# cuBLASLt's GEMMs ("__cublas$gemm", "__cublas$lt$matmul").
_ATTENTION_TARGETS = ("fmha", "flash", "attention")
_MATMUL_TARGETS = ("gemm", "matmul", "dot")


# Data movement: a scanned loop's per-layer slices of its stacked arrays, the stacking of
# what it saves for the backward pass, and the broadcasts that fill those stacks first.
_MOVES = {"copy", "transpose", "dynamic-slice", "dynamic-update-slice", "slice", "concatenate", "pad"}
_MOVE_ROOTS = _MOVES | {"broadcast"}  # a fusion rooted in one of these (a broadcast: a fill)


def _fusion_root(name):
    """The root opcode XLA:GPU writes into a fusion's name, ``<kind>_<root opcode>_fusion[.N]``
    (``input_reduce_fusion``, ``loop_dynamic_update_slice_fusion.142``); None for other names."""
    m = re.fullmatch(r"(?:loop|input|output)_(\w+?)_fusion", name.split(".")[0])  # .N, .clone, ...
    return m.group(1).replace("_", "-") if m else None


def category_from_name(name):
    """A category for an instruction known only by its name (absent from the compiled text).
    A fusion goes by its root: one rooted in a dynamic-update-slice is data movement even
    where it computes too (the forward's last elementwise op before the stack)."""
    fused = _fusion_root(name)
    root = fused or name.split(".")[0].replace("_", "-")
    if any(k in root for k in ("dot", "gemm", "convolution")):
        return "matmul"
    if "reduce" in root.replace("reduce-precision", ""):
        return "reduction"
    if root in _MOVE_ROOTS:
        return "copy/layout"
    return "elementwise" if fused else "other"


def category(opcode, inner, u32, name="", targets=()):
    if opcode == "?":  # not in the compiled text
        return category_from_name(name)
    ops = inner | {opcode}
    called = " ".join(targets).lower()
    if any(k in called for k in _ATTENTION_TARGETS):
        return "attention"
    if (ops & MATMUL_OPS or any(k in called for k in _MATMUL_TARGETS)
            or (opcode == "custom-call" and any(k in name for k in _MATMUL_TARGETS))):
        return "matmul"
    if ops & RNG_OPS or (u32 and len(_RNG_HINT & ops) >= 2):
        return "rng"
    if (opcode in _MOVES or (opcode == "fusion" and inner & {"copy", "transpose"})
            or (opcode == "fusion" and _fusion_root(name) in _MOVE_ROOTS)):
        return "copy/layout"
    if opcode == "fusion" and ("reduce" in inner or "reduce-window" in inner):
        return "reduction"
    if opcode == "fusion" or opcode in ("add", "multiply", "subtract", "divide", "maximum", "select", "exponential"):
        return "elementwise"
    return "other"


_RANDOM_NAMES = ("_bernoulli", "_uniform", "threefry", "random_bits", "_random")


def phase(op_name, differentiated=True):
    """forward / backward / update, from the JAX transformation path in the op's metadata:
    the gradient's forward pass is traced under jvp(...), its backward under transpose(jvp(...)),
    and everything else (clipping, Adam, metrics) is the update. A program without a
    gradient is all forward."""
    if not differentiated:
        return "forward"
    if "transpose(jvp" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    return "update" if op_name else "unattributed"


def profile(run, compiled_text, steps, module_hint):
    """One row per executed instruction (time per call, averaged over ``steps`` traced calls),
    the calls' wall times, and whether the times are a device's kernels (a GPU's)."""
    hlo = parse_hlo(compiled_text)
    differentiated = "jvp(" in compiled_text
    walls = []
    with tempfile.TemporaryDirectory(prefix="benchmarks-trace-") as logdir:
        jax.profiler.start_trace(logdir)
        try:
            for _ in range(steps):
                start = time.perf_counter()
                run()
                walls.append(time.perf_counter() - start)
        finally:
            jax.profiler.stop_trace()
        files = sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))
        data = jax.profiler.ProfileData.from_file(files[-1])
    per_op, count, planes, on_device = _events_per_op(data.planes, module_hint)
    if not per_op:
        raise SystemExit(f"the trace holds no event of an HLO instruction of a module named like {module_hint!r}; "
                         f"its planes: {planes}")
    rows = []
    for op, ns in per_op.items():
        opcode, shape, inner, u32, op_name, targets = hlo.get(op, ("?", "", set(), False, "", set()))
        if opcode == "while":
            inner, targets = set(), set()  # its body's instructions are counted on their own
        cat = category(opcode, inner, u32, op, targets)
        if any(k in op_name for k in _RANDOM_NAMES):
            cat = "rng"  # dropout's random bits and mask, wherever XLA fused them
        rows.append({"op": op, "opcode": opcode, "shape": shape, "category": cat, "phase": phase(op_name, differentiated),
                     "op_name": op_name, "ms_per_step": ns / 1e6 / steps, "calls_per_step": count[op] / steps})
    rows.sort(key=lambda r: -r["ms_per_step"])
    return rows, walls, on_device


def _events_per_op(planes, module_hint):
    """Nanoseconds and events per HLO instruction; the planes' names, for the error when
    nothing matches; and whether the times are a device's.

    Where the trace has a device plane with such events (a GPU's ``/device:GPU:0``), only its
    kernels count, read from its ``Stream`` lines where it has any: the host's events for the
    same instructions are their launches, and lines a profiler derives from the streams
    (modules, ops) would count every kernel twice. Otherwise (a CPU's thunks) every plane
    counts."""
    seen, found = [], []
    for plane in planes:
        seen.append(plane.name)
        for line in plane.lines:
            per_op, count = collections.Counter(), collections.Counter()
            for event in line.events:
                stats = dict(event.stats)
                op = stats.get("hlo_op")
                if op is None or module_hint not in str(stats.get("hlo_module", "")):
                    continue
                per_op[op] += event.duration_ns
                count[op] += 1
            if per_op:
                found.append((plane.name, line.name, per_op, count))
    device = [f for f in found if f[0].startswith("/device:")]
    streams = [f for f in device if f[1].startswith("Stream")]
    chosen = streams or device or found
    total_ns, total_count = collections.Counter(), collections.Counter()
    for *_, per_op, count in chosen:
        total_ns.update(per_op)
        total_count.update(count)
    return total_ns, total_count, seen, bool(device)


def host_times_note(backend, on_device):
    """What to say when an accelerator's trace gave no device plane with the program's
    kernels and the times are the host's events (``_events_per_op``'s fallback); None when the
    times are what they claim to be (a device's kernels, or a CPU's thunks)."""
    if on_device or backend == "cpu":
        return None
    return (f"note: the trace holds no {backend} device plane with this program's kernels; the times below are "
            "the host's events (launches and waits), not the device's")


def kernels_one_event_each(environ):
    """Turn XLA:GPU's command buffers off through ``environ["XLA_FLAGS"]`` (before the backend
    starts), unless the flags name them already: the user's choice stands. Returns a warning
    when the backend has started already, and the flag comes too late to count."""
    flags = environ.get("XLA_FLAGS", "")
    if "xla_gpu_enable_command_buffer" in flags:
        return None
    environ["XLA_FLAGS"] = f"{flags} --xla_gpu_enable_command_buffer=".strip()
    from jax._src import xla_bridge  # no public API says whether the backends have started

    if getattr(xla_bridge, "backends_are_initialized", lambda: False)():
        return ("warning: JAX's backend started before the profile could turn XLA's CUDA graphs off; "
                "set XLA_FLAGS=--xla_gpu_enable_command_buffer= before starting it")
    return None


def command_buffer_note(rows):
    """What to say when kernels ran inside CUDA graphs, which the trace shows whole; None otherwise."""
    hidden = [r for r in rows if r["op"].startswith("command_buffer")]
    if not hidden:
        return None
    ms = sum(r["ms_per_step"] for r in hidden)
    return (f"note: {ms:.1f} ms per call ran in {len(hidden)} CUDA graphs (XLA's command buffers, "
            "command_buffer_N below), which the trace shows whole, so their kernels have no category; to see "
            "the kernels, run without --keep-command-buffers and without xla_gpu_enable_command_buffer in XLA_FLAGS")


def summarize(rows, key="category"):
    by_cat = collections.defaultdict(float)
    for r in rows:
        by_cat[r[key]] += r["ms_per_step"]
    total = sum(by_cat.values())
    return {k: {"ms_per_step": v, "share": v / total if total else 0.0}
            for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])}, total


def _decode_hlo(preset, batch, op):
    """The optimised HLO of flaxformer_mini's decoding loop, compiled the way greedy_decode
    (or greedy_decode_uncached) compiles it. Reads private names: for this profile only."""
    import jax.numpy as jnp
    from flax import nnx

    from flaxformer_mini.decode import search as decoding

    model = flax_bench._new_model(preset, 0)
    model.eval()
    graphdef, state = nnx.split(model)
    source = jnp.asarray(batch.source)
    if op == "decode_cached":
        lowered = decoding._token_by_token.lower(graphdef, state, source, preset.new_tokens, ("greedy",),
                                                 jax.random.key(0), jnp.float32(1.0))
    else:
        lowered = decoding._greedy_uncached.lower(graphdef, state, source, preset.new_tokens)
    return lowered.compile().as_text()


def _preset(args):
    """The preset the options describe: --dropout, --scan-layers and --attention as python -m
    benchmarks takes them, then --seq-len (max_len grows to fit) and --batch."""
    preset = preset_from_args(args)
    if args.seq_len is not None:
        preset = preset.replace(seq_len=args.seq_len, model=preset.model.replace(
            max_len=max(preset.model.max_len, args.seq_len)))
    if args.batch is not None:
        preset = preset.replace(batch=args.batch)
    return preset


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.xla_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", choices=sorted(PRESETS))
    parser.add_argument("--op", default="train_step", choices=("train_step", "forward", "decode_cached", "decode_uncached"))
    parser.add_argument("--steps", type=int, default=3, help="traced calls (after 2 untraced)")
    parser.add_argument("--top", type=int, default=15, help="how many single instructions to list")
    parser.add_argument("--dropout", type=float, help="override the model's dropout rate")
    parser.add_argument("--seq-len", type=int, help="override the preset's S = T (max_len grows to fit)")
    parser.add_argument("--batch", type=int, help="override the preset's batch size")
    parser.add_argument("--scan-layers", action="store_true", default=None, help="the layers stacked and run by "
                        "nnx.scan, as python -m benchmarks --scan-layers (one block compiled: minutes less for the "
                        "large preset)")
    parser.add_argument("--attention", dest="attention_impl", choices=ATTENTION_IMPLS,
                        help="the Flax attention (default: the preset's)")
    parser.add_argument("--json", metavar="OUT", help="write every instruction's row as JSON")
    parser.add_argument("--hlo", metavar="OUT", help="write the optimised HLO text")
    parser.add_argument("--force", action="store_true", help="run a GPU preset without a GPU")
    parser.add_argument("--keep-command-buffers", action="store_true", help="leave XLA:GPU's CUDA graphs on "
                        "(the trace then shows each graph as one event, its kernels hidden)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.top < 0:
        parser.error(f"--top must be >= 0, got {args.top}")
    # The output paths are checked here, or a missing directory ends the run after the profile.
    for option, path in (("--json", args.json), ("--hlo", args.hlo)):
        if path and (problem := output_problem(path, option)):
            parser.error(problem)
    try:  # a preset the options make invalid (--batch 0, --dropout 1.5) is refused with its reason
        preset = _preset(args)
    except ValueError as e:
        parser.error(str(e))
    if not args.keep_command_buffers and (warning := kernels_one_event_each(os.environ)):
        print(warning, file=sys.stderr)  # (set before the restart below and the backend's start)
    restart_keeping_freed_memory()  # as python -m benchmarks does: the process restarts once with GLIBC_TUNABLES
    if argv is None:  # a command, not a test's call: one timing run per host at a time
        one_at_a_time.hold_the_machine_or_exit(parser.prog)
    # Before the large preset's model is built on a CPU for minutes (and after the restart:
    # on a GPU this starts the backend, which would start again in the restarted process).
    check_device(preset, args.force)
    batch = make_batch(preset)
    (path,) = flax_bench.make_paths(preset, batch, [args.op])
    if path.prepare is not None:
        path.prepare()
    for _ in range(2):
        path.run()
    text = path.aot.compiled.as_text() if hasattr(path, "aot") else _decode_hlo(preset, batch, args.op)
    rows, walls, on_device = profile(path.run, text, args.steps, module_hint="jit_")
    cats, total = summarize(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": preset.name, "summary": preset.summary(), "op": args.op,
                       "wall_ms": [w * 1e3 for w in walls], "device_kernels": on_device, "devices": str(jax.devices()),
                       "categories": cats, "instructions": rows}, f, indent=1)
    if args.hlo:
        with open(args.hlo, "w") as f:
            f.write(text)

    wall = statistics.median(walls) * 1e3
    for note in (host_times_note(jax.default_backend(), on_device), command_buffer_note(rows)):
        if note:
            print(note, file=sys.stderr)
    if on_device:
        busy = (f"GPU kernels {total:.1f} ms per call, the GPU idle for the other {max(wall - total, 0):.1f} ms "
                "(launches, host work, synchronisation)")
    else:
        busy = f"busy thread time {total:.1f} ms per call"
    print(f"{preset.summary()}; {args.op}, {args.steps} traced calls, wall median {wall:.1f} ms; {busy}")
    print(where_and_what())
    print(f"\n{'category':<14} {'ms/call':>9} {'share':>7}")
    counts = collections.Counter(r["category"] for r in rows)
    for k, v in cats.items():
        print(f"{k:<14} {v['ms_per_step']:>9.1f} {100 * v['share']:>6.1f}%  ({counts[k]} instructions)")
    phases, _ = summarize(rows, "phase")
    print("\nby phase: " + ", ".join(f"{k} {v['ms_per_step']:.1f} ms ({100 * v['share']:.0f}%)" for k, v in phases.items()))
    grid = collections.defaultdict(float)
    for r in rows:
        grid[r["phase"], r["category"]] += r["ms_per_step"]
    names = list(cats)
    print(f"{'ms/call':<13}" + "".join(f"{c:>13}" for c in names))
    for ph in phases:
        print(f"{ph:<13}" + "".join(f"{grid[ph, c]:>13.1f}" for c in names))
    if "unattributed" in phases:
        print("(unattributed: instructions with no JAX op name, made by XLA itself: layout copies; with layers "
              "scanned, the loop's slicing and stacking and the fills of its stacks)")
    print(f"\ntop {args.top} instructions:")
    print(f"{'instruction':<34} {'category':<12} {'ms/call':>8} {'calls':>6}  shape")
    for r in rows[: args.top]:
        print(f"{r['op'][:34]:<34} {r['category']:<12} {r['ms_per_step']:>8.2f} {r['calls_per_step']:>6.0f}  {r['shape'][:60]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
