"""Held-out metrics of a train state, and of a finished run's latest checkpoint."""

import numpy as np

from flaxformer_mini.decoding import decode, exact_match
from flaxformer_mini.run import Run


def evaluate(trainer, state, batches, with_exact_match=True, beam_size=1):
    """Teacher-forced loss and token accuracy, and exact-match accuracy of cached greedy
    decoding (or of the best beam, with ``beam_size`` > 1)."""
    result = trainer.evaluate(state, batches)
    if with_exact_match:
        model = state.model()
        hits = [exact_match(decode(model, b.source, b.target_out.shape[1], beam_size=beam_size), b.target_out)
                for b in batches]
        result["exact_match"] = float(np.concatenate(hits).mean())
    return result


def evaluate_run(out, batch_size=None, with_exact_match=True, beam_size=1):
    """Evaluate the latest checkpoint of the run in ``out`` on its held-out data."""
    run = Run.open(out)
    state = run.latest_state()
    result = evaluate(run.trainer, state, run.eval_batches(batch_size), with_exact_match, beam_size)
    return {"step": int(state.step), **result}
