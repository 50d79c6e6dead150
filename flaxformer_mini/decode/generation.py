"""Decode any number of text lines with a model, in bounded batches: what ``generate`` runs.

Inputs are encoded by a codec (``data.codec.Codec``: a synthetic task's space-separated integers,
or text through tokenizers, with words outside the vocabulary mapped to UNK and reported, so
an odd output is never a mystery).

Any number of inputs streams through in chunks: each chunk is sorted by length, decoded in
batches of ``batch_size`` rows (padded to a few fixed shapes, so the decoder compiles a
handful of times, not once per batch), and its outputs come back in input order before the
next chunk is read. Memory holds one chunk, whatever the input's size. Given ``ready`` (can
the next input be read without waiting?), a chunk also ends where the input pauses, so lines
typed or sent one at a time are answered as they come.

Every input gives exactly one output, so output line i is always input line i's: a blank
input gives an empty output, and so does an input longer than the model takes (with the
reason in ``Generated.left_empty``); one such line never stops the others. An input with no
text at all is refused before anything is yielded.

With ``nbest``, each output also carries the ``nbest`` best beam-search hypotheses and their
scores (``Generated.hypotheses``): a score is the hypothesis's log-probability (natural log)
divided by GNMT's length penalty ((5 + length) / 6) ** alpha, length counting its tokens
with its EOS: ``search.beam_search``'s scores, unchanged. Greedy decoding is beam size 1.
"""

import dataclasses

import numpy as np

from flaxformer_mini.data import EOS, make_source
from flaxformer_mini.decode.options import DEFAULT_LENGTH_PENALTY, check_decoding_memory
from flaxformer_mini.decode.search import NO_HYPOTHESIS, beam_search, decode

DEFAULT_BATCH_SIZE = 64
CHUNK_BATCHES = 16  # inputs read, sorted and decoded together: CHUNK_BATCHES * batch_size
LENGTH_MULTIPLE = 8  # sources are padded to a multiple of this: few compiled shapes


@dataclasses.dataclass
class Generated:
    text: str
    unknown_words: list  # input words (characters, pieces: ``unit``) mapped to UNK (text runs)
    # Why ``text`` is empty without decoding, or None: the input is longer than the model
    # takes ("has 100 tokens; ..."). A blank input is not decoded either, and needs no reason.
    left_empty: str | None = None
    # False when ``text`` stopped at max_new_tokens before its EOS (cut short).
    finished: bool = True
    # With ``nbest``: [(text, score)] of the best hypotheses, best first (``text`` is the
    # first's); [] for an input not decoded. A score of -inf: the beam held no such hypothesis.
    hypotheses: list | None = None
    unit: str = "word"  # what ``unknown_words`` are: "word", "character" or "piece"


def generate_lines(texts, codec, load_model, model_config, *, max_new_tokens, batch_size=DEFAULT_BATCH_SIZE, seed=0,
                   beam_size=1, alpha=DEFAULT_LENGTH_PENALTY, temperature=None, top_k=None, nbest=None, unit="word",
                   ready=None):
    """Yield a ``Generated`` per text of the iterable ``texts`` (read lazily), in input order.

    ``codec``: ``encode(text) -> (ids, unknown words)`` and ``decode(ids) -> text``;
    ``load_model()``: the model, called once, after the first inputs are known good (a bad
    line fails fast); ``model_config``: its ``ModelConfig``. Greedy by default; beam search with
    ``beam_size`` > 1 (the best beam; ``alpha``: its length penalty); sampling when
    ``temperature`` or ``top_k`` is given (seeded per batch, so the same inputs, seed and
    batch size give the same samples). ``nbest`` (1 to ``beam_size``; greedy is beam size 1):
    also the ``nbest`` best hypotheses with their scores. ``unit``: what ``codec`` maps to UNK
    ("word", "character", "piece"). ``ready()``: whether another text can be read from ``texts``
    without waiting (None: always); the texts read so far are decoded when it is not, so an
    interactive caller gets each answer before it sends the next line (sampling's batches, and
    so its samples, then follow the input's pauses). Check the options first
    (``options.check_options``).
    """
    # Here, not in the generator: refused at the call, before any input is read.
    if isinstance(texts, (str, bytes)):  # iterating one text would decode each of its characters
        raise TypeError(f"texts: expected an iterable of texts, one per input, got one {type(texts).__name__} "
                        f"(give [text] for a single input)")
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    options = dict(beam_size=beam_size, alpha=alpha, temperature=temperature, top_k=top_k)
    return _stream(iter(texts), codec, load_model, model_config, max_new_tokens, batch_size, seed, options, nbest, unit,
                   ready)


def _chunk(texts, size, ready):
    """Up to ``size`` texts, fewer where ``ready()`` says the next would be waited for; and
    whether it ended there (a pause) rather than at ``size`` or the end of the input."""
    chunk = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == size:
            return chunk, False
        if ready is not None and not ready():
            return chunk, True
    return chunk, False


