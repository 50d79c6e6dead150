"""The comparison harness reports every intermediate and names where two models first diverge."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from parity import Row, as_inputs, compare_intermediates, compare_models, sample_batch, transformer_pair
from parity.report import diff


@pytest.fixture
def twins_and_inputs(tiny_config):
    t, f = transformer_pair(tiny_config, seed=0)
    return t, f, as_inputs(*sample_batch(tiny_config, batch=3, seed=0))


def test_report_covers_landmarks_in_execution_order(twins_and_inputs):
    t, f, (ti, fi) = twins_and_inputs
    report = compare_models(t, f, ti, fi)
    names = [r.name for r in report.rows]
    landmarks = ["encoder.dropout", "encoder.transformer_layers.0", "encoder.transformer_layers.1", "encoder",
                 "decoder.dropout", "decoder.decoder_layers.0", "decoder.decoder_layers.1", "decoder.fc", ""]
    positions = [names.index(n) for n in landmarks]
    assert positions == sorted(positions)
    assert report.ok and report.first_divergence is None
    assert all(r.max_abs <= 1e-5 for r in report.rows)


def test_planted_layer_norm_epsilon_fault_is_named_as_first_divergence(twins_and_inputs):
    # One deliberate numerical change in encoder block 1's second LayerNorm: everything
    # before it must still agree, and the report must point at exactly that LayerNorm.
    t, f, (ti, fi) = twins_and_inputs
    f.encoder.transformer_layers[1].norm2.epsilon = 1e-1
    report = compare_models(t, f, ti, fi)
    assert not report.ok
    assert report.first_divergence.name == "encoder.transformer_layers.1.norm2"
    before = report.rows[: report.rows.index(report.first_divergence)]
    assert before and all(r.ok for r in before)
    assert "first divergence: encoder.transformer_layers.1.norm2" in report.format_table()


def test_planted_weight_fault_is_named_at_the_projection(twins_and_inputs):
    t, f, (ti, fi) = twins_and_inputs
    kernel = f.decoder.decoder_layers[0].transformer_block.attention.W_v.kernel
    kernel.set_value(kernel.get_value() * 1.001)
    report = compare_models(t, f, ti, fi)
    assert report.first_divergence.name == "decoder.decoder_layers.0.transformer_block.attention.W_v"


def _strict(constant):
    raise ValueError(f"not strict JSON: {constant}")


def test_report_json_round_trips(twins_and_inputs):
    t, f, (ti, fi) = twins_and_inputs
    report = compare_models(t, f, ti, fi, atol=1e-5)
    data = json.loads(report.to_json(), parse_constant=_strict)
    assert data["ok"] is True and data["atol"] == 1e-5
    assert len(data["rows"]) == len(report.rows)
    assert {"name", "label", "shape", "max_abs", "max_rel", "ok"} <= set(data["rows"][0])


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("a, b, want", [
    ([INF, -INF, 1.0], [INF, -INF, 1.0], (0.0, 0.0)),  # equal infinities: no difference
    ([INF, 2.0], [3.0, 2.0], (INF, INF)),  # an infinity on one side only
    ([INF], [-INF], (INF, INF)),
    ([1.0, 2.0], [1.5, 2.0], (0.5, 0.5 / 1.5)),
])
def test_diff_counts_equal_values_equal_infinities_included_as_no_difference(a, b, want):
    assert diff(np.array(a), np.array(b)) == want == diff(np.array(b), np.array(a))


def test_diff_of_complex_values_counts_the_imaginary_parts():
    # |(1 + 2j) - (1 + 0j)| = 2, relative to max(|1 + 2j|, 1) = sqrt(5); a cast to float64
    # would keep the real parts alone, which are equal.
    assert diff(np.array([1 + 2j, 3 + 0j]), np.array([1 + 0j, 3 + 0j])) == (2.0, 2.0 / np.sqrt(5.0))


def test_complex_rows_that_differ_in_their_imaginary_parts_fail():
    same = np.array([1 + 1j, 2 - 1j], np.complex64)
    report = compare_intermediates({"same": same, "imaginary": same, "nan": np.array([1 + 0j])},
                                   {"same": same.copy(), "imaginary": same + 1j, "nan": np.array([complex(1, NAN)])},
                                   atol=1e-5)
    rows = {r.name: r for r in report.rows}
    assert (rows["same"].ok, rows["same"].max_abs) == (True, 0.0)
    assert (rows["imaginary"].ok, rows["imaginary"].max_abs) == (False, 1.0)
    assert not rows["nan"].ok and rows["nan"].note == "Flax has 1 NaN"
    assert report.first_divergence.name == "imaginary"


@pytest.mark.parametrize("a, b", [([NAN, 1.0], [NAN, 1.0]), ([NAN], [INF]), ([1.0], [NAN])])
def test_diff_of_a_nan_is_nan_beyond_any_tolerance(a, b):
    max_abs, max_rel = diff(np.array(a), np.array(b))
    assert np.isnan(max_abs) and np.isnan(max_rel) and not max_abs <= 1e30


def test_rows_of_equal_infinities_pass_and_non_finite_differences_fail_saying_why():
    big = np.array([[1.0, INF], [-INF, 3.0]], np.float32)
    report = compare_intermediates(
        {"same": big, "one_sided": np.array([1.0, 2.0]), "nan": np.array([NAN, 1.0]), "torch_only": np.ones(2)},
        {"same": big.copy(), "one_sided": np.array([1.0, INF]), "nan": np.array([NAN, 1.0])}, atol=1e-5)
    rows = {r.name: r for r in report.rows}
    assert (rows["same"].ok, rows["same"].max_abs, rows["same"].note) == (True, 0.0, "")
    assert (rows["one_sided"].ok, rows["one_sided"].max_abs) == (False, INF)
    assert rows["one_sided"].note == "Flax has 1 infinity torch does not"
    assert not rows["nan"].ok and rows["nan"].note == "torch has 1 NaN; Flax has 1 NaN"
    assert report.first_divergence.name == "one_sided"
    assert "one_sided" in report.format_table() and "Flax has 1 infinity torch does not" in report.format_table()


def test_report_json_is_strict_with_null_for_a_non_finite_number_and_the_note_saying_why():
    report = compare_intermediates({"nan": np.array([NAN]), "torch_only": np.ones(2)},
                                   {"nan": np.array([NAN]), "flax_only": np.ones(3)}, atol=1e-5)
    report.rows.append(Row("hand_made", (), INF, NAN, False))  # a Row built without a note
    data = json.loads(report.to_json(indent=2), parse_constant=_strict)
    rows = {row["name"]: row for row in data["rows"]}
    assert set(rows) == {"nan", "torch_only", "flax_only", "hand_made"}
    assert all(row["max_abs"] is None and row["max_rel"] is None and not row["ok"] for row in rows.values())
    assert rows["nan"]["note"] == "torch has 1 NaN; Flax has 1 NaN"
    assert rows["torch_only"]["note"] == "missing on the Flax side"
    assert rows["flax_only"]["note"] == "missing on the torch side" and rows["flax_only"]["shape"] == [3]
    assert rows["hand_made"]["note"] == "max_abs is inf, max_rel is nan"
    assert data["first_divergence"] == "nan" and data["ok"] is False
    assert {"name", "label", "kind", "shape", "max_abs", "max_rel", "ok", "note", "at"} == set(rows["nan"])
    assert rows["nan"]["at"] == [0] and rows["torch_only"]["at"] is None
    assert report.rows[0].max_abs != report.rows[0].max_abs  # the Report itself keeps its NaN


def run_cli(capsys, *args):
    """``parity ARGS`` in this process: its exit code and what it printed. The end-to-end
    runs in a subprocess are tests/test_parity_cli.py's; here a start of torch and JAX would
    cost each test seconds of the suite's ten minutes (README)."""
    from parity.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


def test_parity_check_seed_preset_exits_0_with_every_intermediate_within_tolerance(tmp_path, capsys):
    out = tmp_path / "report.json"
    proc = run_cli(capsys, "check", "--preset", "seed", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "encoder.embeddings" in proc.stdout and "logits" in proc.stdout
    assert "intermediates within 1e-05" in proc.stdout
    data = json.loads(out.read_text())
    assert data["ok"] and all(row["max_abs"] <= 1e-5 for row in data["rows"])


def test_parity_check_exits_1_when_tolerance_is_impossible(capsys):
    # --batch 3: twins_and_inputs' batch (the same seeded inputs), whose compiled operations the check reuses.
    proc = run_cli(capsys, "check", "--preset", "tiny", "--batch", "3", "--atol", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "first divergence:" in proc.stdout


@pytest.mark.parametrize("args, message", [(["--preset", "huge"], "unknown preset"), (["--batch", "0"], "--batch must be >= 1, got 0")])
def test_parity_check_exits_2_on_unusable_options(args, message, capsys):
    proc = run_cli(capsys, "check", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
