"""``generate`` of a finished run: its latest checkpoint decoding any number of text lines in
the run's own format (``decode/generation.py``), one ``Generated`` per input, in order."""

from flaxformer_mini.decode.generation import DEFAULT_BATCH_SIZE, generate_lines
from flaxformer_mini.decode.options import DEFAULT_LENGTH_PENALTY, check_options
from flaxformer_mini.runs.run import Run

# What a run's tokenizer maps to UNK, by kind: the unit ``Generated.unknown_words`` holds.
UNKNOWN_UNITS = {"word": "word", "char": "character", "bpe": "piece", "unigram": "piece"}


def generate(run_dir, texts, *, max_new_tokens=None, beam_size=1, temperature=None, top_k=None, seed=0,
             alpha=DEFAULT_LENGTH_PENALTY, batch_size=DEFAULT_BATCH_SIZE, nbest=None, ready=None):
    """Decode each of ``texts`` (any iterable, read lazily) with the latest checkpoint of the
    run in ``run_dir``; yields a ``Generated`` per input, in input order.

    Greedy by default; beam search with ``beam_size`` > 1 (the best beam; ``alpha``: its
    length penalty); sampling when ``temperature`` or ``top_k`` is given (seeded per batch,
    so the same inputs, seed and batch size give the same samples). ``nbest`` (1 to
    ``beam_size``; greedy is beam size 1): also the ``nbest`` best hypotheses with their
    scores, in ``Generated.hypotheses``. ``ready``: whether another text can be read without
    waiting (``generate_lines``). The options are checked here, before any input is read.
    """
    run = Run.open(run_dir)
    max_new_tokens = run.config.model.max_len if max_new_tokens is None else max_new_tokens
    check_options(run.config.model, max_new_tokens=max_new_tokens, beam_size=beam_size, alpha=alpha,
                  temperature=temperature, top_k=top_k, nbest=nbest)
    # A run trained with --ema decodes with the parameters' moving average (TrainState.for_inference).
    return generate_lines(texts, run.codec, lambda: run.latest_state().for_inference().model(), run.config.model,
                          max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, beam_size=beam_size,
                          alpha=alpha, temperature=temperature, top_k=top_k, nbest=nbest,
                          unit=UNKNOWN_UNITS.get(run.config.data.tokenizer, "word"), ready=ready)
