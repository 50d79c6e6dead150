"""Tokenizers: ``word`` (the whitespace ``data.Vocab``), ``char``, ``bpe`` and ``unigram``.

Every kind maps the special tokens to the ids of ``data``: PAD=0, BOS=1, EOS=2, UNK=3, and
every kind has the same small interface (``Tokenizer``): ``encode``, ``decode``, ``unknown``,
``len``, ``save``, ``sha256``. ``train(kind, texts, vocab_size)`` builds one from training
text; a shared vocabulary is one tokenizer trained on both sides' texts, saved with the
prefix ``"shared"``.

Why Hugging Face ``tokenizers`` and not ``sentencepiece``: one library and one file format
(``tokenizer.json``) covers all three new kinds (WordLevel over characters, BPE, Unigram),
and that file holds the normaliser, the pre-tokeniser, the model and the decoder (so
``evaluate`` and ``generate`` need nothing but the file); the pipeline is composed from parts
(NFC plus regex replacements; the char kind is WordLevel behind a one-character ``Split``);
it trains from a Python iterator, ``encode_batch`` runs in Rust, in parallel across texts, and
each token carries the character offsets ``unknown`` uses. sentencepiece also has char and word
models, iterator training and offsets (``out_type='immutable_proto'``); the choice is for the
composed pipeline in one JSON file.

Normalisation (char, bpe, unigram): Unicode NFC, U+2581 (the Metaspace marker) read as a
space, every run of whitespace collapsed to one space, stripped at both ends. It lives in
the saved tokenizer file; ``normalize(text)`` runs that same normaliser, and
``decode(encode(s)) == normalize(s)`` whenever every character of ``s`` was seen in
training. ``word`` is ``data.Vocab`` exactly (``str.split``, no Unicode normalisation) and
its files ``vocab_source.json`` / ``vocab_target.json``.

As in ``data.Vocab``, special-token strings in the text are ordinary text, never control
tokens: a literal ``<eos>`` never encodes to EOS (it is spelled out in pieces, or UNK).

Hugging Face ``tokenizers`` is imported inside the functions that build or read its
tokenizers, so a ``word`` tokenizer, and a module importing this one for its names
(``runs.directory``), never load it.
"""

from pathlib import Path

from flaxformer_mini import files

from .batches import BOS, EOS, NUM_SPECIAL, PAD, SPECIAL_TOKENS, UNK, DataError, positive_int, strip_specials
from .vocab import Vocab

KINDS = ("word", "char", "bpe", "unigram")
_SUBWORD_MARK = "\u2581"  # "▁", SentencePiece's and HF Metaspace's word-start marker


class TokenizerFileError(DataError):
    """A tokenizer file is missing, unreadable or not the one the run recorded."""


def tokenizer_path(directory, kind, prefix):
    """Where ``save`` writes a tokenizer of ``kind`` for side ``prefix`` (source, target or
    shared): ``vocab_<prefix>.json`` for word (``data.Vocab``'s name), ``tokenizer_<prefix>.json``
    (HF format) for the others."""
    _check_kind(kind)
    name = f"vocab_{prefix}.json" if kind == "word" else f"tokenizer_{prefix}.json"
    return Path(directory) / name


def file_sha256(path):
    """Hex sha256 of a file's bytes; a missing file is a ``TokenizerFileError`` naming it."""
    path = Path(path)
    try:
        return files.file_sha256(path)
    except FileNotFoundError:
        raise TokenizerFileError(f"{path}: tokenizer file is missing") from None


def _check_kind(kind):
    if kind not in KINDS:
        raise ValueError(f"unknown tokenizer {kind!r}; choose one of: {', '.join(KINDS)}")


class Tokenizer:
    """The interface the run uses. ``encode`` adds no BOS/EOS (``data.make_batch`` does)."""

    kind = None
    requested_vocab_size = None  # the --vocab-size it was trained with (set by train)

    def encode(self, text):
        """Token ids of ``text`` (a list of ints), unknown pieces -> UNK."""
        raise NotImplementedError

    def encode_batch(self, texts):
        """``[encode(t) for t in texts]``; subclasses do it faster."""
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        """The text of a model output: up to the first EOS, without PAD and BOS."""
        raise NotImplementedError

    def unknown(self, text):
        """The distinct pieces of ``text`` that encode to UNK, in order of first appearance."""
        raise NotImplementedError

    def __len__(self):
        """Vocabulary size, special tokens included: the model's vocab size."""
        raise NotImplementedError

    # data.Vocab's names, so a Tokenizer drops in wherever a Vocab is used
    # (data.TextPairs, generation's unknown-word note).
    def unknown_words(self, text):
        return self.unknown(text)

    def unk_count(self, text):
        """How many tokens of ``text`` (with repeats) encode to UNK."""
        return self.encode(text).count(UNK)

    def save(self, directory, prefix):
        """Write the tokenizer into ``directory``; returns the file's path."""
        raise NotImplementedError

    def sha256(self, directory, prefix):
        """sha256 of the file ``save(directory, prefix)`` wrote, to record in the run."""
        return file_sha256(tokenizer_path(directory, self.kind, prefix))

    def describe(self, directory, prefix):
        """What a run records about its tokenizer, to check on resume (``check_resume``)."""
        path = tokenizer_path(directory, self.kind, prefix)
        return {
            "kind": self.kind,
            "vocab_size": len(self),
            # Unigram may learn fewer pieces than asked: resume compares what the user asked.
            "requested_vocab_size": self.requested_vocab_size,
            "file": path.name,
            "sha256": file_sha256(path),
        }


