"""Text <-> token ids in a run's own format: a synthetic task's integers, or text through the
run's tokenizers (words, characters or subwords)."""

from .synthetic import SyntheticTask


class Codec:
    """Text <-> token ids in a run's own format: a synthetic task's integers, or text through
    the run's tokenizers (words, characters or subwords)."""

    def __init__(self, task: SyntheticTask | None = None, vocabs=None):
        self._task, self._vocabs = task, vocabs

    def encode(self, text):
        """(ids, unknown words mapped to UNK)."""
        if self._task is not None:
            return self._task.encode_text(text), []
        source = self._vocabs[0]
        return source.encode(text), source.unknown_words(text)

    def decode(self, ids):
        return self._task.decode_ids(ids) if self._task is not None else self._vocabs[1].decode(ids)
