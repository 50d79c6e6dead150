"""The report: the ``--json`` document, the printed table and the issue's targets.

JSON (extra keys beyond the issue's schema are additions, never renames)::

    {"config": {"batch", "seq_len", "vocab", "embed_size", "heads", "num_layers", ...},
     "results": {"forward":    {"torch_eager_ms", "torch_compile_ms", "flax_jit_ms", ...},
                 "train_step": {...},
                 "decode":     {"torch_eager_ms", "torch_compile_ms", "flax_jit_ms",
                                "flax_jit_uncached_ms", ...}},
     "matmul_peak_gflops": <the best of the libraries' peaks>,
     "matmul_peak_gflops_by_library": {"torch": ..., "jax": ...},
     "targets": [...], "paths": [every path in full], "environment": {...}, "load_average": {...}}

``results.decode.flax_jit_ms`` is the default (cached) ``greedy_decode``; the torch decode
times are seed 001's uncached loop, torch_ref's only decoder.
"""

# The issue's CPU speed targets: (text, results group, torch variant, the least torch/Flax
# time ratio that meets it, whether the ratio must exceed it strictly).
TARGETS = (
    ("Flax train step >= 1.5x faster than torch eager", "train_step", "torch_eager", 1.5, False),
    ("Flax train step faster than torch.compile", "train_step", "torch_compile", 1.0, True),
    ("Flax forward >= 2.5x faster than torch eager", "forward", "torch_eager", 2.5, False),
)
PEAK_TARGET = 0.65  # Flax train step at >= 65% of the measured (JAX) matmul peak
COMPILE_TARGET_S = 30.0  # first-step compile of the train step

# results key of each op, and of each (op, variant) inside it
_RESULT_KEYS = {
    ("forward", "torch_eager"): ("forward", "torch_eager_ms"),
    ("forward", "torch_compile"): ("forward", "torch_compile_ms"),
    ("forward", "flax_jit"): ("forward", "flax_jit_ms"),
    ("train_step", "torch_eager"): ("train_step", "torch_eager_ms"),
    ("train_step", "torch_compile"): ("train_step", "torch_compile_ms"),
    ("train_step", "flax_jit"): ("train_step", "flax_jit_ms"),
    ("decode_uncached", "torch_eager"): ("decode", "torch_eager_ms"),
    ("decode_uncached", "torch_compile"): ("decode", "torch_compile_ms"),
    ("decode_cached", "flax_jit"): ("decode", "flax_jit_ms"),
    ("decode_uncached", "flax_jit"): ("decode", "flax_jit_uncached_ms"),
}

LABELS = {"torch_eager": "torch eager", "torch_compile": "torch compile", "flax_jit": "flax jit"}


def _path_dict(r, peaks):
    peak = peaks.get(r.library, {}).get("best_gflops")
    return {
        "op": r.op, "variant": r.variant, "library": r.library,
        "median_ms": r.median_s * 1e3, "best_ms": r.best_s * 1e3, "times_ms": [t * 1e3 for t in r.times_s],
        "first_call_s": r.first_call_s, "first_call_overhead_s": r.first_call_overhead_s,
        "gflop": r.flops / 1e9, "gflops_per_s": r.gflops_per_s,
        "fraction_of_peak": None if not peak else r.gflops_per_s / peak,
        "memory": r.memory, "notes": r.notes, **r.info,
    }