class WordTokenizer(Tokenizer):
    """The whitespace (word) tokenizer: a thin wrapper over ``data.Vocab``, its files."""

    kind = "word"

    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, text):
        return self.vocab.encode(text)

    def decode(self, ids):
        return self.vocab.decode(ids)

    def unknown(self, text):
        return self.vocab.unknown_words(text)

    def __len__(self):
        return len(self.vocab)

    def save(self, directory, prefix):
        path = tokenizer_path(directory, "word", prefix)
        self.vocab.save(path)
        return path


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers.Tokenizer`` (char, bpe or unigram) with data's special ids."""

    def __init__(self, kind, hf):
        self.kind, self.hf = kind, hf
        # Text that spells a special token is text, as in data.Vocab (HF would otherwise match
        # "<eos>" in the input to the EOS id).
        self.hf.encode_special_tokens = True
        for i, token in enumerate(SPECIAL_TOKENS):
            if hf.token_to_id(token) != i:
                raise ValueError(f"special token {token!r} must have id {i}, has {hf.token_to_id(token)}")

    @staticmethod
    def _fix(ids):
        # A Unigram vocabulary holds "<eos>" etc. as pieces its Viterbi search may pick for the
        # literal text; such text is an unknown word, as in data.Vocab.
        return [UNK if i < NUM_SPECIAL else i for i in ids]

    def encode(self, text):
        return self._fix(self.hf.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts):
        return [self._fix(e.ids) for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids):
        ids = strip_specials(ids)
        for i in ids:
            if not 0 <= i < len(self):
                raise ValueError(f"token id {i} is outside the vocabulary [0, {len(self)})")
        # UNK stays visible as "<unk>", as in data.Vocab.decode.
        return self.hf.decode(ids, skip_special_tokens=False)

    def unknown(self, text):
        encoding = self.hf.encode(text, add_special_tokens=False)
        # Offsets index the caller's text, before normalisation.
        pieces = (text[a:b] for i, (a, b) in zip(self._fix(encoding.ids), encoding.offsets) if i == UNK)
        return list(dict.fromkeys(pieces))

    def __len__(self):
        return self.hf.get_vocab_size()

    def save(self, directory, prefix):
        path = tokenizer_path(directory, self.kind, prefix)
        self.hf.save(str(path))
        return path


# ----------------------------------------------------------------------------- building


def normalizer():
    """A new Hugging Face normalizer, the one ``normalize`` applies: build it once to normalise many texts."""
    from tokenizers import Regex, normalizers

    return normalizers.Sequence(
        [
            normalizers.NFC(),
            normalizers.Replace(_SUBWORD_MARK, " "),
            normalizers.Replace(Regex(r"\s+"), " "),  # Rust's \s: Unicode White_Space
            normalizers.Strip(),
        ]
    )


def normalize(text):
    """The normalisation char, bpe and unigram apply (see the module docstring)."""
    return normalizer().normalize_str(text)


def _alphabet(kind, texts):
    """The distinct symbols a char/bpe/unigram vocabulary must hold (after normalisation)."""
    norm = normalizer()
    chars = set()
    for text in texts:
        chars.update(norm.normalize_str(text))
    if kind != "char" and " " in chars:
        chars.discard(" ")
    if kind != "char":
        chars.add(_SUBWORD_MARK)  # Metaspace prepends it to every word
    return chars


