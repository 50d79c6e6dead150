"""The report: the ``--json`` document and the printed table.

JSON::

    {"config": {"batch", "seq_len", "vocab", "embed_size", "heads", "num_layers", ...},
     "results": {"forward":         {"torch_eager_ms", "torch_compile_ms", "flax_jit_ms",
                                     "torch_eager_over_flax", "torch_compile_over_flax"},
                 "train_step":      {...},
                 "decode":          {...: greedy decoding with a KV cache on every side},
                 "decode_uncached": {...: seed 001's decoding, the prefix again per token}},
     "matmul_peak_gflops": <the best of the libraries' peaks: the machine's measured peak>,
     "matmul_peak_gflops_by_library": {"torch": ..., "jax": ...},
     "paths": [every path in full, with fraction_of_peak (of its own library's peak),
               fraction_of_machine_peak (of the best) and tokens_per_s (see tokens_per_call)],
     "environment": {"machine": {cpu model, family, ISA, cores, memory, library versions,
                                 BLAS/GEMM backends}, ...}, "load_average": {...}}

A run has one Flax path: ``flax_jit``, or with ``--scan-layers`` / ``--remat`` the same jitted
steps over another layer layout (``flax_jit_scan``, ``flax_jit_remat``, ``flax_jit_scan_remat``;
``config`` records ``scan_layers`` and ``remat``). Its times fill ``flax_jit_ms`` whatever its
layout, so the ratios are always against the Flax path that ran, and ``flax_path`` names it.

Ratios are torch time / Flax time (> 1: Flax is faster), measured in one run. The targets
they are held to, and the machines they were measured on, are in docs/benchmarks.md: a
ratio holds for the CPU it was measured on.
"""

from benchmarks import code_version, machine

# results group of each op
_GROUPS = {"forward": "forward", "train_step": "train_step", "decode_cached": "decode",
           "decode_uncached": "decode_uncached"}
_VARIANTS = ("torch_eager", "torch_compile", "flax_jit")

LABELS = {"torch_eager": "torch eager", "torch_compile": "torch compile", "flax_jit": "flax jit",
          "flax_jit_scan": "flax jit scan", "flax_jit_remat": "flax jit remat",
          "flax_jit_scan_remat": "flax scan remat"}


def _is_flax(variant):
    return variant.startswith("flax_jit")  # benchmarks.flax_bench.variant: flax_jit[_scan][_remat]


def tokens_per_call(preset, op):
    """The tokens one call of ``op`` processes, for tokens/s: target tokens (B * T, fairseq's
    "wps" convention; the source holds as many, S = T) for the forward pass and the train
    step, and new tokens (B * N) for decoding."""
    return preset.batch * (preset.new_tokens if op.startswith("decode") else preset.seq_len)


def _path_dict(r, peaks, preset):
    peak = peaks.get(r.library, {}).get("best_gflops")
    best = max((p["best_gflops"] for p in peaks.values()), default=None)
    tokens = tokens_per_call(preset, r.op)
    return {
        "op": r.op, "variant": r.variant, "library": r.library,
        "median_ms": r.median_s * 1e3, "best_ms": r.best_s * 1e3, "times_ms": [t * 1e3 for t in r.times_s],
        "first_call_s": r.first_call_s, "first_call_overhead_s": r.first_call_overhead_s,
        "gflop": r.flops / 1e9, "gflops_per_s": r.gflops_per_s,
        "fraction_of_peak": None if not peak else r.gflops_per_s / peak,
        "fraction_of_machine_peak": None if not best else r.gflops_per_s / best,
        "tokens_per_call": tokens, "tokens_per_s": tokens / r.median_s,
        "memory": r.memory, "notes": r.notes, **r.info,
    }


def ranges_overlap(a, b):
    """Whether two paths' timed rounds overlap (slowest of one >= fastest of the other): their
    ratio of medians then says less than the run's own spread, and is not a verdict."""
    return min(a) <= max(b) and min(b) <= max(a)


