"""A decoding call's wall time with the eval-mode view made by four graph walks (split, merge,
eval, split) against ``search.eval_split`` (one walk, the eval-mode graph definition kept per
structure), interleaved in one process: `python decode_call_overhead.py` from the repository root.
The compiled loops are shared (both give the same graph definition), so the difference is the
Python work around each call."""
import statistics
import time

import jax
import numpy as np
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.decode import search


def four_walks(model):
    view = nnx.merge(*nnx.split(model))
    view.eval()
    return nnx.split(view)


def timed(fn, reps):
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(1000 * (time.perf_counter() - t))
    return out


for preset, batch, length, new in (("tiny", 8, 8, 8), ("base", 8, 16, 16)):
    model = fm.Transformer.from_config(fm.get_preset(preset), rngs=nnx.Rngs(0))
    model.eval()
    source = np.random.default_rng(0).integers(3, model.config.source_vocab_size, (batch, length)).astype(np.int32)
    for name, decode in (("greedy", lambda: search.greedy_decode(model, source, new)),
                         ("beam 4", lambda: search.beam_search(model, source, new, beam_size=4)[0])):
        times = {"four walks": [], "eval_split": []}
        kept = search.eval_split
        for rep in range(10):
            for variant in times:  # interleaved, so drift hits both alike
                search.eval_split = four_walks if variant == "four walks" else kept
                times[variant] += timed(decode, 3 if rep else 4)[1 if not rep else 0:]  # the first call compiles
        search.eval_split = kept
        a, b = (statistics.median(times[v]) for v in times)
        print(f"{preset:5s} B={batch} S={length} N={new} {name:7s} median ms per call: four walks {a:7.1f}, "
              f"eval_split {b:7.1f}, ratio {b / a:.2f} ({len(times['eval_split'])} calls each)", flush=True)