def build(preset, env, peaks, results, load, wall_s, argv=()):
    c = preset.model
    paths = [_path_dict(r, peaks) for r in results]
    by_key = {(p["op"], p["variant"]): p for p in paths}

    res = {"forward": {}, "train_step": {}, "decode": {}}
    for (op, variant), (group, key) in _RESULT_KEYS.items():
        p = by_key.get((op, variant))
        res[group][key] = None if p is None else p["median_ms"]
    # ratios: torch time / Flax time (> 1: Flax is faster)
    for group in ("forward", "train_step", "decode"):
        flax = res[group]["flax_jit_ms"]
        for v in ("torch_eager", "torch_compile"):
            t = res[group][f"{v}_ms"]
            res[group][f"{v}_over_flax"] = None if not (t and flax) else t / flax
    flax_unc, torch_eager_dec = res["decode"]["flax_jit_uncached_ms"], res["decode"]["torch_eager_ms"]
    res["decode"]["torch_eager_over_flax_uncached"] = None if not (flax_unc and torch_eager_dec) else torch_eager_dec / flax_unc

    out = {
        "config": {
            "preset": preset.name, "batch": preset.batch, "seq_len": preset.seq_len,
            "vocab": c.target_vocab_size, "embed_size": c.embed_size, "heads": c.heads,
            "num_layers": c.num_layers, "max_len": c.max_len, "new_tokens": preset.new_tokens,
            "dropout": c.dropout, "dtype": preset.dtype, "reps": preset.reps,
            "decode_reps": preset.decode_reps, "warmup": preset.warmup, "decode_warmup": preset.decode_warmup,
            "torch_compile_backend": preset.torch_compile_backend,
        },
        "results": res,
        "matmul_peak_gflops": max((p["best_gflops"] for p in peaks.values()), default=None),
        "matmul_peak_gflops_by_library": {k: p["best_gflops"] for k, p in peaks.items()},
        "matmul_peak": peaks,
        "paths": paths,
        "environment": env,
        "load_average": load,
        "wall_s": wall_s,
        "argv": list(argv),
    }
    out["targets"] = targets(out)
    return out


def targets(rep):
    """The issue's targets, each with the measured value and met: True/False/None (not measured)."""
    res = rep["results"]
    out = []
    for text, group, variant, least, strict in TARGETS:
        ratio = res[group].get(f"{variant}_over_flax")
        met = None if ratio is None else (ratio > least if strict else ratio >= least)
        out.append({"target": text, "value": ratio, "unit": "x", "met": met})
    train = next((p for p in rep["paths"] if p["op"] == "train_step" and p["variant"] == "flax_jit"), None)
    frac = None if train is None else train["fraction_of_peak"]
    out.append({"target": f"Flax train step >= {PEAK_TARGET:.0%} of the JAX matmul peak", "value": frac,
                "unit": "of peak", "met": None if frac is None else frac >= PEAK_TARGET})
    first = None if train is None else train["first_call_overhead_s"]
    out.append({"target": f"first-call compile of the train step < {COMPILE_TARGET_S:.0f} s", "value": first,
                "unit": "s", "met": None if first is None else first < COMPILE_TARGET_S})
    return out


# --- the printed table -----------------------------------------------------------------------

_OP_LABELS = {"forward": "forward (eval)", "train_step": "train step", "decode_cached": "decode cached",
              "decode_uncached": "decode uncached"}


def _fmt(x, spec, missing="-"):
    return missing if x is None else format(x, spec)


def _memory_mb(p):
    m = p["memory"]
    for key in ("peak_rss_delta_mb", "peak_device_delta_mb", "peak_device_mb_process"):
        if m.get(key) is not None:
            return m[key]
    return None


