"""Token-budget batches: budget, coverage, determinism, bucketing, errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaxformer_mini.data import token_batches as batching


def _lengths(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 40, n), rng.integers(1, 50, n)


def _cost(rows, src, tgt, multiple):
    def pad(x):
        return -(-int(x) // multiple) * multiple

    return len(rows) * max(pad(src[rows].max()), pad(tgt[rows].max()))


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 300),
    max_tokens=st.integers(64, 600),
    multiple=st.sampled_from([1, 8]),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
)
def test_every_batch_fits_the_budget_and_every_example_appears_once(n, max_tokens, multiple, seed, epoch):
    src, tgt = _lengths(n, seed)
    batches = batching.token_batches(src, tgt, max_tokens, seed, epoch, length_multiple=multiple)
    for rows in batches:
        assert len(rows) >= 1
        assert _cost(rows, src, tgt, multiple) <= max_tokens
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(n))


def test_batches_are_a_pure_function_of_seed_and_epoch():
    src, tgt = _lengths(500)
    a = batching.token_batches(src, tgt, 400, seed=3, epoch=2)
    b = batching.token_batches(src.copy(), tgt.copy(), 400, seed=3, epoch=2)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_different_epochs_and_seeds_give_different_batches_but_the_same_count():
    src, tgt = _lengths(500)
    plans = [batching.token_batches(src, tgt, 400, seed, epoch) for seed, epoch in [(0, 0), (0, 1), (1, 0)]]
    assert len({len(p) for p in plans}) == 1  # steps_per_epoch is constant
    first = [tuple(r) for r in plans[0]]
    for other in plans[1:]:
        assert first != [tuple(r) for r in other]


def test_batches_are_bucketed_by_length():
    # Sorted buckets waste far less padding than random batches of the same sizes.
    src, tgt = _lengths(2000)
    batches = batching.token_batches(src, tgt, 1000, 0, 0)
    used = sum(src[r].sum() for r in batches)
    padded = sum(len(r) * src[r].max() for r in batches)
    assert used / padded > 0.9
    rng = np.random.default_rng(0)
    shuffled = np.split(rng.permutation(2000), np.cumsum([len(r) for r in batches])[:-1])
    assert used / sum(len(r) * src[r].max() for r in shuffled) < 0.7


def test_greedy_batches_are_as_large_as_the_budget_allows():
    # Ten examples of length 10: a budget of 35 holds 3 rows (3 * 10 <= 35 < 4 * 10).
    batches = batching.token_batches(np.full(10, 10), np.full(10, 4), 35, 0, 0)
    assert sorted(len(r) for r in batches) == [1, 3, 3, 3]


def test_length_multiple_counts_the_padding():
    # Length 9 pads to 16 with multiple 8: a budget of 40 holds 2 rows, not 4.
    batches = batching.token_batches(np.full(4, 9), np.full(4, 2), 40, 0, 0, length_multiple=8)
    assert [len(r) for r in batches] == [2, 2]


def test_padding_stops_at_max_len_as_the_batches_do():
    # Length 49 rounds up to 56 with multiple 8, but a batch is padded to max_len 50 at most:
    # a budget of 100 holds 2 rows of it, and a budget of 50 is not refused for 56.
    batches = batching.token_batches(np.full(4, 49), np.full(4, 3), 100, 0, 0, length_multiple=8, max_len=50)
    assert [len(r) for r in batches] == [2, 2]
    assert [len(r) for r in batching.token_batches(np.full(2, 49), np.full(2, 3), 50, 0, 0, length_multiple=8,
                                                   max_len=50)] == [1, 1]
    with pytest.raises(ValueError, match=r"56 padded"):  # without the cap, the rounding alone
        batching.token_batches(np.full(2, 49), np.full(2, 3), 50, 0, 0, length_multiple=8)


def test_max_sentences_caps_the_rows():
    batches = batching.token_batches(np.full(10, 2), np.full(10, 2), 1000, 0, 0, max_sentences=4)
    assert sorted(len(r) for r in batches) == [2, 4, 4]


def test_an_example_longer_than_max_tokens_is_named():
    src, tgt = np.array([5, 7, 30, 4]), np.array([5, 9, 12, 4])
    with pytest.raises(ValueError, match=r"--max-tokens 20 .* \(example 2: source 30, target 12 tokens, 30 padded\)"):
        batching.token_batches(src, tgt, 20, 0, 0)
    with pytest.raises(ValueError, match=r"train.tsv:3: source 30"):
        batching.token_batches(src, tgt, 20, 0, 0, names=["train.tsv:1", "train.tsv:2", "train.tsv:3", "train.tsv:4"])


def test_bad_lengths_are_errors():
    with pytest.raises(ValueError, match="3 source lengths but 2 target lengths"):
        batching.token_batches([1, 2, 3], [1, 2], 10, 0, 0)
    with pytest.raises(TypeError, match="integer array"):
        batching.token_batches([1.5], [2], 10, 0, 0)
    with pytest.raises(ValueError, match="no examples"):
        batching.token_batches([], [], 10, 0, 0)


def test_step_maps_to_epoch_and_index():
    assert batching.step_to_epoch(0, 7) == (0, 0)
    assert batching.step_to_epoch(13, 7) == (1, 6)
    assert batching.step_to_epoch(14, 7) == (2, 0)


def test_batcher_rows_follow_the_epoch_plans():
    src, tgt = _lengths(300)
    batcher = batching.TokenBatcher(src, tgt, 300)
    n = batcher.steps_per_epoch
    assert np.array_equal(batcher.rows(5, n + 2), batching.token_batches(src, tgt, 300, 5, 1)[2])
    # A fresh batcher (a resumed run) gives the same rows for the same step.
    assert np.array_equal(batching.TokenBatcher(src, tgt, 300).rows(5, 3 * n + 1), batcher.rows(5, 3 * n + 1))
