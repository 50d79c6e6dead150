"""Token-budget batches (``--max-tokens N``), bucketed by length, a pure function of (seed, epoch).

The budget follows fairseq's convention (``fairseq.data.data_utils.batch_by_size``): a batch
of ``n`` rows whose longest source is ``S`` and longest target ``T`` tokens costs

    n * max(pad(S), pad(T))  <=  max_tokens

padding included, where ``pad`` rounds up to ``length_multiple`` (the batch shapes
``TextPairs`` pads to, so the jitted step compiles for few shapes). ``S`` and ``T`` are the
lengths the model sees: tokens + EOS for a source, BOS + tokens (or tokens + EOS) for a
target; the caller passes them.

Bucketing: examples are sorted by (source length, target length) with a seeded shuffle among
equal lengths, cut greedily into the largest batches the budget allows, and the batch order is
shuffled. The sequence of lengths after sorting is the same every epoch, so every epoch has
the same number of batches (``steps_per_epoch``), only which equal-length examples share a
batch and the order of batches change. Training step ``k`` is therefore batch
``k % steps_per_epoch`` of epoch ``k // steps_per_epoch``: a function of (seed, step) alone,
so a resumed run sees exactly the batches it would have seen.

Lengths are numpy integer arrays (one entry per example, never a Python object per token).

Written here rather than on grain, JAX's data loader: grain 0.2.18 batches a fixed number of
elements (``MapDataset.batch``) or packs several examples into one row (its packing
transforms); a token budget over length-sorted buckets, fairseq's batching for translation, is
not among its operations. Being a function of (seed, step), the batch order also needs no
iterator state in the checkpoint.
"""

import numpy as np

from .batches import non_negative_int, positive_int


def _as_lengths(name, lengths):
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or not (lengths.size == 0 or np.issubdtype(lengths.dtype, np.integer)):
        raise TypeError(f"{name} must be a 1-D integer array, got dtype {lengths.dtype} shape {lengths.shape}")
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"{name} must be >= 1 (every sequence has at least its EOS), got {lengths.min()}")
    return lengths.astype(np.int64)


def padded(lengths, length_multiple, max_len=None):
    """``lengths`` rounded up to a multiple of ``length_multiple``, and at most ``max_len``: a
    batch is padded to the model's max_len at most (``TextPairs``), whatever the multiple."""
    m = positive_int("length_multiple", length_multiple)
    rounded = -(-np.asarray(lengths, np.int64) // m) * m
    return rounded if max_len is None else np.minimum(rounded, positive_int("max_len", max_len))


def token_batches(source_lengths, target_lengths, max_tokens, seed, epoch, length_multiple=1, max_sentences=None, names=None,
                  max_len=None):
    """The epoch's batches: a list of int64 index arrays, each example in exactly one.

    ``max_sentences`` optionally caps the rows per batch. ``names`` (optional, one per
    example, e.g. ``"train.tsv:17"``) is used in the error for an example that alone exceeds
    ``max_tokens``; by default the error names the example's index. ``max_len`` (optional)
    caps each padded length, as a batch is never padded past the model's max_len.
    """
    src = _as_lengths("source_lengths", source_lengths)
    tgt = _as_lengths("target_lengths", target_lengths)
    if src.shape != tgt.shape:
        raise ValueError(f"{src.size} source lengths but {tgt.size} target lengths")
    if src.size == 0:
        raise ValueError("no examples to batch")
    max_tokens = positive_int("max_tokens", max_tokens)
    seed, epoch = non_negative_int("seed", seed), non_negative_int("epoch", epoch)
    cap = positive_int("max_sentences", max_sentences) if max_sentences is not None else src.size
    src_padded, tgt_padded = padded(src, length_multiple, max_len), padded(tgt, length_multiple, max_len)
    cost = np.maximum(src_padded, tgt_padded)
    worst = int(np.argmax(cost))
    if cost[worst] > max_tokens:
        where = names[worst] if names is not None else f"example {worst}"
        raise ValueError(
            f"--max-tokens {max_tokens} is smaller than the longest example ({where}: source {src[worst]}, "
            f"target {tgt[worst]} tokens, {cost[worst]} padded); raise --max-tokens to at least {cost[worst]}"
        )
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(src.size)
    # np.lexsort is stable and sorts by its last key first: equal lengths keep the random order.
    order = order[np.lexsort((tgt[order], src[order]))]
    bounds = _greedy_bounds(src_padded[order], tgt_padded[order], max_tokens, cap)
    batches = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    return [batches[i] for i in rng.permutation(len(batches))]


def _greedy_bounds(src, tgt, max_tokens, cap):
    """Start offsets (plus the end) of fairseq-style greedy batches over sorted lengths.

    A plain loop over examples (one int per example, no per-token work), once per epoch:
    numpy has no vectorised form of this running-max scan.
    """
    bounds = [0]
    longest, rows = 0, 0
    for i, (s, t) in enumerate(zip(src.tolist(), tgt.tolist())):
        longer = max(longest, s, t)
        if rows and (rows + 1 > cap or (rows + 1) * longer > max_tokens):
            bounds.append(i)
            longest, rows = max(s, t), 1
        else:
            longest, rows = longer, rows + 1
    bounds.append(len(src))
    return bounds


def step_to_epoch(step, steps_per_epoch):
    """``(epoch, index in epoch)`` of global training step ``step``."""
    step = non_negative_int("step", step)
    return divmod(step, positive_int("steps_per_epoch", steps_per_epoch))


class TokenBatcher:
    """``token_batches`` for one corpus, with the current epoch's plan cached.

    ``rows(seed, step)`` are the example indices of training step ``step``; consecutive steps
    share an epoch, so the plan is computed once per epoch.
    """

    def __init__(self, source_lengths, target_lengths, max_tokens, length_multiple=1, max_sentences=None, names=None,
                 max_len=None):
        self._args = (source_lengths, target_lengths, max_tokens)
        self._kwargs = dict(length_multiple=length_multiple, max_sentences=max_sentences, names=names, max_len=max_len)
        self._key, self._plan = None, None
        # The number of batches does not depend on the seed or epoch (see the module docstring).
        self.steps_per_epoch = len(self.plan(0, 0))

    def plan(self, seed, epoch):
        if self._key != (seed, epoch):
            self._plan = token_batches(*self._args, seed, epoch, **self._kwargs)
            self._key = (seed, epoch)
        return self._plan

    def rows(self, seed, step):
        epoch, index = step_to_epoch(step, self.steps_per_epoch)
        return self.plan(seed, epoch)[index]
