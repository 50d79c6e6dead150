"""Model configuration and its named presets.

A ``ModelConfig`` holds the constructor arguments of seed 001's ``Transformer``, in the
seed's order, then the keyword-only ``ffn_dim`` (feed-forward width F; None = the seed's
F = D) and ``tie_embeddings`` (None = the seed's separate tables), so
``Transformer(**cfg.to_dict(), rngs=...)`` and ``torch_ref.Transformer(**cfg.to_dict())`` build the
two twins of the same model.
"""

import dataclasses
import numbers

# A run's compute dtypes, by name (run_config.COMPUTE_DTYPES maps them to JAX's): here, where
# the CLI's parser reads them without starting JAX.
DTYPES = ("float32", "bfloat16")

# What ``tie_embeddings`` may tie (None: nothing, the seed's model), as fairseq's options do:
# "decoder" the target embedding and the output projection (--share-decoder-input-output-embed),
# "all" those and the source embedding too (--share-all-embeddings: one vocabulary for both
# sides, so the source and target vocabularies must have one size). Here, where the CLI's
# parser reads them without starting JAX.
TIE_EMBEDDINGS = ("decoder", "all")

_SIZE_FIELDS = ("source_vocab_size", "target_vocab_size", "max_len", "embed_size", "heads", "num_layers")
_INTEGER_FIELDS = ("src_pad_idx", *_SIZE_FIELDS)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    src_pad_idx: int
    source_vocab_size: int
    target_vocab_size: int
    max_len: int
    embed_size: int
    heads: int
    num_layers: int
    dropout: float
    # Not a seed argument: keyword-only in both twins' constructors, so it comes last, with a
    # default (a run's config.json written before it existed still loads). None = F = D.
    ffn_dim: int | None = None
    # Keyword-only too, after ffn_dim: which embedding tables are one (TIE_EMBEDDINGS). None,
    # the default, is the seed's untied model, and to_dict leaves it out: an untied model's
    # dict (config.json, file metadata, the constructors' arguments) holds no key for it, and
    # a dict without it (a run's config.json written without the field) loads untied.
    tie_embeddings: str | None = None

    def __post_init__(self):
        # Types first: a value read from a hand-written JSON (`parity check --config`) may be a
        # string, and a comparison with it would fail naming neither the field nor the value.
        problems = [f"{name} must be an integer, got {getattr(self, name)!r}" for name in _INTEGER_FIELDS
                    if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), numbers.Integral)]
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, numbers.Real):
            problems.append(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        if self.ffn_dim is not None and (isinstance(self.ffn_dim, bool) or not isinstance(self.ffn_dim, numbers.Integral)):
            problems.append(f"ffn_dim must be None (= embed_size) or an integer >= 1, got {self.ffn_dim!r}")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))
        # numpy's integers and floats pass as numbers; stored as Python's, since json (a run's
        # config.json, a file's metadata) writes no numpy scalar.
        for name in (*_INTEGER_FIELDS, *(("ffn_dim",) if self.ffn_dim is not None else ())):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "dropout", float(self.dropout))
        for name in _SIZE_FIELDS:
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.ffn_dim is not None and self.ffn_dim < 1:
            problems.append(f"ffn_dim must be None (= embed_size) or an integer >= 1, got {self.ffn_dim!r}")
        if self.heads >= 1 and self.embed_size % self.heads:
            problems.append(f"embed_size={self.embed_size} is not divisible by heads={self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        if self.tie_embeddings is not None and self.tie_embeddings not in TIE_EMBEDDINGS:
            problems.append(f"tie_embeddings must be None or one of {', '.join(map(repr, TIE_EMBEDDINGS))}, "
                            f"got {self.tie_embeddings!r}")
        elif self.tie_embeddings == "all" and self.source_vocab_size != self.target_vocab_size:
            problems.append(f"tie_embeddings='all' shares one table between the source and target vocabularies, "
                            f"which must then have one size, got {self.source_vocab_size} and {self.target_vocab_size}")
        if not 0 <= self.src_pad_idx < self.source_vocab_size:
            problems.append(f"src_pad_idx={self.src_pad_idx} is outside the source vocabulary [0, {self.source_vocab_size})")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    def to_dict(self):
        d = dataclasses.asdict(self)
        if d["tie_embeddings"] is None:  # untied, the seed's model: no key, as the seed has no argument
            del d["tie_embeddings"]
        return d

    @property
    def feed_forward_width(self):
        """F, the width of every block's feed-forward hidden layer."""
        return self.embed_size if self.ffn_dim is None else self.ffn_dim

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


PRESETS = {
    # Seed 001's example: vocabularies 8, max_len 10, width 512, 8 heads, 6 + 6 layers.
    "seed": ModelConfig(
        src_pad_idx=0, source_vocab_size=8, target_vocab_size=8, max_len=10,
        embed_size=512, heads=8, num_layers=6, dropout=0.2,
    ),
    # For tests: odd, distinct sizes, so a swapped axis changes a shape (K = 30 / 5 = 6).
    "tiny": ModelConfig(
        src_pad_idx=0, source_vocab_size=23, target_vocab_size=19, max_len=17,
        embed_size=30, heads=5, num_layers=2, dropout=0.1,
    ),
    # The default for `flaxformer-mini train`: small enough to learn the synthetic tasks on
    # a 2-core CPU in minutes. Vocabularies and max_len come from the data.
    "small": ModelConfig(
        src_pad_idx=0, source_vocab_size=16, target_vocab_size=16, max_len=11,
        embed_size=64, heads=4, num_layers=2, dropout=0.0,
    ),
    # Real tasks. Vocabularies and max_len are placeholders, replaced from the data by the run
    # (as for "small"). "medium" has F = 4D as in the paper and runs on a 2-core CPU, slowly
    # (its CMUdict run: docs/data.md).
    "medium": ModelConfig(
        src_pad_idx=0, source_vocab_size=16, target_vocab_size=16, max_len=11,
        embed_size=256, heads=4, num_layers=3, dropout=0.1, ffn_dim=1024,
    ),
    # "Attention Is All You Need"'s base model (Vaswani et al. 2017, Table 3): D 512, 8 heads,
    # 6 + 6 layers, F 2048, dropout 0.1.
    "transformer-base": ModelConfig(
        src_pad_idx=0, source_vocab_size=16, target_vocab_size=16, max_len=11,
        embed_size=512, heads=8, num_layers=6, dropout=0.1, ffn_dim=2048,
    ),
    # The seed's width and depth with a realistic vocabulary and length (benchmarks).
    "base": ModelConfig(
        src_pad_idx=0, source_vocab_size=1000, target_vocab_size=1000, max_len=128,
        embed_size=512, heads=8, num_layers=6, dropout=0.1,
    ),
}


def get_preset(name):
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}") from None
