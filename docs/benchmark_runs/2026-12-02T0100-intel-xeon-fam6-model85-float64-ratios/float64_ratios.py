"""Each trained run's float64-reference ratios, per compared output: Flax's error against the
torch twin in float64 over torch's own, as the largest error and as the root mean square.

    PYTHONPATH=. python docs/benchmark_runs/<this folder>/float64_ratios.py RUN [RUN ...]

Runs `parity check --torch-checkpoint RUN --float64-reference --all --seed S` (the run's
newest checkpoint, the default batch of 4) for seeds 0, 1 and 2, with the float64 judgment
wrapped to record the ratios of every row where torch's error is not zero; prints the rows
beyond 1e-5 and a summary per run and seed.
"""

import contextlib
import io
import json
import pathlib
import sys

import numpy as np

import parity.float64_reference as reference
from parity.cli import main

judge = reference.judge_against_float64


def run_ratios(run, seed):
    rows = []

    def recording(report, *args, **kw):
        out = judge(report, *args, **kw)
        rows.extend(r for r in out.rows if r.torch_f64_rms)
        return out

    reference.judge_against_float64 = recording
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            main(["check", "--torch-checkpoint", run, "--float64-reference", "--all", "--seed", str(seed)])
    finally:
        reference.judge_against_float64 = judge
    return rows


for run in sys.argv[1:]:
    config = json.loads((pathlib.Path(run) / "config.json").read_text())
    step = max(int(p.name) for p in (pathlib.Path(run) / "checkpoints").iterdir() if p.name.isdigit())
    model = config["model"]
    print(f"== {run}: step {step}, {model['num_layers']}+{model['num_layers']} layers, width {model['embed_size']}, "
          f"{model['heads']} heads, ffn {model['ffn_dim']}, vocabularies {model['source_vocab_size']}/"
          f"{model['target_vocab_size']}, data {config['data']['kind']}")
    for seed in range(3):
        rows = run_ratios(run, seed)
        largest = np.array([r.flax_f64 / r.torch_f64 for r in rows])
        rms = np.array([r.flax_f64_rms / r.torch_f64_rms for r in rows])
        for r, a, b in zip(rows, largest, rms):
            if r.max_abs > 1e-5:
                print(f"  seed {seed} {r.label:50s} beyond 1e-5 ({r.max_abs:.3e}): largest {a:5.2f}  rms {b:5.2f}")
        print(f"  seed {seed}, {len(rows)} rows: largest-error ratio {largest.min():.2f}-{largest.max():.2f} (median "
              f"{np.median(largest):.2f}), RMS ratio {rms.min():.2f}-{rms.max():.2f} (median {np.median(rms):.2f})")