def _stream(texts, codec, load_model, model_config, max_new_tokens, batch_size, seed, options, nbest, unit, ready):
    max_len = model_config.max_len
    model, n_read, batch_index, seen_text = None, 0, 0, False
    checked = set()  # the batch row counts whose decoding memory was checked

    def undecoded(unknown_words=(), left_empty=None):  # a blank or left-empty input's output
        return Generated("", list(unknown_words), left_empty, hypotheses=None if nbest is None else [], unit=unit)

    blanks_held = 0  # leading blank inputs: yielded with the first text, refused if none comes
    while True:
        chunk, paused = _chunk(texts, CHUNK_BATCHES * batch_size, ready)
        if not chunk:
            break
        encoded = [_encode(codec, max_len, text, n_read + i) for i, text in enumerate(chunk, 1)]
        n_read += len(chunk)
        if not seen_text and all(e is None for e in encoded):
            blanks_held += len(chunk)  # a count, not the lines: memory stays bounded
            continue
        seen_text = True
        yield from (undecoded() for _ in range(blanks_held))
        blanks_held = 0
        # Blank and left-empty inputs keep their empty outputs; the others are decoded below.
        outputs = [undecoded() if e is None else undecoded(e.unknown_words, e.left_empty) for e in encoded]
        fit = [i for i, e in enumerate(encoded) if e is not None and e.left_empty is None]
        order = sorted(fit, key=lambda i: len(encoded[i].ids))
        # Batches of batch_size rows, or of all the chunk's inputs when fewer: a batch size
        # above the input's size pads no rows of PAD (it only needs clamping). A chunk cut by a
        # pause in the input pads its rows to a power of two: however the input pauses, the
        # decoder compiles for a few row counts, not one per count of lines that arrived together.
        rows_per_batch = min(batch_size, len(order))
        if paused and order:
            rows_per_batch = min(batch_size, 1 << (rows_per_batch - 1).bit_length())
        if order and rows_per_batch not in checked:  # before the checkpoint is read: fail fast
            checked.add(rows_per_batch)
            shortest = len(encoded[order[0]].ids) + 1  # + EOS: a lower bound of every batch's source length
            check_decoding_memory(model_config, rows_per_batch, options["beam_size"], max_new_tokens, shortest)
        if fit and model is None:  # after the first inputs are known good: a bad line fails fast
            model = load_model()
        for start in range(0, len(order), rows_per_batch or 1):
            rows = order[start : start + rows_per_batch]
            source = _source([encoded[i].ids for i in rows], rows_per_batch, max_len)
            if nbest is None:
                # Modulo 2**63, jax.random.key's limit: a seed near it goes on past the first batch.
                tokens = decode(model, source, max_new_tokens, seed=(seed + batch_index) % 2**63, **options)
                best, scores = np.asarray(tokens)[:, None], None  # (B, 1, N)
            else:  # greedy is beam size 1
                best, scores = beam_search(model, source, max_new_tokens, beam_size=options["beam_size"],
                                           alpha=options["alpha"])
                best, scores = np.asarray(best)[:, :nbest], np.asarray(scores)[:, :nbest]
            batch_index += 1
            for r, i in enumerate(rows):
                texts_r = [codec.decode(row) for row in best[r].tolist()]
                hypotheses = None if nbest is None else [
                    (text, float(score) if score > NO_HYPOTHESIS else float("-inf"))
                    for text, score in zip(texts_r, scores[r])]
                outputs[i] = Generated(texts_r[0], encoded[i].unknown_words, finished=bool((best[r, 0] == EOS).any()),
                                       hypotheses=hypotheses, unit=unit)
        yield from outputs
    if not seen_text:
        raise ValueError("empty input: give the texts as arguments or one per line on standard input"
                         + (f" ({n_read} blank line{'s' if n_read > 1 else ''} and no text)" if n_read else ""))


@dataclasses.dataclass
class _Encoded:
    ids: list
    unknown_words: list
    left_empty: str | None = None  # why the model cannot take it (Generated.left_empty)


def _encode(codec, max_len, text, number):
    """The input's token ids, or None for a blank input (nothing to decode)."""
    if not text.strip():
        return None
    try:
        ids, unknown = codec.encode(text)
    except ValueError as e:  # a synthetic run's token outside its values: say which input
        raise ValueError(f"input {number}: {e}") from None
    if not ids:  # a subword tokenizer may keep none of an odd line's characters
        return _Encoded(ids, unknown, "has no tokens in the run's vocabulary")
    if len(ids) + 1 > max_len:  # + EOS
        return _Encoded(ids, unknown, f"has {len(ids)} tokens; with EOS that exceeds the model's max_len={max_len}, "
                                      f"so at most {max_len - 1} tokens fit")
    return _Encoded(ids, unknown)


def _source(sequences, batch_size, max_len):
    """(batch_size, S) encoder input: S rounded up to LENGTH_MULTIPLE (at most max_len), and a
    short last batch filled with rows of PAD (masked out, their outputs dropped), so shapes
    repeat."""
    longest = max(len(s) for s in sequences) + 1  # + EOS
    source = make_source(sequences, min(-(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE, max_len))
    return np.pad(source, ((0, batch_size - len(sequences)), (0, 0)))