def build(preset, env, peaks, results, load, wall_s, argv=(), complete=True):
    c = preset.model
    paths = [_path_dict(r, peaks, preset) for r in results]
    res = {group: {f"{v}_ms": None for v in _VARIANTS} for group in _GROUPS.values()}
    times = {}
    for p in paths:
        group, variant = _GROUPS[p["op"]], ("flax_jit" if _is_flax(p["variant"]) else p["variant"])
        res[group][f"{variant}_ms"] = p["median_ms"]
        times[group, variant] = p["times_ms"]
        if variant == "flax_jit":
            res[group]["flax_path"] = p["variant"]
    for name, group in res.items():  # torch time / Flax time (> 1: Flax is faster)
        flax = group["flax_jit_ms"]
        for v in ("torch_eager", "torch_compile"):
            t = group[f"{v}_ms"]
            group[f"{v}_over_flax"] = None if not (t and flax) else t / flax
            group[f"{v}_within_noise"] = None if not (t and flax) else ranges_overlap(
                times[name, v], times[name, "flax_jit"])
    return {
        "config": {
            "preset": preset.name, "batch": preset.batch, "seq_len": preset.seq_len,
            "vocab": c.target_vocab_size, "embed_size": c.embed_size, "heads": c.heads,
            "num_layers": c.num_layers, "max_len": c.max_len, "new_tokens": preset.new_tokens,
            "dropout": c.dropout, "dtype": preset.dtype, "reps": preset.reps,
            "decode_reps": preset.decode_reps, "warmup": preset.warmup, "decode_warmup": preset.decode_warmup,
            "torch_compile_backend": preset.torch_compile_backend,
            "device": preset.device, "attention_impl": preset.attention_impl,
            "scan_layers": preset.scan_layers, "remat": preset.remat,
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
        "complete": complete,  # False: written after an operation, the run went on (runner.run's progress)
    }


# --- the printed table -----------------------------------------------------------------------

_OP_LABELS = {"forward": "forward (eval)", "train_step": "train step", "decode_cached": "decode cached",
              "decode_uncached": "decode uncached"}


def _fmt(x, spec, missing="-"):
    return missing if x is None else format(x, spec)


def _pct(x):
    return _fmt(None if x is None else 100 * x, ">6.1f")


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
        machine.one_line(env["machine"]) + f"; {env['date_utc']}",
        *([f"code: {code_version.describe(env['code'])}"] if "code" in env else []),  # reports before 2026-11-27 lack it
        f"load average (1/5/15 min): start {rep['load_average']['start']}, end {rep['load_average']['end']}",
    ]
    tuned = [f"{k}={env[k]}" for k in ("XLA_FLAGS", "GLIBC_TUNABLES", "JAX_DEFAULT_PRNG_IMPL",
                                       "XLA_PYTHON_CLIENT_PREALLOCATE") if env.get(k)]
    tuned.append("host malloc: " + ("freed memory kept (GLIBC_TUNABLES, flaxformer_mini.malloc_tunables)"
                                    if env.get("keep_freed_memory") else "glibc defaults"))
    lines.append("environment: " + "; ".join(tuned))
    peaks = rep["matmul_peak"]
    if peaks:
        lines.append("matmul peak (best square product): " + "; ".join(
            f"{k} {v['best_gflops']:.0f} GFLOP/s at {v['n']}^2 {v['dtype']} ("
            + ", ".join(f"{r['n']}^2: best {r['best_gflops']:.0f} median {r['median_gflops']:.0f}" for r in v.get("sizes", [v]))
            + ")" for k, v in peaks.items()))
    lines.append("")
    header = (f"{'operation':<16} {'path':<14} {'median ms':>10} {'best ms':>9} {'vs flax':>8} {'GFLOP':>8} {'GFLOP/s':>8} "
              f"{'% peak':>7} {'% mach':>7} {'tok/s':>8} {'cores':>5} {'sys ms':>7} {'1st call s':>10} {'overhead s':>10} {'peak MB':>8}")
    lines += [header, "-" * len(header)]
    flax_ms = {}
    for p in rep["paths"]:
        if _is_flax(p["variant"]):
            flax_ms[p["op"]] = p["median_ms"]
    for p in rep["paths"]:
        ref = flax_ms.get(p["op"])
        vs = None if (ref is None or _is_flax(p["variant"])) else p["median_ms"] / ref
        lines.append(
            f"{_OP_LABELS.get(p['op'], p['op']):<16} {LABELS.get(p['variant'], p['variant']):<14} "
            f"{p['median_ms']:>10.1f} {p['best_ms']:>9.1f} {_fmt(vs, '>7.2f') + ('x' if vs else ''):>8} {p['gflop']:>8.1f} "
            f"{p['gflops_per_s']:>8.1f} {_pct(p['fraction_of_peak']):>7} {_pct(p['fraction_of_machine_peak']):>7} "
            f"{p['tokens_per_s']:>8.0f} {_fmt(p.get('cores_busy'), '>5.2f'):>5} {_fmt(p.get('system_ms_per_call'), '>7.0f'):>7} "
            f"{p['first_call_s']:>10.2f} {p['first_call_overhead_s']:>10.2f} {_fmt(_memory_mb(p), '>8.0f'):>8}")
    lines += [
        "",
        "vs flax: this path's time / the Flax path's for the same operation (one run). GFLOP: what",
        "the path executes (benchmarks/flops.py; uncached decoding recomputes the prefix). % peak: of the same",
        "library's matmul peak; % mach: of this machine's (the best library's) peak. tok/s: target",
        "tokens (B*T) per second, new tokens (B*N) for decoding. cores: process CPU time / wall time",
        "per call; sys ms: of it, kernel time (page faults of freshly allocated memory, mostly).",
        "overhead: first call - median (tracing, compiling). peak MB: resident memory above the",
        "pre-call level during one call (activations, temporaries; not the weights already held).",
    ]
    notes = [f"  {p['op']} {p['variant']}: " + "; ".join(
        p["notes"] + [f"{k}={v}" for k, v in p.items() if k.startswith("graphs_compiled")])
        for p in rep["paths"] if p["notes"] or any(k.startswith("graphs_compiled") for k in p)]
    if notes:
        lines += ["notes:"] + notes
    xla = [p for p in rep["paths"] if isinstance(p.get("xla_memory_mb"), dict)]
    for p in xla:
        m = p["xla_memory_mb"]
        lines.append(f"  {p['op']} {p['variant']}: XLA compile {p.get('xla_compile_s', 0):.1f} s (trace+lower "
                     f"{p.get('trace_lower_s', 0):.1f} s); XLA buffers: args {m['arguments']:.0f} MB, temporaries "
                     f"{m['temporaries']:.0f} MB, peak estimate {m['peak_estimate']:.0f} MB")
    where = "this CPU" if rep["environment"]["machine"]["jax"].get("backend", "cpu") == "cpu" else "this device"
    lines += ["", f"ratios (torch time / Flax time; > 1: Flax faster; this run, {where} only; \"within noise\":"
              " the two paths' timed rounds overlap):"]
    if cfg["reps"] < 2:
        lines.append(f"  (a smoke run: {cfg['reps']} timed call per path, too few to tell a ratio from noise)")

    def ratio(r, v):
        noise = " (within noise)" if r.get(f"{v}_within_noise") else ""
        return f"{_fmt(r[f'{v}_over_flax'], '.2f')}x{noise}"

    for group, r in rep["results"].items():
        if r["flax_jit_ms"] is not None:
            lines.append(f"  {group:<16} torch eager {ratio(r, 'torch_eager')}, torch.compile {ratio(r, 'torch_compile')}"
                         + ("" if r.get("flax_path", "flax_jit") == "flax_jit" else f" (against {r['flax_path']})"))
    lines.append(f"\ntotal wall time {rep['wall_s']:.0f} s")
    return "\n".join(lines)
