"""Held-out metrics of a train state: teacher-forced loss and accuracy, and the decoded hypotheses' scores.

Besides the teacher-forced loss and token accuracy and the exact match of decoded token ids,
the decoded hypotheses and the references are turned back into text with the run's
``Codec`` (detokenised: words, characters or subwords joined as the tokenizer decodes them;
a synthetic run's space-separated integers) and scored with ``metrics.corpus_metrics``:
corpus BLEU and chrF (sacrebleu), WER and CER. The references are the held-out targets as
the model sees them, decoded from their ids (so a word outside the vocabulary reads
``<unk>`` on both sides).

Hypotheses are decoded as ``generate`` decodes them: up to the model's ``max_len`` tokens,
each row stopping at its EOS (the decoding loop ends once every row has). Decoding only as
far as the references' padded length would cut a long hypothesis at its reference's length
(an optimistic score) and at a length that changes with the batch size.
"""

import numpy as np

from flaxformer_mini.data import pad_rows
from flaxformer_mini.decode.metrics import corpus_metrics, exact_match
from flaxformer_mini.decode.options import DEFAULT_LENGTH_PENALTY, check_decoding_memory
from flaxformer_mini.decode.search import decode

TEXT_METRICS = ("bleu", "chrf", "wer", "cer")  # the keys corpus_metrics adds (exact_match: ours, on ids)


def evaluate(trainer, state, batches, with_exact_match=True, beam_size=1, codec=None, decode_lines=None,
             alpha=DEFAULT_LENGTH_PENALTY, stop=None):
    """Teacher-forced loss and token accuracy, and exact-match accuracy of cached greedy
    decoding (or of the best beam, with ``beam_size`` > 1, ranked with length penalty
    ``alpha``). With a ``codec``, also BLEU, chrF, WER and CER of the first ``decode_lines``
    decoded examples (None: all). ``stop()``, asked between batches: True ends the
    evaluation, which returns None."""
    return evaluate_with_hypotheses(trainer, state, batches, with_exact_match, beam_size, codec, decode_lines,
                                    alpha, stop)[0]


def evaluate_with_hypotheses(trainer, state, batches, with_exact_match=True, beam_size=1, codec=None,
                             decode_lines=None, alpha=DEFAULT_LENGTH_PENALTY, stop=None):
    """``(metrics, hypotheses)``: ``evaluate``'s metrics and the scored hypotheses' text, in
    the batches' order; ``(None, None)`` when ``stop()`` ended it."""
    result = trainer.evaluate(state, batches, stop=stop)
    if result is None:
        return None, None
    hypotheses, references = [], []
    if with_exact_match:
        model = state.model()
        hits, rows = [], None
        for b in batches:
            if stop is not None and stop():
                return None, None
            if rows is None:  # a smaller last batch is padded: one compiled shape
                rows = len(b.source)
                check_decoding_memory(model.config, rows, beam_size, model.config.max_len, b.source.shape[1])
            # The model's max_len, never the references' length: the hypotheses are generate's.
            predicted = decode(model, pad_rows(b, rows).source, model.config.max_len, beam_size=beam_size, alpha=alpha)
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
