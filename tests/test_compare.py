"""The comparison harness reports every intermediate and names where two models first diverge."""

import json
import subprocess
import sys

import pytest

from parity import as_inputs, compare_models, sample_batch, transformer_pair


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


def test_report_json_round_trips(twins_and_inputs):
    t, f, (ti, fi) = twins_and_inputs
    report = compare_models(t, f, ti, fi, atol=1e-5)
    data = json.loads(report.to_json())
    assert data["ok"] is True and data["atol"] == 1e-5
    assert len(data["rows"]) == len(report.rows)
    assert {"name", "label", "shape", "max_abs", "max_rel", "ok"} <= set(data["rows"][0])


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "parity", *args], capture_output=True, text=True, timeout=300)


def test_parity_check_seed_preset_exits_0_with_every_intermediate_within_tolerance(tmp_path):
    out = tmp_path / "report.json"
    proc = run_cli("check", "--preset", "seed", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "encoder.embeddings" in proc.stdout and "logits" in proc.stdout
    assert "intermediates within 1e-05" in proc.stdout
    data = json.loads(out.read_text())
    assert data["ok"] and all(row["max_abs"] <= 1e-5 for row in data["rows"])


def test_parity_check_exits_1_when_tolerance_is_impossible():
    proc = run_cli("check", "--preset", "tiny", "--atol", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "first divergence:" in proc.stdout


@pytest.mark.parametrize("args, message", [(["--preset", "huge"], "unknown preset"), (["--batch", "0"], "--batch")])
def test_parity_check_exits_2_on_unusable_options(args, message):
    proc = run_cli("check", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