def format_table(rep):
    cfg, env = rep["config"], rep["environment"]
    lines = [
        f"preset {cfg['preset']}: B={cfg['batch']} S=T={cfg['seq_len']} N={cfg['new_tokens']} D={cfg['embed_size']} "
        f"H={cfg['heads']} L={cfg['num_layers']}+{cfg['num_layers']} V={cfg['vocab']} {cfg['dtype']}, "
        f"train-step dropout {cfg['dropout']}; median of {cfg['reps']} calls after {cfg['warmup']} warm-up "
        f"(decoding: {cfg['decode_reps']} after {cfg['decode_warmup']})",
        f"{env['cpu']}, {env['cpu_count']} cores; torch {env.get('torch')} ({env.get('torch_threads')} threads), "
        f"jax {env['jax']} ({env['jax_backend']}), flax {env['flax']}; {env['date_utc']}",
        f"load average (1/5/15 min): start {rep['load_average']['start']}, end {rep['load_average']['end']}",
    ]
    tuned = [f"{k}={env[k]}" for k in ("XLA_FLAGS", "GLIBC_TUNABLES", "JAX_DEFAULT_PRNG_IMPL") if env.get(k)]
    tuned.append("host malloc: " + ("keep_freed_memory() (flaxformer_mini.host_memory)" if env.get("keep_freed_memory")
                                    else "glibc defaults"))
    lines.append("environment: " + "; ".join(tuned))
    peaks = rep["matmul_peak"]
    if peaks:
        lines.append("matmul peak (best square product): " + "; ".join(
            f"{k} {v['best_gflops']:.0f} GFLOP/s at {v['n']}^2 {v['dtype']} ("
            + ", ".join(f"{r['n']}^2: best {r['best_gflops']:.0f} median {r['median_gflops']:.0f}" for r in v.get("sizes", [v]))
            + ")" for k, v in peaks.items()))
    lines.append("")
    header = (f"{'operation':<16} {'path':<14} {'median ms':>10} {'best ms':>9} {'vs flax':>8} {'GFLOP':>8} {'GFLOP/s':>8} "
              f"{'% peak':>7} {'cores':>5} {'sys ms':>7} {'1st call s':>10} {'overhead s':>10} {'peak MB':>8}")
    lines += [header, "-" * len(header)]
    flax_ms = {}
    for p in rep["paths"]:
        if p["variant"] == "flax_jit":
            flax_ms[p["op"]] = p["median_ms"]
    for p in rep["paths"]:
        # torch decodes only without a cache: compare it with Flax's default, cached decoder
        ref = flax_ms.get("decode_cached" if p["op"].startswith("decode") else p["op"])
        vs = None if (ref is None or p["variant"] == "flax_jit") else p["median_ms"] / ref
        lines.append(
            f"{_OP_LABELS.get(p['op'], p['op']):<16} {LABELS.get(p['variant'], p['variant']):<14} "
            f"{p['median_ms']:>10.1f} {p['best_ms']:>9.1f} {_fmt(vs, '>7.2f') + ('x' if vs else ''):>8} {p['gflop']:>8.1f} "
            f"{p['gflops_per_s']:>8.1f} {_fmt(None if p['fraction_of_peak'] is None else 100 * p['fraction_of_peak'], '>6.1f'):>7} "
            f"{_fmt(p.get('cores_busy'), '>5.2f'):>5} {_fmt(p.get('system_ms_per_call'), '>7.0f'):>7} "
            f"{p['first_call_s']:>10.2f} {p['first_call_overhead_s']:>10.2f} {_fmt(_memory_mb(p), '>8.0f'):>8}")
    lines += [
        "",
        "vs flax: this path's time / flax jit's (decode rows: / flax's cached greedy_decode). GFLOP: what the",
        "path executes (benchmarks/flops.py; uncached decoding recomputes the prefix). % peak: of the same",
        "library's matmul peak. cores: process CPU time / wall time per call; sys ms: of it, kernel time (page",
        "faults of freshly allocated memory, mostly). overhead: first call - median",
        "(tracing, compiling). peak MB: resident memory above the pre-call level during one call",
        "(activations, temporaries; not the weights already held).",
    ]
    notes = [f"  {p['op']} {p['variant']}: " + "; ".join(
        p["notes"] + [f"{k}={v}" for k, v in p.items() if k.startswith("graphs_compiled")])
        for p in rep["paths"] if p["notes"] or any(k.startswith("graphs_compiled") for k in p)]
    if notes:
        lines += ["notes:"] + notes
    xla = [p for p in rep["paths"] if isinstance(p.get("xla_memory_mb"), dict)]
    for p in xla:
        m = p["xla_memory_mb"]
        lines.append(f"  {p['op']} flax_jit: XLA compile {p.get('xla_compile_s', 0):.1f} s (trace+lower "
                     f"{p.get('trace_lower_s', 0):.1f} s); XLA buffers: args {m['arguments']:.0f} MB, temporaries "
                     f"{m['temporaries']:.0f} MB, peak estimate {m['peak_estimate']:.0f} MB")
    lines += ["", "targets:"]
    for t in rep["targets"]:
        mark = {True: "MET ", False: "MISS", None: "n/a "}[t["met"]]
        value = "not measured" if t["value"] is None else (
            f"{100 * t['value']:.1f}%" if t["unit"] == "of peak" else f"{t['value']:.2f} {t['unit']}")
        lines.append(f"  [{mark}] {t['target']}: {value}")
    lines.append(f"\ntotal wall time {rep['wall_s']:.0f} s")
    return "\n".join(lines)
