"""The ``word`` tokenizer's vocabulary: whitespace words after the special tokens, saved as
JSON with a format name and version."""

import json
from collections import Counter
from pathlib import Path

from flaxformer_mini.files import write_atomic

from .batches import NUM_SPECIAL, SPECIAL_TOKENS, UNK, DataError, non_negative_int, positive_int, strip_specials

_VOCAB_FORMAT = "flaxformer-mini-vocab"
_VOCAB_VERSION = 1


class Vocab:
    """A whitespace tokenizer's vocabulary: the special tokens (ids 0..3), then words.

    Special-token strings in the text are ordinary unknown words: a literal ``<eos>`` in a
    sentence encodes to UNK, never to an EOS that would cut the sentence short.
    """

    def __init__(self, tokens):
        tokens = tuple(tokens)
        if tokens[:NUM_SPECIAL] != SPECIAL_TOKENS:
            raise ValueError(f"a vocabulary must start with the special tokens {SPECIAL_TOKENS}, got {tokens[:NUM_SPECIAL]}")
        for token in tokens[NUM_SPECIAL:]:
            if not isinstance(token, str) or token.split() != [token]:
                raise ValueError(f"vocabulary token {token!r} is not a single whitespace-free word")
        duplicates = sorted(t for t, c in Counter(tokens).items() if c > 1)
        if duplicates:
            raise ValueError(f"duplicate vocabulary tokens: {duplicates}")
        self.tokens = tokens
        self._ids = {token: i for i, token in enumerate(tokens) if i >= NUM_SPECIAL}

    @classmethod
    def build(cls, texts, min_freq=1, max_size=None):
        """Words of ``texts`` seen at least ``min_freq`` times, most frequent first, ties in
        alphabetical order (so the same texts always give the same ids). ``max_size`` caps
        the size of the whole vocabulary, special tokens included: the model's vocab size."""
        if isinstance(texts, str):
            raise TypeError("texts must be an iterable of strings, not one string")
        min_freq = positive_int("min_freq", min_freq)
        if max_size is not None and non_negative_int("max_size", max_size) < NUM_SPECIAL:
            raise ValueError(f"max_size must be >= {NUM_SPECIAL} (the special tokens), got {max_size}")
        counts = Counter(word for text in texts for word in text.split() if word not in SPECIAL_TOKENS)
        words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[: max_size - NUM_SPECIAL]
        return cls(SPECIAL_TOKENS + tuple(words))

    def __len__(self):
        return len(self.tokens)

    def __eq__(self, other):
        return isinstance(other, Vocab) and self.tokens == other.tokens

    def __hash__(self):
        return hash(self.tokens)

    def __repr__(self):
        return f"Vocab({len(self)} tokens)"

    def encode(self, text):
        """Token ids of ``text``, unknown words -> UNK. No BOS/EOS."""
        return [self._ids.get(word, UNK) for word in text.split()]

    def encode_batch(self, texts):
        """``[encode(t) for t in texts]``: the tokenizers' interface (``tokenizers.Tokenizer``)."""
        return [self.encode(text) for text in texts]

    def decode(self, ids):
        """The text of a model output: up to the first EOS, without PAD and BOS."""
        words = []
        for i in strip_specials(ids):
            if not 0 <= i < len(self.tokens):
                raise ValueError(f"token id {i} is outside the vocabulary [0, {len(self.tokens)})")
            words.append(self.tokens[i])
        return " ".join(words)

    def unknown_words(self, text):
        """The distinct words of ``text`` that encode to UNK, in order of first appearance."""
        return list(dict.fromkeys(w for w in text.split() if w not in self._ids))

    def unk_count(self, text):
        """How many words of ``text`` (with repeats) encode to UNK."""
        return sum(w not in self._ids for w in text.split())

    def to_bytes(self):
        """The saved file's bytes (its checksum is recorded in the run's config)."""
        payload = {"format": _VOCAB_FORMAT, "version": _VOCAB_VERSION, "tokens": list(self.tokens)}
        # One token a line (indent=1): a saved vocabulary diffs well.
        return (json.dumps(payload, ensure_ascii=False, indent=1) + "\n").encode("utf-8")

    def save(self, path):
        write_atomic(path, self.to_bytes())

    @classmethod
    def load(cls, path):
        path = Path(path)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError(f"{path}: not a vocabulary file: {e}") from None
        if not isinstance(payload, dict) or payload.get("format") != _VOCAB_FORMAT:
            raise DataError(f"{path}: not a vocabulary file (no \"format\": \"{_VOCAB_FORMAT}\")")
        if payload.get("version") != _VOCAB_VERSION:
            raise DataError(f"{path}: vocabulary format version {payload.get('version')!r} is not supported (this code reads version {_VOCAB_VERSION})")
        tokens = payload.get("tokens")
        if not isinstance(tokens, list):
            raise DataError(f"{path}: \"tokens\" must be a list of strings")
        try:
            return cls(tokens)
        except (TypeError, ValueError) as e:
            raise DataError(f"{path}: {e}") from None
