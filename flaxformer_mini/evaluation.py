"""Held-out metrics of a train state, and of a finished run's latest checkpoint.

Besides the teacher-forced loss and token accuracy and the exact match of decoded token ids,
the decoded hypotheses and the references are turned back into text with the run's
``Codec`` (detokenised: words, characters or subwords joined as the tokenizer decodes them;
a synthetic run's space-separated integers) and scored with ``metrics.corpus_metrics``:
corpus BLEU and chrF (sacrebleu), WER and CER. The references are the held-out targets as
the model sees them, decoded from their ids (so a word outside the vocabulary reads
``<unk>`` on both sides).
"""

import numpy as np

from flaxformer_mini.data import TextPairs, pad_rows
from flaxformer_mini.decoding import decode, exact_match
from flaxformer_mini.files import write_atomic
from flaxformer_mini.metrics import corpus_metrics
from flaxformer_mini.run import Run, warn

TEXT_METRICS = ("bleu", "chrf", "wer", "cer")  # the keys corpus_metrics adds (exact_match: ours, on ids)


def evaluate(trainer, state, batches, with_exact_match=True, beam_size=1, codec=None, decode_lines=None):
    """Teacher-forced loss and token accuracy, and exact-match accuracy of cached greedy
    decoding (or of the best beam, with ``beam_size`` > 1). With a ``codec``, also BLEU,
    chrF, WER and CER of the first ``decode_lines`` decoded examples (None: all)."""
    return evaluate_with_hypotheses(trainer, state, batches, with_exact_match, beam_size, codec, decode_lines)[0]


def evaluate_with_hypotheses(trainer, state, batches, with_exact_match=True, beam_size=1, codec=None,
                             decode_lines=None):
    """``(metrics, hypotheses)``: ``evaluate``'s metrics and the scored hypotheses' text, in
    the batches' order."""
    result = trainer.evaluate(state, batches)
    hypotheses, references = [], []
    if with_exact_match:
        model = state.model()
        hits, rows = [], None
        for b in batches:
            rows = rows or len(b.source)  # a smaller last batch is padded: one compiled shape
            predicted = decode(model, pad_rows(b, rows).source, b.target_out.shape[1], beam_size=beam_size)
            predicted = np.asarray(predicted)[: len(b.source)]
            hits.append(exact_match(predicted, b.target_out))
            wanted = len(b.source) if decode_lines is None else min(len(b.source), decode_lines - len(hypotheses))
            if codec is not None and wanted > 0:
                hypotheses += [codec.decode(row) for row in predicted[:wanted]]
                references += [codec.decode(row) for row in np.asarray(b.target_out)[:wanted]]
        result["exact_match"] = float(np.concatenate(hits).mean())
    if references:
        scores = corpus_metrics(hypotheses, references)
        result.update({k: scores[k] for k in TEXT_METRICS})
    return result, hypotheses


def evaluate_run(out, batch_size=None, with_exact_match=True, beam_size=1, output=None, echo=warn):
    """Evaluate the latest checkpoint of the run in ``out`` on its held-out data, every
    held-out example decoded and scored; ``output``: a file to write the hypotheses into,
    one per line in the held-out set's order (atomically). Held-out pairs longer than the
    run's --max-len cannot be decoded: ``echo`` (stderr by default) says how many were left
    out of the metrics and of ``output``."""
    run = Run.open(out)
    state = run.latest_state()
    held_out = run.data.eval
    if isinstance(held_out, TextPairs) and held_out.dropped:
        echo(f"note: {held_out.dropped} of {held_out.dropped + len(held_out)} held-out pairs are longer "
             f"than the run's --max-len {held_out.max_len} allows and are not evaluated"
             + (f"; {output} holds a line for each of the {len(held_out)} others, in order"
                if output is not None else ""))
    result, hypotheses = evaluate_with_hypotheses(run.trainer, state, run.eval_batches(batch_size), with_exact_match,
                                                  beam_size, codec=run.codec if with_exact_match else None)
    if output is not None:
        write_atomic(output, "".join(h + "\n" for h in hypotheses))
    return {"step": int(state.step), **result}
