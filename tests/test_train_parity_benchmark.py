"""Smoke test of ``python -m benchmarks.train_parity``: the synthetic task, the tiny preset, a
handful of steps, both twins from the same converted weights at dropout 0.

No speed is asserted (benchmarks are measurements). What is asserted: the report's schema, and
that the two twins' curves agree, step for step, within the tolerance of the 20-step training
parity test (tests/test_training_parity.py): the same widths (the tiny preset's), the same task
(reverse), Adam with clipping; here the vocabulary (16), the lengths and one layer a side (the
twins' depth is that test's) are the benchmark's.
"""

import copy
import json
import math

import numpy as np
import pytest
import torch

from benchmarks import train_parity
from conftest import ATOL

STEPS, EVAL_EVERY = 6, 3


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_parity")
    threads = torch.get_num_threads()
    try:
        # Called with argv: no host lock (the suite's workers run side by side). One torch
        # thread: the suite's workers have a core each (conftest).
        assert train_parity.main(["--task", "reverse", "--preset", "tiny", "--layers", "1", "--dropout", "0",
                                  "--steps", str(STEPS), "--eval-every", str(EVAL_EVERY), "--seeds", "3",
                                  "--batch-size", "8", "--valid-size", "16", "--max-len", "8", "--target-wer", "1.0",
                                  "--target-per", "0.0", "--warmup", "2", "--torch-threads", "1", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    png = (out / train_parity.PLOT_NAME).read_bytes()
    return json.loads((out / train_parity.JSON_NAME).read_text()), png


def test_the_report_has_every_key_and_names_the_machine_and_the_code(report):
    rep, png = report
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert {"benchmark", "date_utc", "machine", "code", "load_average", "recipe", "seeds", "summary"} <= set(rep)
    assert rep["machine"]["cpu"]["model_name"] and rep["machine"]["cores"] >= 1
    assert rep["code"].get("commit") or rep["code"].get("package")
    assert set(rep["load_average"]) == {"start", "after_seed_3", "end"}
    r = rep["recipe"]
    assert r["model"]["embed_size"] == 30 and r["model"]["num_layers"] == 1
    assert r["model"]["dropout"] == 0.0 and r["model"]["max_len"] == 9
    assert r["train"]["seed"] == 3 and r["steps"] == STEPS and r["eval_examples"] == 16
    assert r["parameters"] > 0
    assert list(rep["seeds"]) == ["3"]
    assert rep["argv"][:4] == ["--task", "reverse", "--preset", "tiny"]
    s = rep["seeds"]["3"]
    assert len(s["tokens"]) == STEPS and all(n > 0 for n in s["tokens"])
    assert s["batch_shapes"] == [[8, 9, 9]]  # the task pads every batch to max_len: one shape
    for twin in ("flax", "torch"):
        t, c = s[twin], s["curves"][twin]
        for key in ("train_s", "median_step_ms", "target_tokens_per_s", "target_tokens_per_s_steady", "eval_s"):
            assert _positive(t[key]), (twin, key)
        assert t["target_tokens"] == sum(s["tokens"])
        assert math.isclose(t["target_tokens_per_s"], t["target_tokens"] / t["train_s"])
        assert math.isclose(t["train_s"], sum(c["step_s"]))
        assert 0 < t["first_shape_s"] < t["train_s"]  # the first step alone: one batch shape
        assert len(c["loss"]) == len(c["grad_norm"]) == len(c["learning_rate"]) == len(c["step_s"]) == STEPS
        assert [e["step"] for e in c["evals"]] == [0, 3, 6]
        assert set(train_parity.EVAL_METRICS) <= set(c["evals"][-1])
        assert t["final"]["step"] == STEPS
        # WER <= 1.0 holds before any training: reached at step 0 after 0 s; a PER of 0 is not
        # reached by an untrained tiny model.
        assert t["time_to_target"] == {"wer": {"train_s": 0.0, "step": 0}, "per": None}
    summary = rep["summary"]
    assert summary["flax_wer_within_seed_spread"] is None  # one seed: no spread to judge by
    assert summary["figure_to_beat_target_tokens_per_s"] == max(summary["target_tokens_per_s"].values())


def test_at_dropout_0_both_curves_agree_step_for_step(report):
    """Same weights, same batches, no randomness left: the training losses, gradient norms and
    learning rates agree to ATOL (1e-5) at every step, the tolerance of
    tests/test_training_parity.py (its 20 steps of the tiny preset on this task: 7.2e-7 at most
    for the losses; 9.5e-7 here over 20 steps, AMD EPYC family 25 model 17). A twin that trained
    on other batches, with another schedule or from other weights would part by far more: the
    loss falls by about 0.1 a step here (3.10 to 2.60 over the 6 steps, seed 3)."""
    rep, _ = report
    curves = rep["seeds"]["3"]["curves"]
    f, t = curves["flax"], curves["torch"]
    np.testing.assert_allclose(f["loss"], t["loss"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(f["grad_norm"], t["grad_norm"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(f["learning_rate"], t["learning_rate"], rtol=1e-6, atol=0)
    assert f["loss"][0] - f["loss"][-1] > 0.1  # it trains: the agreement is not that of two idle curves
    assert rep["seeds"]["3"]["loss_curves"]["max_abs_diff"] <= ATOL
    for ef, et in zip(f["evals"], t["evals"]):
        assert ef["step"] == et["step"]
        assert abs(ef["loss"] - et["loss"]) <= ATOL  # teacher-forced, on the held-out sequences
        # Greedy decoding picks the same tokens (tests/test_parity_decode.py) when the logits are this
        # close, so the decoded scores are equal, not close.
        for key in ("exact_match", "word_error_rate", "token_error_rate", "cer"):
            assert ef[key] == et[key], (ef["step"], key)


def test_time_to_target_is_the_training_time_at_the_first_evaluation_that_reaches_it():
    evals = [{"step": 0, "train_s": 0.0, "word_error_rate": 1.0}, {"step": 10, "train_s": 4.0, "word_error_rate": 0.6},
             {"step": 20, "train_s": 9.0, "word_error_rate": 0.4}, {"step": 30, "train_s": 13.0, "word_error_rate": 0.5}]
    assert train_parity.time_to_target(evals, "word_error_rate", 0.5) == {"train_s": 9.0, "step": 20}
    assert train_parity.time_to_target(evals, "word_error_rate", 0.6) == {"train_s": 4.0, "step": 10}
    assert train_parity.time_to_target(evals, "word_error_rate", 0.3) is None


def _seed(flax_wer, torch_wer):
    def twin(wer, rate):
        final = {"word_error_rate": wer, "token_error_rate": wer / 4, "exact_match": 1 - wer, "loss": 1.0}
        return {"final": final, "target_tokens_per_s": rate, "target_tokens_per_s_steady": rate * 1.5}

    return {"flax": twin(flax_wer, 2000.0), "torch": twin(torch_wer, 1000.0)}


def test_the_verdict_allows_a_gap_up_to_the_larger_spread_of_the_seeds():
    # Spreads: flax 0.02, torch 0.04; means: flax 0.33, torch 0.30; gap 0.03 <= 0.04.
    within = train_parity.verdict({"0": _seed(0.32, 0.28), "1": _seed(0.34, 0.32)})
    assert within["allowed_wer_gap"] == pytest.approx(0.04)
    assert within["word_error_rate"]["gap_flax_minus_torch"] == pytest.approx(0.03)
    assert within["flax_wer_within_seed_spread"] is True
    # The same spreads, the Flax twin 0.05 worse on average: outside.
    outside = train_parity.verdict({"0": _seed(0.34, 0.28), "1": _seed(0.36, 0.32)})
    assert outside["flax_wer_within_seed_spread"] is False
    # Better than torch is always within.
    assert train_parity.verdict({"0": _seed(0.20, 0.28), "1": _seed(0.20, 0.28)})["flax_wer_within_seed_spread"]
    assert within["target_tokens_per_s"] == {"flax": 2000.0, "torch": 1000.0}
    assert within["figure_to_beat_target_tokens_per_s"] == 2000.0
    assert within["throughput_flax_over_torch"] == 2.0


def test_bad_options_are_refused_in_one_line_before_anything_runs(tmp_path, capsys):
    (tmp_path / "train.tsv").write_text("a b\tA B\n")
    for argv, said in [(["--data", str(tmp_path)], "no valid.tsv there"),
                       (["--task", "reverse", "--seeds", "1", "1"], "--seeds must be distinct"),
                       (["--task", "reverse", "--target-wer", "1.5"], "must be a rate in [0, 1]"),
                       (["--task", "reverse", "--out", str(tmp_path / "train.tsv")], "is a file"),
                       (["--merge", str(tmp_path / "none.json")], "no such file")]:
        with pytest.raises(SystemExit) as e:
            train_parity.parse_args([*argv, "--steps", "2", "--eval-every", "1"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert said in err, err
    with pytest.raises(SystemExit):
        train_parity.parse_args(["--task", "reverse", "--eval-every", "1"])
    assert "--steps is required to train" in capsys.readouterr().err


def _as_seed(rep, seed, wer_shift):
    """``rep``'s one seed as another seed's run, its final WERs moved by ``wer_shift``."""
    other = copy.deepcopy(rep)
    (s,) = other["seeds"].values()
    for twin in ("flax", "torch"):
        s[twin]["final"]["word_error_rate"] += wer_shift
    other["seeds"] = {str(seed): s}
    other["recipe"]["seeds"], other["recipe"]["train"]["seed"] = [seed], seed
    other["load_average"] = {"start": [9.0, 9.0, 9.0], f"after_seed_{seed}": [8.0, 8.0, 8.0], "end": [7.0, 7.0, 7.0]}
    other["date_utc"] = "2026-01-02 03:04 UTC"
    return other


def test_the_printed_summary_of_one_seed_says_what_it_cannot_judge_in_words(report):
    rep, _ = report
    text = train_parity.format_table(rep)
    assert "Flax within the seeds' spread: not judged (one seed has no spread)" in text, text
    apart = rep["seeds"]["3"]["loss_curves"]["first_step_apart_by_1e-3"]
    assert ("never apart by 1e-3" if apart is None else f"apart by 1e-3 from step {apart}") in text
    assert "None" not in text, text


def test_merge_joins_the_seeds_of_runs_made_apart_and_judges_them_together(report, tmp_path, capsys):
    rep, _ = report
    later = _as_seed(rep, 4, 0.25)
    paths = [tmp_path / "seed3.json", tmp_path / "seed4.json"]
    for path, r in zip(paths, (rep, later)):
        path.write_text(json.dumps(r))
    out = tmp_path / "merged"
    assert train_parity.main(["--merge", *map(str, paths), "--out", str(out)]) == 0
    merged = json.loads((out / train_parity.JSON_NAME).read_text())
    assert (out / train_parity.PLOT_NAME).read_bytes().startswith(b"\x89PNG")
    assert list(merged["seeds"]) == ["3", "4"] and merged["recipe"]["seeds"] == [3, 4]
    assert merged["seeds"]["3"] == rep["seeds"]["3"] and merged["seeds"]["4"] == later["seeds"]["4"]
    # The verdict is the one a single run of both seeds gets: verdict() over the joined seeds.
    assert merged["summary"] == json.loads(json.dumps(train_parity.verdict(merged["seeds"])))
    assert merged["summary"]["allowed_wer_gap"] == pytest.approx(0.25)
    assert merged["load_average"] == {"start": rep["load_average"]["start"], "after_seed_3": rep["load_average"]["after_seed_3"],
                                      "after_seed_4": [8.0, 8.0, 8.0], "end": [7.0, 7.0, 7.0]}
    assert [(m["name"], m["seeds"], m["date_utc"]) for m in merged["merged_from"]] == [
        (str(paths[0]), [3], rep["date_utc"]), (str(paths[1]), [4], "2026-01-02 03:04 UTC")]
    printed = capsys.readouterr().out
    assert "seeds 4: 2026-01-02 03:04 UTC" in printed and f"seeds 3: {rep['date_utc']}" in printed


def test_merge_refuses_another_recipe_another_cpu_a_seed_twice_and_what_is_no_report(report, tmp_path, capsys):
    rep, _ = report
    other_lr = _as_seed(rep, 4, 0.0)
    other_lr["recipe"]["train"]["learning_rate"] *= 2
    other_cpu = _as_seed(rep, 5, 0.0)
    other_cpu["machine"]["cpu"]["model"] += 1
    cases = {"lr.json": (other_lr, "another recipe than", "recipe.train.learning_rate"),
             "cpu.json": (other_cpu, "measured on another CPU", "cannot be compared"),
             "twice.json": (rep, "seed 3 is in an earlier report too", ""),
             "other.json": ({"benchmark": "speed"}, "not a train_parity report", ""),
             "cut.json": (None, "cannot be read as JSON", "")}
    first = tmp_path / "seed3.json"
    first.write_text(json.dumps(rep))
    for name, (r, said, more) in cases.items():
        (tmp_path / name).write_text("{" if r is None else json.dumps(r))
        out = tmp_path / f"out_{name}"
        assert train_parity.main(["--merge", str(first), str(tmp_path / name), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{tmp_path / name}: " in err and said in err and more in err, err
        assert not out.exists()  # nothing written
