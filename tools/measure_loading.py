"""Measure the time and peak memory of loading a 1M-line TSV into token arrays (docs/data.md).

    PYTHONPATH=. python tools/measure_loading.py [--lines 1000000] [--file /tmp/synthetic_1m.tsv]

Writes a synthetic corpus (Zipf-distributed words of random letters, 3-15 words a side;
never committed), then, each in a fresh process so peak RSS is its own: trains a tokenizer
on the file, then loads the file into ``data.TextPairs`` (flat int32 ids + offsets per side),
streamed from ``iter_tsv`` (``streamed``) or from the list of string pairs ``read_tsv`` returns,
as ``train --data`` holds it (``listed``). Prints one line per measurement. An existing
``--file`` is measured again only when it holds ``--lines`` lines.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# benchmarks.outputs imports the standard library alone: the children, started from this process,
# measure their peak memory after their own imports (Linux carries a peak across fork and exec).
from benchmarks.outputs import directory_problem, output_problem


def write_corpus(path, lines, seed=0):
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(20000)]
    # Written under a temporary name and renamed when whole: an interrupted write leaves no
    # partial corpus for the next run to measure.
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as f:
        for start in range(0, lines, 100_000):
            n = min(100_000, lines - start)
            ids = np.minimum(rng.zipf(1.2, size=(n, 30)) - 1, len(words) - 1)
            src_len, tgt_len = rng.integers(3, 16, n), rng.integers(3, 16, n)
            f.writelines(
                " ".join(words[i] for i in row[:s]) + "\t" + " ".join(words[i] for i in row[15 : 15 + t]) + "\n"
                for row, s, t in zip(ids.tolist(), src_len, tgt_len)
            )
    os.replace(partial, path)


def count_lines(path):
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def check_args(parser, args):
    """Each refusal an argparse error, before a corpus is written or a child started."""
    if args.lines < 1:
        parser.error(f"--lines must be >= 1, got {args.lines}")
    path = Path(args.file)
    if not path.is_file() and (problem := output_problem(args.file, "--file")):  # an existing corpus is only read
        parser.error(problem)
    if problem := directory_problem(args.workdir, "--workdir"):
        parser.error(problem)
    if path.exists() and (held := count_lines(path)) != args.lines:
        parser.error(f"--file {args.file}: holds {held} lines, not the {args.lines} of --lines; remove it "
                     "or give another --file")


def measure(mode, path, kind, vocab_size, workdir):
    """Run in a child process: prints a JSON line with seconds and peak RSS."""
    from flaxformer_mini import data
    from flaxformer_mini.data import tokenizers as tk
    from flaxformer_mini.data.parallel_text import iter_tsv

    # Peak RSS after the imports: subtract it for the data's own cost.
    result = {"mode": mode, "kind": kind, "rss_after_imports_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    start = time.perf_counter()
    if mode == "train":
        texts = [s for _, s, _ in iter_tsv(path)] + [t for _, _, t in iter_tsv(path)]
        tok = tk.train(kind, texts, vocab_size=vocab_size)
        tok.save(workdir, kind)
        result["vocab"] = len(tok)
    else:
        tok = tk.load(workdir, kind, kind)
        pairs = ((s, t) for _, s, t in iter_tsv(path)) if mode == "streamed" else data.read_tsv(path)
        corpus = data.TextPairs(pairs, tok, tok, max_len=10_000)
        result.update(examples=len(corpus), tokens=int(corpus.source_lengths.sum() + corpus.target_lengths.sum())
                      - 2 * len(corpus), array_mb=round(corpus.nbytes / 2**20, 1))
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(result), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python tools/measure_loading.py", description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--file", default="/tmp/synthetic_1m.tsv")
    parser.add_argument("--workdir", default="/tmp/measure_loading")
    parser.add_argument("--child", nargs=4, metavar=("MODE", "PATH", "KIND", "VOCAB"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, path, kind, vocab = args.child
        return measure(mode, path, kind, None if vocab == "none" else int(vocab), args.workdir)
    check_args(parser, args)
    path, workdir = Path(args.file), Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        start = time.perf_counter()
        write_corpus(path, args.lines)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - start:.0f} s", flush=True)
    runs = [("train", "word", "none"), ("streamed", "word", "none"), ("listed", "word", "none")]
    runs += [("train", "bpe", "8000"), ("streamed", "bpe", "none"), ("train", "char", "none"), ("streamed", "char", "none")]
    for mode, kind, vocab in runs:
        cmd = [sys.executable, __file__, "--workdir", str(workdir), "--child", mode, str(path), kind, vocab]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
