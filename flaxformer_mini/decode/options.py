"""Decoding options, checked in one place for the library, ``evaluate`` and ``generate``:
``check_options`` refuses what cannot work with an ``OptionError`` that names the option as the
library spells it and as the command line does."""

import math
import operator

from flaxformer_mini.model import memory

# The Flax WMT example's default length penalty: score = log p / ((5 + length) / 6) ** alpha,
# length counting the hypothesis's tokens with its EOS (`generate --length-penalty`).
DEFAULT_LENGTH_PENALTY = 0.6
# The largest length penalty's natural log, 1e30: a log-probability divided by more would come
# near float32's smallest normal number (1e-38), where scores round to 0 and stop ranking.
MAX_LOG_LENGTH_PENALTY = 30 * math.log(10)


class OptionError(ValueError):
    """A decoding option that cannot work. ``str()`` names the library's argument
    (``max_new_tokens=99``); ``cli`` says the same with the command line's option
    (``--max-new-tokens=99``), which ``generate`` and ``evaluate`` print."""

    def __init__(self, message, cli):
        super().__init__(message)
        self.cli = cli


# How the library and the command line name each option, for OptionError's two messages.
_NAMES = {
    "max_new_tokens": ("max_new_tokens", "--max-new-tokens"),
    "beam_size": ("beam size", "--beam-size"),
    "alpha": ("length penalty alpha", "--length-penalty"),
    "temperature": ("temperature", "--temperature"),
    "top_k": ("top_k", "--top-k"),
    "nbest": ("nbest", "--nbest"),
    "batch_size": ("batch size", "--batch-size"),
}


def _refuse(template, **values):
    """An OptionError from ``template``, whose ``{max_new_tokens}``-style fields name options."""
    lib, cli = ({name: spelled[i] for name, spelled in _NAMES.items()} for i in (0, 1))
    return OptionError(template.format(**lib, **values), template.format(**cli, **values))


def integer_option(name, value):
    """``value`` as an int, or an OptionError naming ``name``: counts set shapes and loop bounds,
    where a float (2.5, or 3.0) or a bool would reach JAX as a shape it cannot build."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise _refuse("{%s} must be an integer, got {v!r}" % name, v=value)


def _real(name, value):
    """``value`` when it is a real number, or an OptionError naming ``name`` (a string or None
    would fail inside the comparisons below with a message naming no option)."""
    if isinstance(value, (str, bytes, bool)) or not hasattr(value, "__float__"):
        raise _refuse("{%s} must be a number, got {v!r}" % name, v=value)
    return value


def check_options(model_config, *, max_new_tokens=None, beam_size=1, alpha=DEFAULT_LENGTH_PENALTY,
                  temperature=None, top_k=None, nbest=None):
    """Refuse decoding options that cannot work, naming the option (``OptionError``): the one
    place they are checked, for the library, ``evaluate`` and ``generate``. ``nbest``: how
    many of the ``beam_size`` hypotheses a caller wants (None: only the best one's tokens);
    None for ``max_new_tokens``, ``temperature`` and ``top_k`` means not given."""
    c = model_config
    max_new_tokens = None if max_new_tokens is None else integer_option("max_new_tokens", max_new_tokens)
    beam_size, alpha = integer_option("beam_size", beam_size), _real("alpha", alpha)
    temperature = None if temperature is None else _real("temperature", temperature)
    top_k = None if top_k is None else integer_option("top_k", top_k)
    nbest = None if nbest is None else integer_option("nbest", nbest)
    if max_new_tokens is not None:
        if max_new_tokens < 1:
            raise _refuse("{max_new_tokens} must be >= 1, got {n}", n=max_new_tokens)
        if max_new_tokens > c.max_len:
            raise _refuse("{max_new_tokens}={n} exceeds max_len={L}: the positional table holds {L} decoder "
                          "positions (BOS + {fed} fed-back tokens)", n=max_new_tokens, L=c.max_len, fed=c.max_len - 1)
    if beam_size < 1:
        raise _refuse("{beam_size} must be >= 1, got {w}", w=beam_size)
    if not alpha >= 0:  # NaN included (it fails every comparison)
        raise _refuse("{alpha} must be >= 0, got {a}", a=alpha)
    longest = c.max_len if max_new_tokens is None else max_new_tokens
    if alpha * math.log((5 + longest) / 6) > MAX_LOG_LENGTH_PENALTY:
        raise _refuse("{alpha}={a} makes the length penalty ((5 + length) / 6) ** {a} too large for float32 scores "
                      "at {L} tokens: the scores would round to 0 and rank nothing (at most {most:.4g} here; "
                      "GNMT uses 0.6 to 1)", a=alpha, L=longest,
                      most=MAX_LOG_LENGTH_PENALTY / math.log((5 + longest) / 6))
    sampling = temperature is not None or top_k is not None
    if sampling and beam_size > 1:
        raise _refuse("beam search ({beam_size} > 1) and sampling ({temperature}, {top_k}) exclude each other")
    if nbest is not None:
        if sampling:
            raise _refuse("{nbest} and scores come from beam search (greedy decoding is beam size 1), "
                          "not from sampling ({temperature}, {top_k})")
        if not 1 <= nbest <= beam_size:
            raise _refuse("{nbest} must be >= 1 and at most the beam size ({beam_size} {w}), got {n}",
                          w=beam_size, n=nbest)
    # `not > 0`, not `<= 0`: a NaN temperature fails every comparison and would slip through.
    if temperature is not None and not temperature > 0:
        raise _refuse("{temperature} must be > 0, got {t} (greedy decoding is temperature -> 0)", t=temperature)
    if top_k is not None and not 1 <= top_k <= c.target_vocab_size:
        raise _refuse("{top_k} must be in [1, {V}] (the target vocabulary), got {k}", V=c.target_vocab_size, k=top_k)


def check_decoding_memory(model_config, rows, beam_size, max_new_tokens, source_len):
    """Refuse (``OptionError``, naming the batch size and the beam size) decoding ``rows``
    sources with ``beam_size`` beams each when its least memory (``model/memory.py``) is more
    than the machine has free: before anything is allocated, not an out-of-memory error from
    XLA."""
    needed = memory.decoding_bytes(model_config, rows, max_new_tokens, source_len, beams=beam_size)
    short = memory.shortfall(needed)
    if short is not None:
        raise _refuse("decoding {n} source rows ({batch_size}) with {w} beams each ({beam_size}) takes at least "
                      "{needed}, more than the {short} free: give a smaller {beam_size} or {batch_size}",
                      n=f"{rows:,}", w=f"{beam_size:,}", needed=memory.gib(needed), short=short)
