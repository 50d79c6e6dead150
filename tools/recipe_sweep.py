"""Time-boxed recipe runs: each configuration trains for the same wall time, then is scored.

    PYTHONPATH=. python -m tools.recipe_sweep --data DIR --out SWEEP --minutes 10 [--configs NAME ...]

``DIR`` holds ``train.tsv`` and ``valid.tsv`` (``python -m flaxformer_mini.data.corpora cmudict
DIR`` writes them, with ``test.tsv``, which the sweep leaves for the end). Each configuration
(``CONFIGS``, ``flaxformer-mini train`` options) trains in a fresh process with a step count it
cannot reach; after ``--minutes`` of wall time, counted from the process's start (imports and
compilation included, as a user waits for them), it gets a SIGTERM and saves where it is, as a
scheduler's time limit would stop it. Then ``evaluate`` scores the run's latest checkpoint on
the validation file, greedily and with a beam. One JSON line a configuration goes to
``SWEEP/results.jsonl``: its options, steps reached, wall seconds, target tokens/s, and each
score's phoneme error rate (``wer``) and word error rate (``1 - exact_match``). A configuration
with a line there is skipped when the sweep runs again; one with a run directory but no line is
trained again from the start, since a resumed run would have had more than its time box.

The machine is named in every line (``benchmarks.machine``): wall-time results hold for the CPU
they ran on, and for the load it had (``uptime`` before and after each run is recorded too).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import machine as machines
from benchmarks.outputs import directory_problem
from flaxformer_mini.cli.errors import EXIT_INTERRUPTED

COMMON = ["--tokenizer", "word", "--max-len", "32", "--no-progress", "--no-plot", "--log-every", "100"]

# The 2,048-token cosine recipe's options but dropout and the moving average.
_D128_2K_COSINE = ["--preset", "small", "--embed-size", "128", "--heads", "4", "--layers", "3", "--ffn-dim", "512",
                   "--max-tokens", "2048", "--length-multiple", "2", "--schedule", "cosine", "--lr", "2e-3",
                   "--warmup", "800", "--label-smoothing", "0.1", "--steps", "6000"]

# name -> train options (besides --data, --valid, --out): the candidates, smallest first.
CONFIGS = {
    "small": ["--preset", "small", "--batch-size", "64", "--lr", "3e-3", "--warmup", "1000"],
    "d128x3": ["--preset", "small", "--embed-size", "128", "--heads", "4", "--layers", "3", "--ffn-dim", "512",
               "--max-tokens", "4096", "--lr", "2e-3", "--warmup", "1000", "--dropout", "0.1"],
    "d128x3_ls": ["--preset", "small", "--embed-size", "128", "--heads", "4", "--layers", "3", "--ffn-dim", "512",
                  "--max-tokens", "4096", "--lr", "2e-3", "--warmup", "1000", "--dropout", "0.1",
                  "--label-smoothing", "0.1"],
    "d192x3_ls": ["--preset", "small", "--embed-size", "192", "--heads", "4", "--layers", "3", "--ffn-dim", "768",
                  "--max-tokens", "4096", "--lr", "1.5e-3", "--warmup", "1000", "--dropout", "0.1",
                  "--label-smoothing", "0.1"],
    "d128x3_ls_ema": ["--preset", "small", "--embed-size", "128", "--heads", "4", "--layers", "3", "--ffn-dim", "512",
                      "--max-tokens", "4096", "--lr", "2e-3", "--warmup", "1000", "--dropout", "0.1",
                      "--label-smoothing", "0.1", "--ema", "0.999"],
    "d192x3_ls_ema": ["--preset", "small", "--embed-size", "192", "--heads", "4", "--layers", "3", "--ffn-dim", "768",
                      "--max-tokens", "4096", "--lr", "1.5e-3", "--warmup", "1000", "--dropout", "0.1",
                      "--label-smoothing", "0.1", "--ema", "0.999"],
    "d256x3_ls": ["--preset", "medium", "--max-tokens", "4096", "--lr", "1e-3", "--warmup", "1000",
                  "--label-smoothing", "0.1"],
    # A cosine schedule reaches 0 at its own --steps (the last --steps given wins): sized to end
    # within the time box on the CPU it was chosen on.
    "d128x3_ls_cos_lm2": ["--preset", "small", "--embed-size", "128", "--heads", "4", "--layers", "3", "--ffn-dim", "512",
                          "--max-tokens", "4096", "--length-multiple", "2", "--schedule", "cosine", "--lr", "2e-3",
                          "--warmup", "500", "--dropout", "0.1", "--label-smoothing", "0.1", "--steps", "2800"],
    "d128x3_ls_cos_lm2_2k": _D128_2K_COSINE + ["--dropout", "0.1"],
    "d128x3_ls_cos_lm2_1k": ["--preset", "small", "--embed-size", "128", "--heads", "4", "--layers", "3", "--ffn-dim",
                             "512", "--max-tokens", "1024", "--length-multiple", "2", "--schedule", "cosine", "--lr",
                             "2e-3", "--warmup", "1000", "--dropout", "0.1", "--label-smoothing", "0.1", "--steps",
                             "10000"],
    # The 2,048-token recipe with the moving average, with and without dropout (the small preset's
    # dropout is 0).
    "d128x3_ls_cos_lm2_2k_ema": _D128_2K_COSINE + ["--dropout", "0.1", "--ema", "0.999"],
    "d128x3_ls_cos_lm2_2k_ema_d0": _D128_2K_COSINE + ["--ema", "0.999"],
}


def load():
    return os.getloadavg()[0]


def train(name, options, data, out, minutes, eval_every):
    run = out / name
    cmd = [sys.executable, "-m", "flaxformer_mini", "train", "--data", str(data / "train.tsv"), "--valid",
           str(data / "valid.tsv"), "--out", str(run), "--steps", "10000000", "--eval-every", str(eval_every),
           "--save-every", str(eval_every), *COMMON, *options]
    started, load_before = time.monotonic(), load()
    with open(out / f"{name}.train.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        stopped = False
        try:
            proc.wait(timeout=minutes * 60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            stopped = True
            proc.wait()
    wall = time.monotonic() - started
    # The sweep's own SIGTERM ends train with EXIT_INTERRUPTED, its run saved; anything else failed.
    if proc.returncode != (EXIT_INTERRUPTED if stopped else 0):
        raise SystemExit(f"{name}: train exited {proc.returncode}: "
                         + _tail((out / f"{name}.train.log").read_text()))
    if not (run / "metrics.jsonl").exists():  # stopped before its first log line
        raise SystemExit(f"{name}: train wrote no metrics in {minutes:g} minutes: "
                         + _tail((out / f"{name}.train.log").read_text()))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # Every line with a rate counts, the first too: the log's rate leaves out the steps during which
    # XLA compiled, and a line whose every step compiled has no tokens_per_s.
    rates = [m["tokens_per_s"] for m in metrics if "tokens_per_s" in m]
    # The step it stopped at is its newest checkpoint's (the log has every --log-every'th step).
    saved = [int(d.name) for d in (run / "checkpoints").iterdir() if d.name.isdigit()]
    return {"steps": max(saved, default=0), "train_wall_s": round(wall, 1), "exit_code": proc.returncode,
            # None (JSON null) when no line had a rate: no step ran without compiling.
            "tokens_per_s": round(sum(rates) / len(rates)) if rates else None,
            "load_before": round(load_before, 2), "load_after": round(load(), 2), "command": cmd}


def _tail(text):
    """The last non-empty line of a child's output: where its error is."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def score(checkpoint, data, beam):
    cmd = [sys.executable, "-m", "flaxformer_mini", "evaluate", "--checkpoint", str(checkpoint), "--data",
           str(data / "valid.tsv"), "--json", "--batch-size", "256", "--beam-size", str(beam)]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"evaluate --checkpoint {checkpoint} --beam-size {beam} exited {proc.returncode}: "
                         + _tail(proc.stderr))
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"per": round(result["wer"], 5), "word_error_rate": round(1 - result["exact_match"], 5),
            "seconds": round(time.monotonic() - started, 1)}


