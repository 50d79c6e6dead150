"""Summarise py-spy's folded stacks of a whole suite run: `python summarize.py suite.folded`.

Each line of the file is `frame;frame;... count`, the outermost frame first and each process
named in a frame of its own after its parent's (py-spy --subprocesses), so a sample belongs to
the last process named. The pytest workers are the processes started by pytest-xdist
(`python -u -c import sys;exec(...)`), whose name holds a ';' and so spans two frames.
"""

import collections
import re
import sys

RATE = 40  # samples a second (py-spy -r 40)
CATEGORIES = [  # the first that matches a sample's stack names it
    ("XLA compile (its Python thread)", ["backend_compile", "compile_or_get_cached"]),
    ("lowering to MLIR", ["lower_jaxpr_to_module", "jaxpr_subcomp", "_to_lowering", "lower_sharding_computation", "mlir.py"]),
    ("tracing", ["trace_to_jaxpr", "_create_pjit_jaxpr", "trace_to_subjaxpr", "jvp", "linearize"]),
    ("orbax", ["orbax/"]),
    ("tensorstore", ["tensorstore"]),
    ("torch", ["torch/"]),
    ("flax (NNX modules, graph, transforms)", ["flax/"]),
    ("hypothesis", ["hypothesis/"]),
    ("imports", ["_find_and_load"]),
    ("waiting on a subprocess", ["subprocess.py"]),
    ("sleep or select", ["time.sleep", "select"]),
    ("jax (dispatch and the rest)", ["jax/_src/"]),
]


def category(stack):
    for name, keys in CATEGORIES:
        if any(k in stack for k in keys):
            return name
    return "other (the tests' own code, execnet, asyncio, gc, frames without Python)"


def main(path):
    workers, children = collections.Counter(), collections.Counter()
    package = collections.Counter()
    for line in open(path):
        m = re.match(r"(.*) (\d+)$", line.rstrip("\n"))
        if not m:
            continue
        stack, n = m.group(1), int(m.group(2))
        processes = [f for f in stack.split(";") if f.startswith("process ")]
        worker = bool(processes) and "python -u -c import sys" in processes[-1]
        (workers if worker else children)[category(stack)] += n
        if worker:
            frames = [f for f in stack.split(";") if any(k in f for k in ("flaxformer_mini/", "parity/", "torch_ref/"))]
            if frames:
                package[frames[-1][:110]] += n
    for name, counts in (("pytest workers", workers), ("processes the tests start", children)):
        total = sum(counts.values())
        print(f"{name}: {total} samples, {total / RATE:.0f} s")
        for k, v in counts.most_common():
            print(f"  {v / RATE:7.1f} s {100 * v / total:5.1f}%  {k}")
    print("pytest workers, by the innermost frame of the project's packages (top 30):")
    for k, v in package.most_common(30):
        print(f"  {v / RATE:7.1f} s  {k}")


if __name__ == "__main__":
    main(sys.argv[1])
