"""Synthetic tasks: copy, reverse or sort a random sequence, the main job's data.

Training batches are functions of ``(seed, step)`` alone, never of an iterator's state: a run
resumed from a checkpoint at step k sees exactly the batches it would have seen.
"""

import re

import numpy as np

from .batches import NUM_SPECIAL, SPECIAL_TOKENS, UNK, non_negative_int, positive_int, strip_specials, make_batch

TASKS = ("copy", "reverse", "sort")

# Last word of a synthetic task's seed sequence. Training step i and held-out batch i come from
# different streams, so held-out data is never a replay of some training batch.
_TRAIN_STREAM = 0
_EVAL_STREAM = 1

_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits only: int() also reads "1_0" and other scripts' digits


class SyntheticTask:
    """Copy, reverse or sort a random sequence of content tokens.

    Content ids lie in ``[NUM_SPECIAL, vocab_size)``; sequences have ``min_len..max_len``
    content tokens. ``vocab_size`` is the model's source and target vocabulary size and
    ``model_max_len`` the length its positional tables must hold.
    """

    def __init__(self, name, vocab_size, min_len, max_len):
        if name not in TASKS:
            raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
        vocab_size = non_negative_int("vocab_size", vocab_size)
        min_len = non_negative_int("min_len", min_len)
        max_len = non_negative_int("max_len", max_len)
        # With a single content token every task is the same trivial constant map.
        if vocab_size <= NUM_SPECIAL + 1:
            raise ValueError(
                f"vocab_size must be > {NUM_SPECIAL + 1} ({NUM_SPECIAL} special tokens and at "
                f"least two content tokens), got {vocab_size}"
            )
        if min_len < 1:
            raise ValueError(f"min_len must be >= 1, got {min_len}")
        if min_len > max_len:
            raise ValueError(f"min_len={min_len} is greater than max_len={max_len}")
        self.name, self.vocab_size, self.min_len, self.max_len = name, vocab_size, min_len, max_len

    def __repr__(self):
        return f"SyntheticTask({self.name!r}, vocab_size={self.vocab_size}, min_len={self.min_len}, max_len={self.max_len})"

    @property
    def model_max_len(self):
        """Longest sequence the model sees: max_len content tokens plus EOS (or BOS)."""
        return self.max_len + 1

    @property
    def num_values(self):
        """How many content values there are; the user writes them as 0..num_values-1."""
        return self.vocab_size - NUM_SPECIAL

    def solve(self, content):
        """The correct target for a sequence of content ids (no specials)."""
        content = np.asarray(content)
        if self.name == "reverse":
            return content[::-1]
        if self.name == "sort":
            return np.sort(content)
        return content

    def batch(self, seed, step, batch_size):
        """Training batch ``step`` of the stream ``seed``: a function of (seed, step) alone."""
        seed, step = non_negative_int("seed", seed), non_negative_int("step", step)
        return self._draw(np.random.default_rng([seed, step, _TRAIN_STREAM]), batch_size)

    def eval_batches(self, seed, num_batches, batch_size):
        """``num_batches`` held-out batches, from a stream that training never draws from.

        With a small vocabulary and short sequences a held-out sequence can still equal one
        seen in training by chance; it is never a copy of a training batch.
        """
        seed = non_negative_int("seed", seed)
        num_batches = non_negative_int("num_batches", num_batches)
        return [self._draw(np.random.default_rng([seed, i, _EVAL_STREAM]), batch_size) for i in range(num_batches)]

    def held_out(self, seed, num_sequences):
        """``num_sequences`` held-out sequences as one ``Batch``, from the evaluation stream:
        the same sequences whatever batch size an evaluation later splits them into."""
        return self._draw(np.random.default_rng([non_negative_int("seed", seed), 0, _EVAL_STREAM]), num_sequences)

    def _draw(self, rng, batch_size):
        batch_size = positive_int("batch_size", batch_size)
        lengths = rng.integers(self.min_len, self.max_len + 1, size=batch_size)
        content = rng.integers(NUM_SPECIAL, self.vocab_size, size=(batch_size, self.max_len))
        sources = [row[:n] for row, n in zip(content, lengths)]
        # Always padded to model_max_len: one fixed shape, so the jitted step compiles once.
        return make_batch(sources, [self.solve(s) for s in sources], self.model_max_len, self.model_max_len)

    def encode_batch(self, texts):
        """``[encode_text(t) for t in texts]``: the vocabularies' interface, so that ``TextPairs``
        reads a file of values as it reads text (``evaluate --data`` of a synthetic run)."""
        return [self.encode_text(text) for text in texts]

    def encode_text(self, text):
        """Content ids for a line of space-separated values: ``"5 3 9"`` -> ``[9, 7, 13]``.

        A value v is the id ``v + NUM_SPECIAL``, so the user never sees the special ids.
        No EOS is added (``make_source`` does that).
        """
        ids = []
        for token in text.split():
            if not _INTEGER.fullmatch(token):
                raise ValueError(f"token {token!r} is not an integer; the {self.name} task reads integers 0..{self.num_values - 1}")
            value = int(token)
            if not 0 <= value < self.num_values:
                raise ValueError(f"token {token!r} is out of range: values are 0..{self.num_values - 1}")
            ids.append(value + NUM_SPECIAL)
        return ids

    def decode_ids(self, ids):
        """Space-separated content values of a model output, up to the first EOS."""
        words = []
        for i in strip_specials(ids):
            if i == UNK:
                words.append(SPECIAL_TOKENS[UNK])
            elif NUM_SPECIAL <= i < self.vocab_size:
                words.append(str(i - NUM_SPECIAL))
            else:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return " ".join(words)