def done_configs(out):
    """The names of the configurations results.jsonl holds a line for."""
    path = out / "results.jsonl"
    if not path.exists():
        return set()
    return {json.loads(line)["name"] for line in path.read_text().splitlines() if line.strip()}


def check_args(parser, args):
    """Each refusal an argparse error, before any run starts or any file is written."""
    if args.minutes <= 0:
        parser.error(f"--minutes must be > 0, got {args.minutes:g}")
    for option, value in (("--eval-every", args.eval_every), ("--beam-size", args.beam_size)):
        if value < 1:
            parser.error(f"{option} must be >= 1, got {value}")
    for split in ("train.tsv", "valid.tsv"):
        if not (args.data / split).is_file():
            parser.error(f"--data {args.data}: {split} not found there")
    if problem := directory_problem(args.out, "--out"):
        parser.error(problem)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.recipe_sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS))
    args = parser.parse_args(argv)
    check_args(parser, args)
    args.out.mkdir(parents=True, exist_ok=True)
    machine = machines.one_line(machines.describe())
    done = done_configs(args.out)
    for name in args.configs:
        if name in done:
            print(f"{name}: results.jsonl has its line; skipped", file=sys.stderr)
            continue
        if (args.out / name).exists():
            print(f"{name}: {args.out / name} has no line in results.jsonl; trained again from the start",
                  file=sys.stderr)
            shutil.rmtree(args.out / name)
        record = {"name": name, "options": CONFIGS[name], "minutes": args.minutes, "machine": machine,
                  "date": machines.date_utc()}
        record.update(train(name, CONFIGS[name], args.data, args.out, args.minutes, args.eval_every))
        record["greedy"] = score(args.out / name, args.data, 1)
        record[f"beam{args.beam_size}"] = score(args.out / name, args.data, args.beam_size)
        with open(args.out / "results.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps({k: record[k] for k in ("name", "steps", "tokens_per_s", "greedy", f"beam{args.beam_size}")}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
