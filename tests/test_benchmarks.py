"""Smoke test of the benchmark harness: a tiny run completes and reports well-formed numbers.

No speed is asserted: benchmarks are measurements, not tests. torch.compile runs with its
"eager" backend here (dynamo traces, nothing is code-generated), so the compiled paths are
exercised in seconds instead of the minutes inductor needs on 2 cores.
"""

import json
import math
import os
import subprocess
import sys

import jax
import pytest
import torch

import benchmarks.__main__ as benchmarks_main
from benchmarks.__main__ import main

SCHEMA = {
    "config": {"batch", "seq_len", "vocab", "embed_size", "heads", "num_layers"},
    "results": {"train_step", "forward", "decode"},
}
MACHINE = {"cpu", "cores", "memory_gib", "torch", "jax"}
TIMINGS = ("torch_eager_ms", "torch_compile_ms", "flax_jit_ms")


@pytest.fixture
def earlier_objects_out_of_the_collectors_reach():
    """The harness collects garbage before each path it times (benchmarks/measure.py), as it
    should in a process of its own. In a pytest worker the heap also holds everything earlier
    tests imported and compiled, and each ``gc.collect()`` walks it: 60 collections take 19 s
    of these tests' 75 s (AMD EPYC family 25, cProfile). ``gc.freeze()`` moves what exists at
    that point to the permanent generation; what the harness allocates is collected as usual.
    The file alone, same machine: 42 s with the freeze, 59 s without. Only the tests that run
    the harness take it: the fixture's own ``gc.collect()`` takes 0.4-1.1 s in a worker even
    after an earlier freeze (AMD EPYC family 25 model 17), spent on tests that time nothing."""
    import gc

    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _check_schema(rep):
    for key, inner in SCHEMA.items():
        assert inner <= set(rep[key]), f"{key} lacks {inner - set(rep[key])}"
    for op in ("train_step", "forward", "decode"):
        assert set(TIMINGS) <= set(rep["results"][op]), op
    assert rep["config"]["embed_size"] == 30 and rep["config"]["num_layers"] == 1
    assert _positive(rep["matmul_peak_gflops"])
    machine = rep["environment"]["machine"]
    assert MACHINE <= set(machine), MACHINE - set(machine)
    assert machine["cpu"]["model_name"] and machine["cores"] >= 1
    assert machine["torch"]["version"] == torch.__version__ and machine["jax"]["jax"]
    assert machine["jax"]["gemm_kernel"]  # what XLA compiled a matmul to, as docs/benchmarks.md says


def _check_timings(rep, groups=("train_step", "forward", "decode")):
    for op in groups:
        for key in TIMINGS:
            assert _positive(rep["results"][op][key]), (op, key, rep["results"][op][key])
    cfg = rep["config"]
    for path in rep["paths"]:
        for key in ("median_ms", "best_ms", "first_call_s", "gflop", "gflops_per_s", "fraction_of_peak",
                    "fraction_of_machine_peak"):
            assert _positive(path[key]), (path["op"], path["variant"], key, path[key])
        # the machine's peak is the best library's: no path's share of it exceeds its own library's
        assert path["fraction_of_machine_peak"] <= path["fraction_of_peak"]
        assert path["times_ms"] and all(_positive(t) for t in path["times_ms"])
        per_call = cfg["batch"] * (cfg["new_tokens"] if path["op"].startswith("decode") else cfg["seq_len"])
        assert path["tokens_per_call"] == per_call, path["op"]
        assert math.isclose(path["tokens_per_s"], per_call / (path["median_ms"] / 1e3)), path["op"]


def _check_coverage(rep):
    timed = {(p["op"], p["variant"]) for p in rep["paths"]}
    for op in ("forward", "train_step", "decode_cached"):  # the default operations
        for variant in ("torch_eager", "torch_compile", "flax_jit"):
            assert (op, variant) in timed, (op, variant)
    for group in ("forward", "train_step", "decode"):
        r = rep["results"][group]
        for v in ("torch_eager", "torch_compile"):
            assert r[f"{v}_over_flax"] == r[f"{v}_ms"] / r["flax_jit_ms"]


