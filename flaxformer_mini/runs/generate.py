"""A finished run's latest checkpoint decoding any number of text lines: what
``flaxformer-mini generate`` runs (``decode/generation.py`` streams them, in bounded batches)."""

from flaxformer_mini.decode.generation import DEFAULT_BATCH_SIZE, generate_lines
from flaxformer_mini.decode.options import DEFAULT_LENGTH_PENALTY, check_options
from flaxformer_mini.runs.run import Run

# What a text run's tokenizer maps to UNK, for the note that names them.
UNKNOWN_UNITS = {"word": "word", "char": "character", "bpe": "piece", "unigram": "piece"}


def generate(run_dir, texts, *, max_new_tokens=None, beam_size=1, temperature=None, top_k=None, seed=0,
             alpha=DEFAULT_LENGTH_PENALTY, batch_size=DEFAULT_BATCH_SIZE, nbest=None):
    """Decode each of ``texts`` (any iterable, read lazily) with the latest checkpoint of the
    run in ``run_dir``; yields a ``Generated`` per input, in input order.

    Greedy by default; beam search with ``beam_size`` > 1 (the best beam; ``alpha``: its
    length penalty); sampling when ``temperature`` or ``top_k`` is given (seeded per batch,
    so the same inputs, seed and batch size give the same samples). ``nbest`` (1 to
    ``beam_size``; greedy is beam size 1): also the ``nbest`` best hypotheses with their
    scores, in ``Generated.hypotheses``.
    """
    run = Run.open(run_dir)
    max_len = run.config.model.max_len
    max_new_tokens = max_len if max_new_tokens is None else max_new_tokens
    check_options(run.config.model, max_new_tokens=max_new_tokens, beam_size=beam_size, alpha=alpha,
                  temperature=temperature, top_k=top_k, nbest=nbest)
    return generate_lines(texts, run.codec, lambda: run.latest_state().model(), max_len,
                          max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, beam_size=beam_size,
                          alpha=alpha, temperature=temperature, top_k=top_k, nbest=nbest,
                          unit=UNKNOWN_UNITS.get(run.config.data.tokenizer, "word"))
