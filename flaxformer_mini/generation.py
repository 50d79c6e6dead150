"""``flaxformer-mini generate``: decode text with a trained run.

Inputs are read in the run's own token format: for a synthetic task, space-separated
integers (``5 3 9 2 7``); for a text run, words, with words outside the training
vocabulary mapped to UNK (and reported, so an odd output is never a mystery).
"""

import dataclasses

import numpy as np

from flaxformer_mini import decoding
from flaxformer_mini.data import SyntheticTask, make_source
from flaxformer_mini.fit import load_run
from flaxformer_mini.run import RunDir, load_vocabularies


@dataclasses.dataclass
class Generated:
    text: str
    unknown_words: list  # input words mapped to UNK (text runs)


class Codec:
    """Text <-> ids for a run: a synthetic task's integers, or the run's vocabularies."""

    def __init__(self, run_dir, config):
        self.synthetic = config.data.kind == "synthetic"
        if self.synthetic:
            d = config.data
            self.task = SyntheticTask(d.task, d.vocab_size, d.min_len, d.max_len)
        else:
            self.source_vocab, self.target_vocab = load_vocabularies(RunDir(run_dir))

    def encode(self, text):
        if self.synthetic:
            return self.task.encode_text(text), []
        return self.source_vocab.encode(text), self.source_vocab.unknown_words(text)

    def decode(self, ids):
        return self.task.decode_ids(ids) if self.synthetic else self.target_vocab.decode(ids)


def generate(run_dir, texts, *, max_new_tokens=None, beam_size=1, temperature=None, top_k=None, seed=0,
             alpha=decoding.DEFAULT_LENGTH_PENALTY):
    """Decode each of ``texts`` with the latest checkpoint of the run in ``run_dir``.

    Greedy by default; beam search with ``beam_size`` > 1 (the best beam); sampling when
    ``temperature`` or ``top_k`` is given.
    """
    if not texts:
        raise ValueError("empty input: give the texts as arguments or one per line on standard input")
    if beam_size < 1:
        raise ValueError(f"--beam-size must be >= 1, got {beam_size}")
    sampling = temperature is not None or top_k is not None
    if sampling and beam_size > 1:
        raise ValueError("--beam-size and --temperature/--top-k exclude each other: beam search or sampling")
    config, trainer, state = load_run(run_dir)
    codec = Codec(run_dir, config)
    max_len = config.model.max_len
    encoded, unknown = [], []
    for i, text in enumerate(texts, 1):
        ids, unk = codec.encode(text)
        if not ids:
            raise ValueError(f"input {i} is empty")
        if len(ids) + 1 > max_len:  # + EOS
            raise ValueError(f"input {i} has {len(ids)} tokens; with EOS that exceeds the model's max_len={max_len}, "
                             f"so at most {max_len - 1} tokens fit")
        encoded.append(ids)
        unknown.append(unk)
    tokens = decoding.decode(trainer.model(state), make_source(encoded), max_new_tokens or max_len,
                             beam_size=beam_size, alpha=alpha, temperature=temperature, top_k=top_k, seed=seed)
    return [Generated(codec.decode(row), unk) for row, unk in zip(np.asarray(tokens).tolist(), unknown)]