@pytest.mark.usefixtures("earlier_objects_out_of_the_collectors_reach")
def test_tiny_run_times_every_path_and_reports_the_machine(tmp_path, capsys, monkeypatch):
    """One run of ``python -m benchmarks --preset tiny`` (one repetition), in-process: a
    single test, so that pytest-xdist does not run the harness once per worker."""
    # Called with argv, main() does not restart the process under glibc's tunables
    # (flaxformer_mini/malloc_tunables.py): it would replace pytest's process.
    out = tmp_path / "tiny.json"
    threads = torch.get_num_threads()
    written = []  # (complete, operations with a Flax time) at each write of --json
    write_json = benchmarks_main.write_json

    def spy(rep, path):
        written.append((rep["complete"], [op for op, g in rep["results"].items() if g["flax_jit_ms"]]))
        write_json(rep, path)

    monkeypatch.setattr(benchmarks_main, "write_json", spy)
    try:
        assert main(["--preset", "tiny", "--reps", "1", "--torch-compile-backend", "eager", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # the harness uses every core; other tests set their own
    # The report so far after each operation (a run cut short keeps it), then the whole one.
    assert [c for c, _ in written] == [False, False, False, True], written
    assert [len(ops) for _, ops in written] == [1, 2, 3, 3], written
    assert not (tmp_path / "tiny.json.tmp").exists()
    rep = json.loads(out.read_text())
    assert rep["complete"] is True
    _check_schema(rep)
    _check_timings(rep)
    _check_coverage(rep)
    printed = capsys.readouterr().out
    assert "train step" in printed and "ratios" in printed
    assert "a smoke run: 1 timed call per path, too few to tell a ratio from noise" in printed
    assert rep["environment"]["machine"]["cpu"]["model_name"] in printed
    from benchmarks.code_version import code_version, describe

    assert rep["environment"]["code"] == code_version() and f"code: {describe(code_version())}" in printed


@pytest.mark.usefixtures("earlier_objects_out_of_the_collectors_reach")
def test_the_gpu_presets_bfloat16_paths_run_and_are_recorded_as_such():
    """Item (b) of issue 14 runs the ``large`` preset in bfloat16 on a GPU, rarely lent: its
    paths (torch under autocast, Flax with bfloat16 compute and jax.nn.dot_product_attention)
    run here at a tiny size, with ``xla`` attention (cuDNN's is GPU-only; both are the same
    call with another ``implementation``), so CI keeps them working between GPU runs."""
    from benchmarks import report, runner
    from benchmarks.presets import get_bench_preset

    large = get_bench_preset("large")
    # One layer a side: the paths' dtype and attention are what is checked, and a second layer
    # doubles each path's compilation (tests/helpers.py's TINY_RUN).
    preset = large.replace(model=get_bench_preset("tiny").model.replace(num_layers=1), batch=2, seq_len=6, new_tokens=3, reps=1,
                           decode_reps=1, warmup=0, matmul_size=64, device="cpu", attention_impl="xla",
                           torch_compile_backend="eager")
    threads = torch.get_num_threads()
    # JAX's default promotion, as the benchmark runs: under the tests' strict promotion, jax
    # 0.10 cannot compile the bfloat16 gradient of the "xla" attention (flaxformer_mini/model/attention.py).
    try:
        with jax.numpy_dtype_promotion("standard"):
            rep = runner.run(preset, ops=("train_step", "decode_cached"))
    finally:
        torch.set_num_threads(threads)
    assert (rep["config"]["dtype"], rep["config"]["attention_impl"]) == ("bfloat16", "xla")
    assert {p["dtype"] for p in rep["matmul_peak"].values()} == {"bfloat16"}
    assert {(p["op"], p["variant"]) for p in rep["paths"]} == {
        (op, v) for op in ("train_step", "decode_cached") for v in ("torch_eager", "torch_compile", "flax_jit")}
    _check_timings(rep, groups=("train_step", "decode"))
    assert "bfloat16" in report.format_table(rep)


# Each case: preset, paths, the user's XLA_PYTHON_CLIENT_PREALLOCATE (None: unset), the value after.
_SHARE_GPU_CASES = [
    ("large", ["torch_eager", "flax_jit"], None, "false"),  # torch beside JAX on one GPU
    ("large", ["flax_jit"], None, None),  # JAX alone: its preallocation, as JAX's users get it
    ("base", ["torch_eager", "flax_jit"], None, None),  # a CPU preset: nothing to share
    ("large", ["torch_eager", "flax_jit"], "true", "true"),  # the user's choice is kept
]
_SHARE_GPU = """
import json, os, sys
from benchmarks.presets import get_bench_preset
from benchmarks.runner import TORCH_VARIANTS, share_gpu_with_torch
after = []
for preset, paths, by_user, _ in json.loads(sys.argv[1]):
    os.environ.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    if by_user is not None:
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = by_user
    share_gpu_with_torch(get_bench_preset(preset), [p for p in paths if p in TORCH_VARIANTS])
    after.append(os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"))
print(json.dumps(after))
"""


def test_jax_leaves_a_gpu_presets_torch_paths_their_memory():
    """On the H100 (80 GB) JAX's preallocation of 75% leaves the `large` preset's torch eager
    train step out of memory (docs/benchmarks.md, "GPU"). The setting only counts before
    JAX's backend starts, so it is checked in a fresh process, as ``python -m benchmarks``
    starts (one process for all the cases: none of them starts the backend); nothing there
    needs a GPU to decide."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    out = subprocess.run([sys.executable, "-c", _SHARE_GPU, json.dumps(_SHARE_GPU_CASES)], capture_output=True,
                         text=True, check=True, env=env).stdout
    assert json.loads(out) == [expected for *_, expected in _SHARE_GPU_CASES]


def test_a_backend_started_before_the_benchmark_is_warned_about_not_changed(monkeypatch, capsys):
    from benchmarks.presets import get_bench_preset
    from benchmarks.runner import share_gpu_with_torch

    jax.devices()  # this pytest worker's backend has started
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    share_gpu_with_torch(get_bench_preset("large"), ["torch_eager"])
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in capsys.readouterr().err


def test_flop_counts_follow_the_documented_formula():
    """benchmarks.flops on the base model: the total worked out by hand from the formula in
    its docstring (every Linear 2*in*out per token, attention 4*T*S*D per sequence)."""
    from benchmarks import flops
    from flaxformer_mini.model.config import get_preset

    base = get_preset("base")
    assert flops.train_step(base, 16, 64, 64) == 3 * flops.forward(base, 16, 64, 64)
    assert flops.forward(base, 16, 64, 64) == 55_004_102_656  # worked out in benchmarks/flops.py
    # decoding: the cached algorithm does one forward's worth of work, the uncached ones more
    assert flops.decode_cached(base, 16, 64, 64) < flops.decode_uncached_growing(base, 16, 64, 64) \
        < flops.decode_uncached_fixed(base, 16, 64, 64)


@pytest.mark.parametrize("ffn_dim", [None, 50], ids=["seed_F_equals_D", "ffn_dim_50"])
def test_forward_flops_equal_torchs_flop_counter_on_the_torch_twin(ffn_dim):
    """An independent count: torch's FlopCounterMode over torch_ref's forward (its matmuls,
    2 FLOPs a multiply-add, biases not counted, as in benchmarks/flops.py). With ffn_dim != D
    an analytic count that used F = D would come out 13% low here."""
    from torch.utils.flop_counter import FlopCounterMode

    import torch_ref
    from benchmarks import flops
    from flaxformer_mini.model.config import get_preset
    from parity import sample_batch

    config = get_preset("tiny").replace(ffn_dim=ffn_dim)  # D 30
    source, target = sample_batch(config, batch=3, seed=0, source_len=7, target_len=5)
    model = torch_ref.Transformer(**config.to_dict()).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.from_numpy(source), torch.from_numpy(target))
    assert counter.get_total_flops() == flops.forward(config, 3, 7, 5)


def test_a_ratio_is_within_noise_when_the_paths_timed_rounds_overlap():
    from benchmarks.report import ranges_overlap

    # A Zen 4 train step's rounds (ms, docs/benchmarks.md): Flax's spread over torch eager's.
    assert ranges_overlap([1643, 1130, 1404, 1224, 1357], [1186, 1237, 1375, 1210, 1290])
    assert ranges_overlap([1.0, 2.0], [2.0, 3.0])  # touching counts
    assert not ranges_overlap([880, 882, 889, 895], [1010, 1025, 1031])  # the Xeon's: a clear gap
    assert not ranges_overlap([1010, 1025], [880, 895])


@pytest.mark.usefixtures("earlier_objects_out_of_the_collectors_reach")
def test_every_round_but_the_last_logs_the_medians_so_far(monkeypatch, capsys):
    """A benchmark stopped by a time limit (a lent GPU's minutes) keeps in its log what it
    had measured. Timed on a clock of its own: path a takes 10 ms a call, path b 30 ms, then
    50 ms from its third call on."""
    from benchmarks import measure

    clock = [0.0]
    calls = {"a": 0, "b": 0}

    def run(name):
        calls[name] += 1
        clock[0] += 0.010 if name == "a" else (0.030 if calls[name] <= 3 else 0.050)

    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])
    paths = [measure.Path("train_step", name, "jax", lambda name=name: run(name), flops=1.0,
                          probe=lambda run: {}) for name in ("a", "b")]
    results = measure.measure(paths, reps=3, warmup=0, pause_s=0)
    rounds = [line.split("] ", 1)[1] for line in capsys.readouterr().err.splitlines() if "medians so far" in line]
    # b's timed calls are its 2nd, 3rd and 4th: 30, 30, then 50 ms.
    assert rounds == ["round 1/3, medians so far: train_step a 10.0 ms, train_step b 30.0 ms",
                      "round 2/3, medians so far: train_step a 10.0 ms, train_step b 30.0 ms"]
    assert [r.times_s for r in results] == [pytest.approx([0.01] * 3), pytest.approx([0.03, 0.03, 0.05])]


def test_a_scanned_flax_path_is_the_one_the_ratios_are_against():
    """``--scan-layers``: the run's one Flax path is ``flax_jit_scan``; its times fill
    ``flax_jit_ms`` (the ratios are against it) and ``flax_path`` and ``config`` name it."""
    from benchmarks import report
    from benchmarks.__main__ import parse_args, preset_from_args
    from benchmarks.measure import Result

    preset = preset_from_args(parse_args(["--preset", "tiny", "--scan-layers"]))
    assert (preset.scan_layers, preset.remat) == (True, False)
    assert preset_from_args(parse_args(["--preset", "tiny"])).scan_layers is False  # the preset's own

    def result(variant, library, times_s):
        return Result(op="train_step", variant=variant, library=library, flops=4e9, first_call_s=1.0,
                      times_s=times_s, memory={}, notes=[], info={})

    results = [result("torch_eager", "torch", [0.30, 0.31, 0.32]), result("flax_jit_scan", "jax", [0.20, 0.21, 0.22])]
    peaks = {"jax": {"best_gflops": 40.0}, "torch": {"best_gflops": 40.0}}
    rep = report.build(preset, {"machine": {}}, peaks, results, {"start": None, "end": None}, 1.0)
    group = rep["results"]["train_step"]
    assert (group["flax_jit_ms"], group["flax_path"]) == (pytest.approx(210.0), "flax_jit_scan")
    assert group["torch_eager_over_flax"] == pytest.approx(310 / 210)
    assert group["torch_eager_within_noise"] is False
    assert (rep["config"]["scan_layers"], rep["config"]["remat"]) == (True, False)
    assert [p["fraction_of_peak"] for p in rep["paths"]] == [pytest.approx(4 / 0.31 / 40), pytest.approx(4 / 0.21 / 40)]


def test_the_base_preset_is_the_issues():
    from benchmarks.presets import get_bench_preset

    base = get_bench_preset("base")
    c = base.model
    assert (c.embed_size, c.heads, c.num_layers, c.target_vocab_size, base.batch, base.seq_len) == (512, 8, 6, 1000, 16, 64)
    assert base.new_tokens == 64 and c.max_len >= base.new_tokens
    large = get_bench_preset("large")
    assert (large.model.embed_size, large.model.heads, large.model.num_layers, large.seq_len, large.dtype) == \
        (1024, 16, 12, 512, "bfloat16")


@pytest.mark.usefixtures("earlier_objects_out_of_the_collectors_reach")
def test_scaling_quick_reports_every_path_at_every_point(tmp_path, capsys, monkeypatch):
    """``python -m benchmarks.scaling --quick`` on one sweep: a row per point and path (the
    scanned-layers path included), with a time, a memory reading and a compile time; the table
    and the plot are written. At one depth, 1, given with ``--values``: each point costs every
    Flax path a compilation (a stack of one layer is still scanned; the scanned numerics are
    tests/test_scanned_layers.py's), and a second depth runs the same code again. The point has
    the tiny run's batch and length (the benchmarks' tiny preset, whose model the quick sweep
    uses), so its unscanned train step is the tiny run's program, read from the suite's
    compilation cache: the sweep's sizes are none of the properties here."""
    from benchmarks import scaling
    from benchmarks.presets import get_bench_preset

    tiny = get_bench_preset("tiny")
    depth = scaling.QUICK["depth"]
    monkeypatch.setitem(scaling.QUICK, "depth", dict(depth, fixed=dict(depth["fixed"], batch=tiny.batch,
                                                                     seq_len=tiny.seq_len)))
    out, png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    threads = torch.get_num_threads()
    try:
        assert scaling.main(["--quick", "--sweeps", "depth", "--values", "1", "--json", str(out), "--plot", str(png)]) == 0
    finally:
        torch.set_num_threads(threads)
    rep = json.loads(out.read_text())
    assert rep["date_utc"].endswith(" UTC") and rep["reps"] == 1 and "code" in rep  # where and when it held
    assert all(len(p["times_ms"]) == 1 and p["times_ms"][0] == pytest.approx(p["median_ms"]) for p in rep["points"])
    depths = (1,)
    assert sorted((p["num_layers"], p["variant"]) for p in rep["points"]) == \
        sorted((d, v) for d in depths for v in scaling.DEFAULT_PATHS)
    for p in rep["points"]:
        assert _positive(p["median_ms"]) and p["peak_mb"] is not None and p["first_call_overhead_s"] >= 0, p
        if p["variant"].startswith("flax"):
            assert _positive(p["xla_compile_s"]) and _positive(p["xla_temp_mb"]), p
    assert png.stat().st_size > 0
    table = capsys.readouterr().out
    assert "| num_layers |" in table and all(f"| {d} |" in table for d in depths)
    assert "--quick: a smoke test of the sweep" in table and rep["date_utc"] in table
    assert [p["compiled_earlier"] for p in rep["points"]] == [False] * len(rep["points"])  # one point: nothing earlier


def test_cpuinfo_names_family_and_the_gemm_isa_extensions():
    """benchmarks.machine reads /proc/cpuinfo's first processor: a Zen 4 excerpt (family 25,
    AVX-512 with bf16, no AMX) gives those fields, in ISA_FLAGS order."""
    from benchmarks import machine

    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
            "model name\t: AMD EPYC 9R14 96-Core Processor\nstepping\t: 1\n"
            "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_bf16 avx512_vnni\n\n"
            "processor\t: 1\nflags\t\t: amx_tile\n")
    info = machine.cpuinfo(text)
    assert info["model_name"] == "AMD EPYC 9R14 96-Core Processor"
    assert (info["family"], info["model"], info["stepping"]) == (25, 17, 1)
    assert info["isa"] == ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"]
    assert info["microarchitecture"] == "Zen 4"  # model 17: EPYC Genoa
    assert machine.cpuinfo(text.replace("model\t\t: 17", "model\t\t: 1"))["microarchitecture"] == "Zen 3"  # Milan
    assert machine.cpuinfo(text.replace("model\t\t: 17", "model\t\t: 176"))["microarchitecture"] == "Zen 3 / Zen 4"


def test_a_gpu_run_names_its_accelerator_first_and_its_ratios_hold_for_that_device():
    # A GPU run's report names its accelerator, not its host's Xeon alone, and its ratios hold
    # for that device, not "this CPU only".
    from benchmarks import machine

    described = {"cpu": {"model_name": "Intel(R) Xeon(R) Processor", "family": 6, "model": 207, "isa": ["avx2"]},
                 "cores": 16, "memory_gib": 125.9, "torch": None,
                 "jax": {"jax": "0.11.2", "jaxlib": "0.11.2", "flax": "0.12.10", "backend": "gpu",
                         "devices": ["cuda:0"], "device_kind": "NVIDIA H100 80GB HBM3", "platform_version": "cuda 13000"}}
    assert machine.one_line(described).startswith("1 x NVIDIA H100 80GB HBM3; host Intel(R) Xeon(R) Processor")
    on_cpu = dict(described, jax=dict(described["jax"], backend="cpu", device_kind="cpu", devices=["TFRT_CPU_0"]))
    assert machine.one_line(on_cpu).startswith("Intel(R) Xeon(R) Processor (family 6, model 207")
    assert machine.describe()["jax"]["device_kind"] == jax.devices()[0].device_kind  # read, not assumed


def test_bad_options_are_refused_before_anything_is_timed(tmp_path, capsys):
    from benchmarks.__main__ import parse_args

    for argv, message in ((["--reps", "0"], "reps must be >= 1, got 0"), (["--warmup", "-1"], "warmup must be >= 0"),
                          (["--json", str(tmp_path)], "is a directory"),
                          (["--json", str(tmp_path / "no" / "r.json")], "does not exist")):
        with pytest.raises(SystemExit) as stop:
            parse_args(["--preset", "tiny", *argv])
        assert stop.value.code == 2 and message in capsys.readouterr().err, argv


def test_the_sweep_and_the_tools_refuse_bad_options_before_running(tmp_path, capsys):
    from benchmarks import scaling
    from tools import ablations, xla_profile

    for command, argv, message in (
            (scaling.main, ["--quick", "--reps", "2"], "--quick times one step per point"),
            (scaling.main, ["--reps", "0"], "--reps must be >= 1, got 0"),
            (scaling.main, ["--quick", "--plot", str(tmp_path / "no" / "p.png")], "--plot"),
            (ablations.main, ["--preset", "tiny", "--reps", "0"], "--reps must be >= 1, got 0"),
            (xla_profile.main, ["--preset", "tiny", "--steps", "0"], "--steps must be >= 1, got 0")):
        with pytest.raises(SystemExit) as stop:
            command(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err, argv


def test_a_report_that_cannot_be_written_leaves_no_partial_file(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()  # a directory where the file would go: the rename fails
    with pytest.raises(OSError):
        benchmarks_main.write_json({"a": 1}, str(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no taken.tmp left


@pytest.mark.parametrize("finished", [0, 1])
def test_ctrl_c_ends_the_benchmark_with_one_line_saying_what_was_kept(tmp_path, monkeypatch, capsys, finished):
    from benchmarks import runner

    def interrupted(preset, progress=None, **kw):
        for _ in range(finished):
            progress({"complete": False})
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", interrupted)
    out = tmp_path / "r.json"
    assert main(["--preset", "tiny", "--json", str(out)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    if finished:
        assert err == [f"interrupted: {out} holds the operations finished before it"]
        assert json.loads(out.read_text()) == {"complete": False}
    else:
        assert err == ["interrupted: no operation had finished: nothing written"] and not out.exists()


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                   check=True, capture_output=True)


def test_the_code_is_named_by_its_checkouts_commit_and_a_change_to_the_measured_code_is_marked(monkeypatch):
    """A report says which code it measured: two runs of one machine that differ by 14 points
    of peak (docs/benchmarks.md, the Zen 4's) could not be told apart by code without it."""
    import tempfile
    from importlib import metadata

    from benchmarks.code_version import COMMIT_ENV, code_version, describe

    monkeypatch.delenv(COMMIT_ENV, raising=False)  # set where a GPU run names its commit
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "checkout")
        os.makedirs(os.path.join(repo, "sub"))
        os.makedirs(os.path.join(repo, "flaxformer_mini"))
        _git(repo, "init", "-q")
        code, doc = os.path.join(repo, "flaxformer_mini", "a.py"), os.path.join(repo, "notes.md")
        for path in (code, doc):
            with open(path, "w") as f:
                f.write("x = 1\n")
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", "a")
        head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        assert code_version(repo) == {"commit": head, "modified": False}
        assert describe(code_version(repo)) == f"commit {head[:7]}"
        with open(os.path.join(repo, "flaxformer_mini", "new.py"), "w") as f:  # untracked: nothing imports it
            f.write("y = 2\n")
        with open(doc, "w") as f:  # a document edited: no number changes
            f.write("x = 2\n")
        assert code_version(repo) == {"commit": head, "modified": False}
        with open(code, "w") as f:
            f.write("x = 2\n")
        assert code_version(repo) == {"commit": head, "modified": True}
        assert describe(code_version(repo)) == f"commit {head[:7]} (with uncommitted changes)"
        # A copy inside another repository (a virtual environment in a clone), and no repository
        # at all: the installed package's version, not some other repository's commit.
        installed = {"package": metadata.version("flaxformer-mini")}
        assert code_version(os.path.join(repo, "sub")) == installed
        assert code_version(tmp) == installed
        assert describe(installed) == f"flaxformer-mini {installed['package']}"
        # A copy without .git (the GPU machine's): the commit its caller names, its changes unknown.
        monkeypatch.setenv(COMMIT_ENV, head)
        assert code_version(tmp) == {"commit": head, "modified": None}
        assert describe(code_version(tmp)) == f"commit {head[:7]} (as {COMMIT_ENV} says; no checkout to check it)"
        assert code_version(repo) == {"commit": head, "modified": True}  # a checkout reads its own
        # A checkout git refuses (another user's, read as root): named as such, not as the package.
        monkeypatch.setenv("GIT_DIR", os.path.join(tmp, "no-such-git-dir"))
        refused = code_version(repo)
        assert refused["commit"] is None and refused["error"] and describe(refused).startswith("commit unknown (git: ")


def _report(date, cpu_model, preset="base", train=(0.98, 1.05), fraction=0.66, **extra):
    return {"environment": {"date_utc": date, "machine": {"cpu": {"model_name": "AMD EPYC", "family": 25,
                                                                  "model": cpu_model}}},
            "config": {"preset": preset},
            "results": {"train_step": {"flax_jit_ms": 1000.0, "torch_eager_over_flax": train[0],
                                       "torch_compile_over_flax": train[1]}},
            "paths": [{"op": "train_step", "variant": "flax_jit", "fraction_of_peak": fraction}], **extra}


def test_a_run_is_printed_beside_the_committed_runs_of_its_cpu_model_and_preset(tmp_path):
    """A ratio holds for its CPU and moves between runs on it: a reader's run of a CPU the
    project measured is shown beside those runs (benchmarks/earlier_runs.py), and beside no
    other CPU's or preset's."""
    from benchmarks import earlier_runs

    files = {
        "a.json": _report("2026-11-25 13:26 UTC", 17, train=(0.96, 0.97), fraction=0.60),  # no "complete": older
        "b.json": _report("2026-11-27 15:32 UTC", 17, train=(1.02, 1.06), fraction=0.74, complete=True),
        "zen3.json": _report("2026-11-27 06:57 UTC", 1, complete=True),  # another model number
        "large.json": _report("2026-11-26 02:16 UTC", 17, preset="large", complete=True),
        "cut.json": _report("2026-11-27 15:00 UTC", 17, complete=False),  # a run stopped midway
        "sweep.json": {"machine": {}, "points": []},  # a scaling sweep: not a report
    }
    for name, rep in files.items():
        (tmp_path / name).write_text(json.dumps(rep))
    (tmp_path / "torn.json").write_text("{")
    mine = _report("2026-11-28 09:00 UTC", 17)
    assert [name for name, _ in earlier_runs.find(mine, tmp_path)] == ["a.json", "b.json"]  # by date
    lines = earlier_runs.format_lines(mine, tmp_path)
    assert lines[0].startswith("this CPU (AMD EPYC, family 25 model 17) measured before, preset base")
    assert lines[1:] == [
        "  this run         train_step 0.98x / 1.05x; Flax % of JAX peak: train_step 66%",
        "  2026-11-25 13:26 UTC  train_step 0.96x / 0.97x; Flax % of JAX peak: train_step 60%  (a.json)",
        "  2026-11-27 15:32 UTC  train_step 1.02x / 1.06x; Flax % of JAX peak: train_step 74%  (b.json)"]
    assert earlier_runs.format_lines(_report("2026-11-28 09:00 UTC", 2), tmp_path) == []  # a CPU not measured
    assert earlier_runs.format_lines(mine, tmp_path / "absent") == []  # an installed copy: no docs folder


def test_a_second_timing_run_on_the_host_is_refused_naming_the_first(tmp_path, monkeypatch):
    # Two benchmarks at once each measure the other's load, and neither report could tell.
    from benchmarks import one_at_a_time

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from benchmarks import one_at_a_time as o; "
         "o.hold_the_machine(sys.argv[1]); print('held', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(one_at_a_time, "_HELD", [])  # this process holds none
        with pytest.raises(one_at_a_time.BusyError, match=f"another benchmark is timing on this host "
                                                          f"\\(pid {holder.pid}\\)"):
            one_at_a_time.hold_the_machine(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    one_at_a_time.hold_the_machine(str(tmp_path))  # its end released the lock
    assert len(one_at_a_time._HELD) == 1
    os.close(one_at_a_time._HELD.pop())


def test_a_sweep_point_that_repeats_earlier_shapes_is_marked_as_compiled_there():
    # The quick sweep's batch=2 point has the length sweep's shapes: its 0.1 s "first-call
    # overhead" is no compile, which the column would otherwise seem to say.
    from benchmarks import scaling

    rep = {"sweeps": {"batch": {"axis": "batch", "fixed": {"seq_len": 4, "num_layers": 1}}},
           "points": [{"sweep": "batch", "batch": b, "seq_len": 4, "num_layers": 1, "variant": "flax_jit",
                       "median_ms": 10.0, "peak_mb": 5, "first_call_overhead_s": 4.4 if b == 1 else 0.1,
                       "compiled_earlier": b == 2} for b in (1, 2)]}
    table = scaling.markdown(rep)
    assert "| 1 | 10 / 5 / 4.4 |" in table and "| 2 | 10 / 5 / 0.1* |" in table
    assert "compiled there, so this overhead holds no compile" in table
    rep["points"][1]["compiled_earlier"] = False
    assert "*" not in scaling.markdown(rep)
