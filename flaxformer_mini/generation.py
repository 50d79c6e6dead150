"""``flaxformer-mini generate``: decode text with a trained run.

Inputs are read in the run's own token format: for a synthetic task, space-separated
integers (``5 3 9 2 7``); for a text run, words, with words outside the training
vocabulary mapped to UNK (and reported, so an odd output is never a mystery).
"""

import dataclasses

import numpy as np

from flaxformer_mini import decoding
from flaxformer_mini.data import make_source
from flaxformer_mini.run import Run


@dataclasses.dataclass
class Generated:
    text: str
    unknown_words: list  # input words mapped to UNK (text runs)


def generate(run_dir, texts, *, max_new_tokens=None, beam_size=1, temperature=None, top_k=None, seed=0,
             alpha=decoding.DEFAULT_LENGTH_PENALTY):
    """Decode each of ``texts`` with the latest checkpoint of the run in ``run_dir``.

    Greedy by default; beam search with ``beam_size`` > 1 (the best beam); sampling when
    ``temperature`` or ``top_k`` is given.
    """
    if not texts:
        raise ValueError("empty input: give the texts as arguments or one per line on standard input")
    run = Run.open(run_dir)
    max_len = run.config.model.max_len
    max_new_tokens = max_len if max_new_tokens is None else max_new_tokens
    decoding.check_options(run.config.model, max_new_tokens=max_new_tokens, beam_size=beam_size, alpha=alpha,
                           temperature=temperature, top_k=top_k)
    encoded, unknown = [], []
    for i, text in enumerate(texts, 1):
        ids, unk = run.codec.encode(text)
        if not ids:
            raise ValueError(f"input {i} is empty")
        if len(ids) + 1 > max_len:  # + EOS
            raise ValueError(f"input {i} has {len(ids)} tokens; with EOS that exceeds the model's max_len={max_len}, "
                             f"so at most {max_len - 1} tokens fit")
        encoded.append(ids)
        unknown.append(unk)
    tokens = decoding.decode(run.latest_state().model(), make_source(encoded), max_new_tokens,
                             beam_size=beam_size, alpha=alpha, temperature=temperature, top_k=top_k, seed=seed)
    return [Generated(run.codec.decode(row), unk) for row, unk in zip(np.asarray(tokens).tolist(), unknown)]
