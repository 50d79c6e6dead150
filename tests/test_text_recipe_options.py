"""`train --schedule cosine` and `--length-multiple M`, the text recipe's options: recorded in the
run, the learning rate a run logs is the schedule's, every training batch is padded to a multiple
of M, and a run killed past its last checkpoint resumes to the state of one never stopped."""

import json

import numpy as np

from flaxformer_mini.cli import parser
from flaxformer_mini.data import parallel_text
from flaxformer_mini.runs.run import Run
from flaxformer_mini.train import optimizer
from flaxformer_mini.train.optimizer import learning_rate_schedule
from helpers import assert_same_training_state, cli, killed_before_its_last_checkpoint, latest_state, text_args, write_corpus

# The batches' longest rows hold 3 and 5 tokens (--length-multiple 1): a multiple of 6 pads every
# batch to 6, one shape (one compiled train step), a length no multiple of 8 gives.
STEPS, WARMUP, MULTIPLE = 10, 3, 6


def test_a_cosine_run_padded_to_a_multiple_records_both_and_resumes_bit_for_bit(tmp_path):
    corpus = write_corpus(tmp_path / "train.tsv", 60), write_corpus(tmp_path / "valid.tsv", 8)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    options = ["--schedule", "cosine", "--warmup", str(WARMUP), "--steps", str(STEPS), "--save-every", "5",
               "--log-every", "1", "--length-multiple", str(MULTIPLE), "--max-tokens", "96"]
    trained = cli(*text_args(corpus, straight, *options))
    assert trained.returncode == 0, trained.stderr

    config = json.loads((straight / "config.json").read_text())
    assert (config["train"]["schedule"], config["train"]["decay_steps"]) == ("cosine", STEPS)
    assert config["data"]["length_multiple"] == MULTIPLE
    run = Run.open(straight)
    # The rate of the update that made step s is the schedule's at update s - 1; the last is
    # above 0 and the next would be 0. Inside the compiled step XLA fuses the float32
    # arithmetic, so it may round once or twice where the eager schedule does not: a few ulps
    # of the peak where 1 + cos(pi x) cancels near the end.
    schedule = learning_rate_schedule(run.config.train, run.config.model.embed_size)
    logged = {m["step"]: m["learning_rate"] for m in map(json.loads, (straight / "metrics.jsonl").read_text().splitlines())
              if "learning_rate" in m}
    assert sorted(logged) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([logged[s] for s in sorted(logged)], [float(schedule(s - 1)) for s in sorted(logged)],
                               rtol=4 * 2.0**-24, atol=4 * 2.0**-24 * run.config.train.learning_rate)
    assert max(logged, key=logged.get) == WARMUP + 1  # the peak: update WARMUP
    np.testing.assert_allclose(logged[WARMUP + 1], run.config.train.learning_rate, rtol=2.0**-24)
    assert logged[STEPS] > 0 and float(schedule(STEPS)) == 0.0

    cap = run.config.model.max_len
    lengths = {n for step in range(STEPS) for batch in run.train_batches(step)
               for n in (batch.source.shape[1], batch.target_in.shape[1])}
    assert lengths and all(n % MULTIPLE == 0 or n == cap for n in lengths), lengths
    assert any(n % 8 for n in lengths)  # not the default multiple's lengths
    run.close()

    # A cosine run's length is part of its recipe: resumed with another --steps, it is refused.
    before = sorted(p.name for p in (straight / "checkpoints").iterdir())
    longer = cli(*text_args(corpus, straight, *options, "--steps", str(STEPS + 2)))
    assert longer.returncode == 2
    assert (f"train.decay_steps (--steps of a --schedule cosine run, where its learning rate reaches 0): {STEPS} in "
            f"the run, {STEPS + 2} now") in longer.stderr, longer.stderr
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == before

    # What kill -9 leaves before step 10's checkpoint: the checkpoint of step 5 and the log past it.
    killed_before_its_last_checkpoint(straight, killed)
    resumed = cli(*text_args(corpus, killed, *options))
    assert resumed.returncode == 0 and f"resuming {killed} from step 5" in resumed.stderr, resumed.stderr
    (step_a, a), (step_b, b) = latest_state(straight), latest_state(killed)
    assert step_a == step_b == STEPS
    assert_same_training_state(a, b)


def test_the_parsers_copies_of_the_schedules_and_the_default_multiple_are_the_libraries():
    # The parser writes them out: it answers --help without importing JAX or NumPy.
    assert parser.SCHEDULES == optimizer.SCHEDULES
    assert parser.LENGTH_MULTIPLE == parallel_text.LENGTH_MULTIPLE
