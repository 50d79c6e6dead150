"""``python -m tools.ablations``: the CPU smoke run of the ablations a GPU lease times
(``bash tools/gpu_items.sh decide``; docs/benchmarks.md, "The ablations").

Properties checked: at the tiny preset, scanned, one repetition, a variant of each mechanism
(a PRNG implementation, a remat policy, a function swapped while the step is traced, a
larger batch in a group of its own) runs in its group's process and is reported with its time,
its share of the run's matmul peak and its memory; GPU-only ones (XLA:GPU flags, cuDNN) are
listed as skipped, not left out; an XLA flag's group runs ``default`` under that flag (a flag
XLA does not know is reported as refused, and the others run on); a budget spent before a
variant starts leaves it listed as not run. No speed is asserted: benchmarks are measurements,
not tests. Every variant at once (``python -m tools.ablations --preset tiny --scan-layers
--reps 1``) takes about 1.5 minutes on a 2-core CPU, each compiling its own step: the suite
runs one of each mechanism (docs/testing.md).

Sizes: the benchmarks' tiny preset (D=30, 5 heads, 1 + 1 layers, B=3, S=T=7).
"""

import contextlib
import io
import json

import pytest

from tools import ablations
from tools.ablation_variants import VARIANTS, Variant

# Stand-ins for the XLA:GPU flag variants, which a CPU cannot run: one flag XLA:CPU knows (set
# to its default value, so the step is the default's), and one it does not. The known one is a
# dump option, which JAX leaves out of its compilation cache's key: the group's process reads
# main's compiled default step from the suite's cache instead of compiling it again.
KNOWN_FLAG = Variant("xla_cpu_known_flag", "a flag XLA:CPU knows, at its default value",
                     group="xla_cpu_known_flag", xla_flags="--xla_dump_max_hlo_modules=-1")
UNKNOWN_FLAG = Variant("xla_unknown_flag", "a flag no XLA knows", group="xla_unknown_flag",
                       xla_flags="--xla_no_such_flag_here=true")
