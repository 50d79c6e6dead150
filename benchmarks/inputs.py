"""The one seeded batch every path reads: same token ids for torch and Flax.

Rows are right-padded to random lengths between 3/4 of ``seq_len`` and ``seq_len``, as a
bucketed training batch would be, so the source mask and the loss mask do real work.
The timing does not depend on the values (no path has data-dependent control flow, and
decoding is made to run all its steps, see ``forbid_eos``).
"""

import numpy as np

from flaxformer_mini.data import BOS, EOS, NUM_SPECIAL, PAD, Batch


def make_batch(preset, seed=0):
    """A ``flaxformer_mini.data.Batch`` of int32 numpy arrays, (B, S) and (B, T), S = T = seq_len."""
    B, L = preset.batch, preset.seq_len
    c = preset.model
    rng = np.random.default_rng(seed)

    def padded(vocab):
        tokens = rng.integers(NUM_SPECIAL, vocab, (B, L)).astype(np.int32)
        lengths = rng.integers(max(1, (3 * L) // 4), L + 1, B)
        keep = np.arange(L)[None, :] < lengths[:, None]
        return np.where(keep, tokens, PAD).astype(np.int32), lengths

    source, source_len = padded(c.source_vocab_size)
    source[np.arange(B), source_len - 1] = EOS
    target, target_len = padded(c.target_vocab_size)
    target_out = target.copy()
    target_out[np.arange(B), target_len - 1] = EOS
    target_in = np.full_like(target, PAD)
    target_in[:, 0] = BOS
    target_in[:, 1:] = np.where(target[:, 1:] != PAD, target[:, :-1], PAD)
    return Batch(source, target_in, target_out)


# Greedy decoding stops early once every sequence has produced EOS. With random weights that
# can happen at any step, so each model's output bias for EOS is set to this value before
# decoding: every path then generates exactly N tokens, and their times compare.
EOS_BIAS = -1e9
