"""Corpus metrics for ``evaluate``: BLEU, chrF, WER, CER and exact match on detokenised text.

BLEU and chrF come from sacrebleu (the reference implementation, whose scores papers report):
``corpus_bleu`` with its default ``13a`` tokenisation (the WMT standard, meant for
detokenised text, which is what ``Tokenizer.decode`` returns) and ``corpus_chrf`` with its
defaults (character 6-grams, beta 2, no word n-grams: chrF, not chrF++). Both are 0-100.

WER and CER are corpus-level rates: the total Levenshtein distance over all pairs divided by
the total number of reference words (``str.split``) or characters (spaces included, as jiwer
counts them). The distance is rapidfuzz's ``Levenshtein.distance``, which takes sequences of
any hashable items (words as well as characters) and runs in C++; jiwer would do the same
(it calls rapidfuzz since 3.0) but applies its own text transforms on top, which we do not
want. Rates may exceed 1 when the hypotheses are longer than the references.

For grapheme-to-phoneme data (space-separated phonemes as the target), ``wer`` here is the
phoneme error rate (PER) of the G2P literature, and the G2P "word error rate" (a word wrong
if any phoneme is wrong) is ``1 - exact_match``.
"""

import numpy as np

from flaxformer_mini.data import PAD


def corpus_metrics(hypotheses, references):
    """``{"bleu", "chrf", "wer", "cer", "exact_match"}`` for parallel lists of strings.

    bleu and chrf are 0-100; wer and cer are rates (0 is perfect); exact_match is the
    fraction of hypotheses equal to their reference.
    """
    # Imported here: some 170 modules between them, and only text is scored with them (a
    # synthetic run's evaluation uses exact_match alone).
    import sacrebleu
    from rapidfuzz.distance import Levenshtein

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not references:
        raise ValueError("no references: corpus metrics need at least one pair")
    for name, texts in (("hypothesis", hypotheses), ("reference", references)):
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"{name} {i} must be a string, got {type(text).__name__}")
    ref_words = sum(len(r.split()) for r in references)
    ref_chars = sum(len(r) for r in references)
    if ref_words == 0:
        raise ValueError("every reference is empty: WER and CER are undefined")
    word_edits = sum(Levenshtein.distance(h.split(), r.split()) for h, r in zip(hypotheses, references))
    char_edits = sum(Levenshtein.distance(h, r) for h, r in zip(hypotheses, references))
    return {
        "bleu": float(sacrebleu.corpus_bleu(hypotheses, [references]).score),
        "chrf": float(sacrebleu.corpus_chrf(hypotheses, [references]).score),
        "wer": word_edits / ref_words,
        "cer": char_edits / ref_chars,
        "exact_match": sum(h == r for h, r in zip(hypotheses, references)) / len(references),
    }


def exact_match(predicted, target_out):
    """Per-sequence exact match: the hypothesis up to and including its first EOS equals the
    labels (the reference's tokens and its EOS).

    ``predicted`` (B, N) from a decoder, which writes PAD after a row's EOS; ``target_out``
    (B, T) labels padded with PAD. N and T may differ either way: evaluation decodes up to the
    model's max_len, past the references' padded length. Every labelled position must match,
    EOS included, so a hypothesis that goes on past its reference's end, or stops before it,
    does not match; what a row holds after its EOS is not compared.
    """
    predicted, target_out = np.asarray(predicted), np.asarray(target_out)
    width = max(predicted.shape[1], target_out.shape[1])
    predicted = np.pad(predicted, ((0, 0), (0, width - predicted.shape[1])), constant_values=PAD)
    target_out = np.pad(target_out, ((0, 0), (0, width - target_out.shape[1])), constant_values=PAD)
    labelled = target_out != PAD
    return np.all((predicted == target_out) | ~labelled, axis=1)
