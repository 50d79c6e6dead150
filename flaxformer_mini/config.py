"""Model configuration and its named presets.

A ``ModelConfig`` holds the constructor arguments of seed 001's ``Transformer``, in the
seed's order, so ``Transformer(**asdict(cfg), rngs=...)`` and
``torch_ref.Transformer(**asdict(cfg))`` build the two twins of the same model.
"""

import dataclasses


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

    def __post_init__(self):
        problems = []
        for name in ("source_vocab_size", "target_vocab_size", "max_len", "embed_size", "heads", "num_layers"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.heads >= 1 and self.embed_size % self.heads:
            problems.append(f"embed_size={self.embed_size} is not divisible by heads={self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        if not 0 <= self.src_pad_idx < self.source_vocab_size:
            problems.append(f"src_pad_idx={self.src_pad_idx} is outside the source vocabulary [0, {self.source_vocab_size})")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    def to_dict(self):
        return dataclasses.asdict(self)

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
