"""`train --eval-beam-size K --eval-length-penalty A`: the evaluation during training decodes with
the beam search `evaluate --beam-size K --length-penalty A` runs, so the metric that picks the
best checkpoint is the one users decode with."""

import json

from helpers import TINY_RUN, cli

METRICS = ("loss", "token_accuracy", "exact_match", "bleu", "chrf", "wer", "cer")


def test_the_evaluation_during_training_scores_what_evaluate_scores_with_the_same_beam(tmp_path):
    out = str(tmp_path / "run")
    trained = cli("train", *TINY_RUN, "--steps", "20", "--eval-beam-size", "2", "--eval-length-penalty", "0.3",
                  "--out", out)
    assert trained.returncode == 0, trained.stderr
    during = json.loads(trained.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["evaluation"] == {
        "beam_size": 2, "length_penalty": 0.3, "best_metric": None}

    def evaluated(*options):
        proc = cli("evaluate", "--checkpoint", out, "--json", *options)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    beam = evaluated("--beam-size", "2", "--length-penalty", "0.3")
    assert {k: during[k] for k in METRICS} == {k: beam[k] for k in METRICS}
    # Greedy decoding reads other hypotheses at this step: what training scored was the beam's.
    greedy = evaluated()
    assert greedy["cer"] != during["cer"]
