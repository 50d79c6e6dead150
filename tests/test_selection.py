"""`runs/selection.py`: which evaluation is the best (strictly better, by each metric's
direction; a NaN never), how many came since, and the same state replayed from metrics.jsonl's
records up to a step, as a resumed run rebuilds it."""

import math

import pytest

from flaxformer_mini.runs.selection import BEST_METRICS, Selection


@pytest.mark.parametrize("metric, values, better", [
    ("wer", [0.5, 0.4, 0.4, 0.45], [True, True, False, False]),  # lower is better; a tie is no better
    ("loss", [2.0, math.nan, 1.5], [True, False, True]),  # a NaN is never better, and counts as no better
    ("bleu", [10.0, 12.5, 12.0, 12.5], [True, True, False, False]),  # higher is better
    ("exact_match", [0.0, 0.0, 0.0], [True, False, False]),  # the first value is the first best
])
def test_the_best_is_the_first_strictly_better_evaluation(metric, values, better):
    selection = Selection(metric)
    assert [selection.observe(step, value) for step, value in enumerate(values, 1)] == better
    best_step = max(step for step, b in enumerate(better, 1) if b)
    since = len(values) - best_step
    assert (selection.best_step, selection.best_value, selection.since_best) == (best_step, values[best_step - 1], since)
    assert not selection.exhausted(None) and not selection.exhausted(since + 1)
    assert since == 0 or selection.exhausted(since)  # --patience is >= 1


def test_replaying_the_log_up_to_a_step_gives_the_state_at_that_step():
    records = [{"step": 5, "loss": 3.0}, {"step": 5, "eval_cer": 0.30}, {"step": 10, "eval_cer": 0.20},
               {"step": 15, "eval_cer": 0.25}, {"step": 20, "eval_cer": 0.10}]
    at_15 = Selection.replay("cer", records, 15)
    assert (at_15.best_step, at_15.best_value, at_15.since_best) == (10, 0.20, 1)
    at_20 = Selection.replay("cer", records, 20)
    assert (at_20.best_step, at_20.best_value, at_20.since_best) == (20, 0.10, 0)
    assert Selection.from_json(at_15.to_json()) == at_15
    assert at_20.summary() == {"best_step": 20, "best_cer": 0.10}


def test_the_metrics_and_an_unknown_one():
    assert BEST_METRICS == ("loss", "wer", "cer", "bleu", "chrf", "exact_match")
    with pytest.raises(ValueError, match="unknown best metric 'accuracy'"):
        Selection("accuracy")
    with pytest.raises(ValueError, match=r"--best-metric chrf: the evaluation computed no chrf \(it computed exact_match, loss\)"):
        Selection("chrf").value_of({"loss": 1.0, "exact_match": 0.5})