GPU_ONLY = {name for name, v in VARIANTS.items() if v.gpu_only}
# One variant of each mechanism, and two GPU-only ones (listed as skipped). The fused loss stands
# for every variant that swaps a function while the step is traced (`swapped`: the LayerNorm by
# autodiff, the recomputed LayerNorm): each is one more compiled step for the same mechanism.
SMOKE = ["default", "rbg_dropout", "remat_dots", "fused_loss", "attention_cudnn", "batch_x2",
         "xla_dynamic_slice_fusion"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One tiny run of SMOKE's variants and the two flag stand-ins, shared by the tests below:
    each variant's compile is most of its time."""
    out = tmp_path_factory.mktemp("ablations") / "ablations.json"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        for v in (KNOWN_FLAG, UNKNOWN_FLAG):
            patch.setitem(VARIANTS, v.name, v)
        assert ablations.main(["--preset", "tiny", "--scan-layers", "--reps", "1", "--json", str(out), "--variants",
                               *SMOKE, KNOWN_FLAG.name, UNKNOWN_FLAG.name]) == 0
    rep = json.loads(out.read_text())
    rep["printed"] = printed.getvalue()
    return rep


def test_each_mechanisms_variant_is_timed_and_gpu_ones_listed_as_skipped(report):
    names = [r["name"] for r in report["variants"]]
    assert names == [*SMOKE, KNOWN_FLAG.name, UNKNOWN_FLAG.name]
    assert report["complete"] and report["preset"]["scan_layers"] and report["reps"] == 1
    peak = report["matmul_peak"]
    # The peak is the faster of the two sizes timed (the preset's 256 and half of it), which one
    # depends on the machine and its load.
    assert peak["library"] == "jax" and peak["dtype"] == "float32" and peak["n"] in (128, 256) and peak["best_gflops"] > 0
    assert peak["best_gflops"] == pytest.approx(2.0 * peak["n"] ** 3 / min(peak["times_s"]) / 1e9)
    records = {r["name"]: r for r in report["variants"]}
    for name, rec in records.items():
        assert set(ablations.RECORD_KEYS) <= set(rec), name
        assert rec["status"] in ablations.STATUSES, (name, rec["status"])
        if name in GPU_ONLY:
            assert rec["status"] == "skipped" and rec["reason"].startswith("needs a GPU"), (name, rec)
        elif name == "attention_einsum":  # the tiny preset's attention is einsum already
            assert rec["status"] == "skipped" and "einsum already" in rec["reason"]
        elif name == UNKNOWN_FLAG.name:
            assert rec["status"] == "failed" and "XLA refused the flag" in rec["reason"], rec
            assert "xla_no_such_flag_here" in rec["reason"]
        else:
            assert rec["status"] == "measured", (name, rec["reason"])
            assert rec["median_ms"] > 0 and rec["best_ms"] <= rec["median_ms"] and len(rec["times_ms"]) == 1
            assert rec["device_peak_mb"] == "n/a"  # XLA:CPU reports no device memory
            assert rec["gflop_per_step"] > 0 and 0 < rec["fraction_of_peak"]
            assert rec["tflops_per_s"] == pytest.approx(rec["fraction_of_peak"] * peak["best_gflops"] / 1e3)
            assert rec["vs_default"] == pytest.approx(rec["median_ms"] / rec["default_median_ms"])
            assert name == "eval_forward_x3" or rec["xla_temp_mb"] >= 0, name  # the forward path reports none
            assert name in report["printed"]


def test_each_group_ran_in_its_own_process_and_is_compared_within_it(report):
    groups = {g["group"]: g for g in report["groups"]}
    assert list(groups) == ["main", "batch", KNOWN_FLAG.name, UNKNOWN_FLAG.name]
    assert all(groups[g]["exit_code"] == 0 for g in ("main", "batch", KNOWN_FLAG.name))
    assert groups[UNKNOWN_FLAG.name]["exit_code"] != 0  # XLA aborted that process alone
    records = {r["name"]: r for r in report["variants"]}
    main_default = records["default"]["median_ms"]
    assert records["default"]["process"] == "main" and records["default"]["vs_default"] == 1.0
    # A named group (the larger batches, the unscanned step) times default beside its variants:
    # compared with that one.
    assert records["batch_x2"]["batch"] == 6 and records["default"]["batch"] == 3
    assert records["batch_x2"]["process"] == "batch"
    assert records["batch_x2"]["default_median_ms"] != main_default  # its own default (another process)
    assert records["batch_x2"]["gflop_per_step"] == pytest.approx(2 * records["default"]["gflop_per_step"])
    # A flag's group is default under the flag, compared with main's default.
    known = records[KNOWN_FLAG.name]
    assert known["process"] == KNOWN_FLAG.name and known["xla_flags"] == KNOWN_FLAG.xla_flags
    assert known["default_median_ms"] == main_default
    assert known["gflop_per_step"] == records["default"]["gflop_per_step"]


def test_a_spent_budget_leaves_each_variant_listed_as_not_run(tmp_path, monkeypatch):
    # No group starts with under 30 s left: nothing is built, every variant says why. The
    # module's clock advances a second a reading, so the least budget is spent at the first group.
    import itertools
    import time
    import types

    ticks = itertools.count(1000.0)
    clock = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    clock.monotonic = lambda: next(ticks)
    monkeypatch.setattr(ablations, "time", clock)
    out = tmp_path / "a.json"
    assert ablations.main(["--preset", "tiny", "--reps", "1", "--budget-s", "30", "--json", str(out),
                           "--variants", "default", "no_dropout", "batch_x2", "xla_dynamic_slice_fusion"]) == 0
    records = {r["name"]: r for r in json.loads(out.read_text())["variants"]}
    for name in ("default", "no_dropout", "batch_x2"):
        assert records[name]["status"] == "not_run" and "--budget-s 30" in records[name]["reason"], records[name]
    assert records["xla_dynamic_slice_fusion"]["status"] == "skipped"
    # Inside a group: a compile does not start past the deadline either.
    records = {"default": ablations._record("default")}
    ablations.time_group(["default"], None, None, 1, records, deadline=0.0, budget_s=5)
    assert records["default"]["status"] == "not_run" and "given 5 s of it" in records["default"]["reason"]


def test_bad_options_are_refused_before_anything_runs(tmp_path, capsys):
    for argv, message in ((["--budget-s", "0"], "--budget-s must be >= 30 (the least a group needs to start), got 0"),
                          (["--budget-s", "29"], "--budget-s must be >= 30 (the least a group needs to start), got 29"),
                          (["--budget-s", "nan"], "--budget-s must be >= 30 (the least a group needs to start), got nan"),
                          (["--group", "--variants", "default"], "--group writes its results"),
                          (["--json", str(tmp_path / "no" / "a.json")], "does not exist")):
        with pytest.raises(SystemExit) as stop:
            ablations.main(["--preset", "tiny", *argv])
        assert stop.value.code == 2 and message in capsys.readouterr().err, argv


def test_the_list_names_every_variant_and_where_it_runs(capsys):
    assert ablations.main(["--list"]) == 0
    listed = capsys.readouterr().out
    for name, v in VARIANTS.items():
        assert name in listed and v.what in listed
    assert "a group of its own, XLA_FLAGS --xla_gpu_enable_dynamic_slice_fusion=true; GPU only" in listed