def train(kind, texts, vocab_size=None):
    """A ``Tokenizer`` of ``kind`` trained on ``texts`` (a list of strings).

    ``vocab_size`` (special tokens included) caps the vocabulary: for word the most frequent
    words are kept (None: all); bpe and unigram need it, and learn at most as many tokens as
    the text has characters, whatever larger size is asked; char keeps every character, so
    for char it is only checked. A bpe, unigram or char vocabulary smaller than the alphabet of
    ``texts`` plus the 4 special tokens is a ``ValueError`` naming both numbers (none of
    these drops characters).
    """
    _check_kind(kind)
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not one string")
    texts = list(texts)
    if vocab_size is not None:
        vocab_size = positive_int("vocab_size", vocab_size)
    if kind == "word":
        tokenizer = WordTokenizer(Vocab.build(texts, max_size=vocab_size))
        tokenizer.requested_vocab_size = vocab_size
        return tokenizer
    if vocab_size is None and kind != "char":
        raise ValueError(f"the {kind} tokenizer needs a vocab_size (--vocab-size)")
    alphabet = _alphabet(kind, texts)
    if not alphabet - {_SUBWORD_MARK}:
        raise ValueError("cannot train a tokenizer on empty texts")
    need = len(alphabet) + NUM_SPECIAL
    if vocab_size is not None and vocab_size < need:
        raise ValueError(
            f"vocab_size={vocab_size} is smaller than the {kind} tokenizer needs: {len(alphabet)} "
            f"distinct characters in the training text + {NUM_SPECIAL} special tokens = {need}"
        )
    requested = vocab_size
    if vocab_size is not None:
        # The most tokens the text can give: every BPE merge makes one token and joins two
        # symbols, so it has at most one per character; Unigram keeps pieces it finds. The
        # trainers allocate for the size asked (a Rust panic, or a u32 overflow, far above it).
        vocab_size = min(vocab_size, need if kind == "char" else need + sum(map(len, texts)))
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HF

    special = list(SPECIAL_TOKENS)  # trainers put them first, in order: ids 0..3
    if kind == "char":
        hf = HF(models.WordLevel(unk_token=SPECIAL_TOKENS[UNK]))
        hf.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one char each
        hf.decoder = decoders.Fuse()  # join the characters back without separators
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size or need, special_tokens=special, show_progress=False)
    else:
        # Metaspace: spaces become "▁" word-start marks, so decoding restores them exactly.
        hf = HF(models.BPE(unk_token=SPECIAL_TOKENS[UNK]) if kind == "bpe" else models.Unigram())
        hf.pre_tokenizer = pre_tokenizers.Metaspace()
        hf.decoder = decoders.Metaspace()
        if kind == "bpe":
            trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False)
        else:
            trainer = trainers.UnigramTrainer(
                vocab_size=vocab_size, special_tokens=special, unk_token=SPECIAL_TOKENS[UNK], show_progress=False
            )
    hf.normalizer = normalizer()
    hf.train_from_iterator(texts, trainer)
    tokenizer = HFTokenizer(kind, hf)
    tokenizer.requested_vocab_size = requested
    return tokenizer


def load(directory, kind, prefix, sha256=None):
    """The tokenizer ``save(directory, prefix)`` wrote. With ``sha256`` (as recorded by the
    run) a file whose bytes differ, e.g. edited by hand, is a ``TokenizerFileError`` naming
    the file; so is a missing or unreadable one."""
    path = tokenizer_path(directory, kind, prefix)
    actual = file_sha256(path)  # also: missing -> error naming it
    if sha256 is not None and actual != sha256:
        raise TokenizerFileError(
            f"{path}: tokenizer file changed since the run saved it (sha256 {actual[:12]}..., "
            f"recorded {sha256[:12]}...); restore it or start a new run"
        )
    if kind == "word":
        return WordTokenizer(Vocab.load(path))
    from tokenizers import Tokenizer as HF

    try:
        hf = HF.from_file(str(path))
        return HFTokenizer(kind, hf)
    except Exception as e:  # the Rust side raises a bare Exception on a bad file
        raise TokenizerFileError(f"{path}: not a {kind} tokenizer file: {e}") from None


def check_resume(recorded, kind, vocab_size):
    """Raise ``ValueError`` if a resumed run asks for another tokenizer kind or vocab size
    than the one it recorded (``recorded``: a ``describe()`` dict). None means unchanged."""
    if kind is not None and kind != recorded["kind"]:
        raise ValueError(f"the run was trained with --tokenizer {recorded['kind']}, not {kind}; start a new run to change it")
    before = recorded.get("requested_vocab_size")
    if vocab_size is not None and vocab_size != before:
        raise ValueError(
            f"the run was trained with --vocab-size {before} ({recorded['vocab_size']} tokens), not "
            f"{vocab_size}; start a new run to change it"
        )


__all__ = [
    "KINDS", "Tokenizer", "WordTokenizer", "HFTokenizer", "TokenizerFileError", "train", "load",
    "normalize", "tokenizer_path", "file_sha256", "check_resume", "PAD", "BOS", "EOS", "UNK",
]
