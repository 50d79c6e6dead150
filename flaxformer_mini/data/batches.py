"""Padded batches: the special tokens, ``Batch`` and the one place that adds BOS/EOS.

Every batch is a ``Batch`` of int32 numpy arrays, right-padded with PAD (id 0, the model's
``src_pad_idx``):

    source      (B, S)  encoder input    tokens + EOS
    target_in   (B, T)  decoder input    BOS + tokens   (teacher forcing)
    target_out  (B, T)  labels           tokens + EOS

so the decoder reads ``target_in[:, t]`` when it predicts ``target_out[:, t]``, and the loss
counts only the positions where ``target_out != PAD`` (``Batch.num_tokens``).
"""

import operator
from typing import NamedTuple

import numpy as np

# Special tokens, defined once. PAD = 0 is the model's src_pad_idx: the encoder masks it out.
PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
NUM_SPECIAL = len(SPECIAL_TOKENS)


class DataError(ValueError):
    """Bad data in a file or a data set. The message names the file and the line."""


class Batch(NamedTuple):
    """Padded int32 arrays; see the module docstring. A NamedTuple, so also a JAX pytree."""

    source: np.ndarray  # (B, S)
    target_in: np.ndarray  # (B, T)
    target_out: np.ndarray  # (B, T)

    @property
    def num_tokens(self):
        """Number of labels that count in the loss (a numpy or JAX scalar, not a Python int,
        so it also works on a batch of JAX arrays inside ``jax.jit``)."""
        return (self.target_out != PAD).sum()


def non_negative_int(name, value):
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def positive_int(name, value):
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if value < 1:  # 0 and negatives alike, so the message names the one bound that holds
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _id_sequences(sequences, what="sequence"):
    """``sequences`` as one-dimensional integer arrays, or an error naming the first that is not
    (a flat list of ids where a list of sequences belongs, text, floats)."""
    arrays = [np.asarray(s) for s in sequences]
    for i, a in enumerate(arrays):
        if a.dtype.kind in "US":
            raise TypeError(f"{what} {i} must hold integer ids, got text {a.tolist()!r} (encode it first: a "
                            f"Vocab or a tokenizer)")
        if a.ndim != 1:
            raise ValueError(f"{what} {i} must be one-dimensional (a sequence of ids), got shape {a.shape}"
                             + (f" ({a.item()!r}: a list of ids where a list of sequences belongs?)" if a.ndim == 0 else ""))
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{what} {i} must hold integer ids, got dtype {a.dtype}")
    return arrays


def pad_batch(sequences, length=None):
    """Stack integer sequences into a ``(len(sequences), length)`` int32 array, right-padded
    with PAD. ``length`` defaults to the longest sequence; a longer sequence is an error,
    never silently truncated."""
    arrays = _id_sequences(sequences)
    longest = max((a.size for a in arrays), default=0)
    if length is None:
        length = longest
    elif longest > length:
        raise ValueError(f"a sequence of length {longest} does not fit length={length}")
    out = np.full((len(arrays), length), PAD, np.int32)
    for i, a in enumerate(arrays):
        out[i, : a.size] = a
    return out


def make_source(sequences, length=None):
    """The encoder input for already-encoded token sequences: each + EOS, padded. (B, S)"""
    return pad_batch([[*s, EOS] for s in _id_sequences(sequences, "source")], length)


def make_batch(sources, targets, source_length=None, target_length=None):
    """A ``Batch`` from token sequences without specials: the one place that adds BOS/EOS."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    source = make_source(sources, source_length)
    targets = _id_sequences(targets, "target")
    return Batch(
        source=source,
        target_in=pad_batch([[BOS, *t] for t in targets], target_length),
        target_out=pad_batch([[*t, EOS] for t in targets], target_length),
    )


def pad_rows(batch, rows):
    """``batch`` with rows of PAD appended up to ``rows`` (unchanged when it has as many): a
    fixed batch shape, so the jitted steps compile once for it, not again for a smaller
    remainder (an epoch's last training batch, a --max-tokens batch, an evaluation's last
    batch, as ``generate`` pads its last one). A PAD row carries no labels, adds nothing to the
    loss sums, and its decoded row is dropped."""
    missing = rows - len(batch.source)
    if missing <= 0:
        return batch
    return Batch(*(np.pad(np.asarray(a), ((0, missing), (0, 0)), constant_values=PAD) for a in batch))


def strip_specials(ids):
    """The ids of a model output up to the first EOS, without PAD and BOS."""
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
        if i == EOS:
            break
        if i not in (PAD, BOS):
            out.append(i)
    return out
