"""This CPU's earlier runs, beside a new report: the committed reports of
docs/benchmark_runs/ measured on the same CPU model with the same preset.

A ratio holds for the CPU it was measured on (docs/benchmarks.md), and on one CPU it moves from
run to run (the Zen 4's train step: 60%, 74% and 66% of JAX's peak in three runs). A reader who
measures on a CPU the project has measured sees their ratios next to the recorded ones, and
can tell a different result from the spread the docs report.
"""

import json
from pathlib import Path

RUNS = Path(__file__).resolve().parent.parent / "docs" / "benchmark_runs"


def same_cpu(a, b):
    """The same CPU model: vendor's name, family and model number (what lscpu names)."""
    keys = ("model_name", "family", "model")
    return all(a.get(k) == b.get(k) for k in keys)


def find(rep, folder=RUNS):
    """[(file name, report)] of ``folder``'s complete reports of ``rep``'s CPU model and
    preset, oldest first; none where the folder is absent (an installed copy, not a checkout)."""
    cpu, preset = rep["environment"]["machine"]["cpu"], rep["config"]["preset"]
    found = []
    for path in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else ():
        try:
            other = json.loads(path.read_text())
            # Reports before the "complete" field were written whole, at the end of a run.
            if (other.get("complete", True) and other["config"]["preset"] == preset
                    and same_cpu(other["environment"]["machine"]["cpu"], cpu)):
                found.append((path.name, other))
        except (OSError, ValueError, KeyError, TypeError):  # another kind of file (a scaling sweep's)
            continue
    return sorted(found, key=lambda item: item[1]["environment"]["date_utc"])


def summary(rep):
    """One line of ratios and % of peak: how a run compares with this CPU's others."""
    parts = []
    for group, r in rep["results"].items():
        if r.get("flax_jit_ms") is None:
            continue
        ratios = " / ".join(f"{r[f'{v}_over_flax']:.2f}x" if r.get(f"{v}_over_flax") else "-"
                            for v in ("torch_eager", "torch_compile"))
        parts.append(f"{group} {ratios}")
    flax = {p["op"]: p for p in rep["paths"] if p["variant"].startswith("flax_jit")}
    peaks = [f"{op} {100 * flax[op]['fraction_of_peak']:.0f}%" for op in ("train_step", "forward")
             if flax.get(op, {}).get("fraction_of_peak")]
    return "; ".join(parts) + (f"; Flax % of JAX peak: {', '.join(peaks)}" if peaks else "")


def format_lines(rep, folder=RUNS):
    """The lines printed after a report: this run and each earlier one of its CPU and preset."""
    earlier = find(rep, folder)
    if not earlier:
        return []
    cpu = rep["environment"]["machine"]["cpu"]
    lines = [f"this CPU ({cpu['model_name']}, family {cpu.get('family')} model {cpu.get('model')}) measured before, "
             f"preset {rep['config']['preset']} (torch eager / torch.compile over Flax; docs/benchmark_runs):",
             f"  this run         {summary(rep)}"]
    lines += [f"  {other['environment']['date_utc']}  {summary(other)}  ({name})" for name, other in earlier]
    return lines
