"""corpus_metrics: values worked out by hand, and sacrebleu called directly."""

import math

import pytest
import sacrebleu

from flaxformer_mini.decode.metrics import corpus_metrics


def test_one_substitution_in_four_words_is_wer_quarter():
    m = corpus_metrics(["the cat sat down"], ["the dog sat down"])
    assert m["wer"] == 0.25
    # "cat" -> "dog": 3 character substitutions over 16 reference characters (spaces count).
    assert m["cer"] == 3 / 16
    assert m["exact_match"] == 0.0


def test_wer_and_cer_are_totals_over_the_corpus_not_means_of_rates():
    hyps = ["a b", "c d e f g h"]
    refs = ["a x", "c d e f g h"]
    m = corpus_metrics(hyps, refs)
    # 1 word edit over 2 + 6 = 8 reference words (a mean of rates would give 0.25).
    assert m["wer"] == 1 / 8
    assert m["cer"] == 1 / (3 + 11)
    assert m["exact_match"] == 0.5


def test_insertions_and_deletions_count_one_edit_each():
    m = corpus_metrics(["a b c d", "x"], ["a c d", "x y z"])
    # "b" inserted in the first; "y", "z" deleted in the second: 3 edits / 6 reference words.
    assert m["wer"] == 3 / 6


def test_perfect_output_scores_perfectly():
    refs = ["the quick brown fox jumps", "over the lazy dog again"]
    m = corpus_metrics(refs, refs)
    assert m["wer"] == m["cer"] == 0.0
    assert m["exact_match"] == 1.0
    assert math.isclose(m["bleu"], 100.0) and math.isclose(m["chrf"], 100.0)


def test_bleu_and_chrf_equal_sacrebleu_called_directly():
    hyps = ["The cat is on the mat.", "There is a dog here", "hello"]
    refs = ["The cat sat on the mat.", "A dog is here", "hello world"]
    m = corpus_metrics(hyps, refs)
    assert m["bleu"] == sacrebleu.corpus_bleu(hyps, [refs], tokenize="13a").score
    assert m["chrf"] == sacrebleu.CHRF(char_order=6, word_order=0, beta=2).corpus_score(hyps, [refs]).score
    assert 0 < m["bleu"] < 100 and 0 < m["chrf"] < 100


def test_mismatched_lengths_are_an_error_naming_both_counts():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_metrics(["a", "b"], ["a"])


def test_empty_corpus_and_empty_references_are_errors():
    with pytest.raises(ValueError, match="at least one pair"):
        corpus_metrics([], [])
    with pytest.raises(ValueError, match="every reference is empty"):
        corpus_metrics(["a"], [""])


def test_non_string_hypothesis_is_an_error_naming_it():
    with pytest.raises(TypeError, match="hypothesis 1 must be a string"):
        corpus_metrics(["a", [5, 6]], ["a", "b"])
