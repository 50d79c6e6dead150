"""What a run is: its data, model, optimizer and batch settings, as one frozen config.

``RunConfig`` is what ``config.json`` holds and what a resumed run is checked against.
``resolve_config`` derives it from a user's options and the loaded data (vocabulary sizes and
lengths come from the data, width and depth from a preset, the schedule's factor from the
peak learning rate), so the CLI only parses options.
"""

import dataclasses
import math

import jax.numpy as jnp

from flaxformer_mini.data.parallel_text import LENGTH_MULTIPLE, check_columns
from flaxformer_mini.decode.options import DEFAULT_LENGTH_PENALTY, OptionError, check_options
from flaxformer_mini.model.config import DTYPES, ModelConfig, get_preset
from flaxformer_mini.model.transformer import Transformer
from flaxformer_mini.runs.selection import BEST_METRICS
from flaxformer_mini.train.optimizer import TrainConfig

FORMAT, VERSION = "flaxformer-mini-run", 2

# The compute dtype of each name in config.DTYPES: parameters always stay float32 (docs/design.md, Numerics).
COMPUTE_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}
assert tuple(COMPUTE_DTYPES) == DTYPES


class RunConfigError(ValueError):
    """An --out directory, a run config or an option that cannot be used."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where a run's examples come from.

    ``max_len`` is the longest sequence in tokens, without BOS/EOS, for both kinds: the
    longest synthetic sequence drawn, or the longest side of a text pair kept (longer pairs
    are dropped and counted). The model's ``max_len`` is one more (the EOS, or the BOS).
    """

    kind: str  # "synthetic" or "tsv"
    task: str | None = None  # synthetic: copy, reverse, sort
    vocab_size: int = 16  # synthetic: ids, the 4 special tokens included
    min_len: int = 1  # synthetic: shortest sequence drawn
    max_len: int = 10
    eval_sequences: int = 512  # synthetic: held-out sequences
    train_path: str | None = None
    valid_path: str | None = None
    # Text runs. Evaluation during training reads at most eval_pairs held-out pairs (None: all).
    # Without valid_path, `holdout` training pairs (at most a tenth) are held out as the
    # validation set (0: evaluate on the training pairs, as runs before version 2 did).
    eval_pairs: int | None = None
    holdout: int = 0
    # Text runs: how text becomes ids (tokenizers.KINDS; "word" is the whitespace vocabulary
    # every run before these fields had), the subword vocabulary size asked for (--vocab-size;
    # None: all words/characters, and required for bpe/unigram), and one vocabulary for both
    # sides. Runs written before these fields load with the defaults: word, separate.
    tokenizer: str = "word"
    tokenizer_vocab_size: int | None = None
    shared_vocab: bool = False
    # Text runs: the absolute path of the run whose tokenizers this one took (--tokenizer-from,
    # tokenizer_from.py; the three fields above are then that run's), or None: trained on the
    # training file, as every run before this field.
    tokenizer_from: str | None = None
    # Held-out lines whose decoded text is scored (BLEU, chrF, WER, CER) at each evaluation
    # during training; `evaluate` scores them all.
    eval_decode_lines: int = 256
    # Text runs: the (source, target) columns of the files, 1-based (--columns S,T); None:
    # exactly two, source first (every run before this field).
    columns: tuple[int, int] | None = None
    # Text runs: batch lengths round up to a multiple of this (--length-multiple; TextPairs).
    # Runs written before the field load with the value every run had then.
    length_multiple: int = LENGTH_MULTIPLE

    def __post_init__(self):
        # config.json holds a list: the same tuple, so a loaded config equals the one saved.
        object.__setattr__(self, "columns", check_columns(self.columns))
        if not isinstance(self.length_multiple, int) or self.length_multiple < 1:
            raise RunConfigError(f"data.length_multiple must be an integer >= 1, got {self.length_multiple!r}")

    @property
    def model_max_len(self):
        return self.max_len + 1

    def to_dict(self):
        """config.json's "data": the other kind's settings left out where they hold their
        defaults (what a CLI run always has), so a text run does not show the synthetic task's
        vocab_size 16 beside the vocabulary it trained. The constructor fills them back in."""
        unused = _DATA_UNUSED_BY.get(self.kind, ())
        return {k: v for k, v in dataclasses.asdict(self).items()
                if not (k in unused and v == DataConfig.__dataclass_fields__[k].default)}


# Each kind of data's settings that the other kind ignores.
_DATA_UNUSED_BY = {
    "tsv": ("task", "vocab_size", "min_len", "eval_sequences"),
    "synthetic": ("train_path", "valid_path", "eval_pairs", "holdout", "tokenizer", "tokenizer_vocab_size",
                  "shared_vocab", "tokenizer_from", "columns", "length_multiple"),
}


@dataclasses.dataclass(frozen=True)
class InitFrom:
    """The weights a run started from (``train --init-from FILE``, init_from.py): the file's
    absolute path and sha256 (of an orbax directory: of its files, init_from.digest). A
    resume checks both; the checkpoints, not the file, hold the run's parameters from then on."""

    path: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """How the evaluation during training decodes, and which of its metrics picks the best
    checkpoint (``OUT/best``). Recorded in the run: the values it compares must mean the same
    from one evaluation to the next. Runs written before these fields load with greedy
    decoding and no best checkpoint (as they were trained)."""

    beam_size: int = 1  # --eval-beam-size: 1 decodes greedily
    length_penalty: float = DEFAULT_LENGTH_PENALTY  # --eval-length-penalty, with a beam
    best_metric: str | None = None  # --best-metric: runs/selection.py's BEST_METRICS

    def __post_init__(self):
        if not isinstance(self.beam_size, int) or self.beam_size < 1:
            raise RunConfigError(f"evaluation.beam_size must be an integer >= 1, got {self.beam_size!r}")
        if not (isinstance(self.length_penalty, (int, float)) and math.isfinite(self.length_penalty)
                and self.length_penalty >= 0):
            raise RunConfigError(f"evaluation.length_penalty must be a finite number >= 0, got {self.length_penalty!r}")
        if self.best_metric is not None and self.best_metric not in BEST_METRICS:
            raise RunConfigError(f"evaluation.best_metric {self.best_metric!r} is none of {', '.join(BEST_METRICS)}")


@dataclasses.dataclass(frozen=True)
class Averaged:
    """A run directory written by ``flaxformer-mini average``: the run whose checkpoints it
    averages (its absolute path) and their steps. ``train`` refuses to continue it."""

    run: str
    steps: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "steps", tuple(int(s) for s in self.steps))  # config.json holds a list


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    train: TrainConfig
    data: DataConfig
    batch_size: int = 64
    dtype: str = "float32"
    # Token-budget batches (--max-tokens; None: batch_size sentences a step) and gradient
    # accumulation over `accumulate` micro-batches per optimizer update.
    max_tokens: int | None = None
    accumulate: int = 1
    # How the model is laid out and differentiated (flaxformer_mini/model/scanned.py): each side's
    # blocks as one stacked block run by nnx.scan (checkpoints then hold stacked parameters),
    # and activations recomputed in the backward pass. Runs written before these fields load
    # with False, False: the layout of their checkpoints.
    scan_layers: bool = False
    remat: bool = False
    # Where step 0's parameters came from (None: a random init, every run before this field).
    init_from: InitFrom | None = None
    evaluation: EvalConfig = EvalConfig()
    # An `average` run's source (None: a trained run, every run before this field).
    averaged: Averaged | None = None

    def __post_init__(self):
        for name in ("scan_layers", "remat"):
            if not isinstance(getattr(self, name), bool):
                raise RunConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.dtype not in DTYPES:
            raise RunConfigError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.batch_size < 1:
            raise RunConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.accumulate < 1:
            raise RunConfigError(f"accumulate must be >= 1, got {self.accumulate}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise RunConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.evaluation.beam_size > 1:  # here, where max_len is known: refused before training, not at its first evaluation
            try:
                check_options(self.model, beam_size=self.evaluation.beam_size, alpha=self.evaluation.length_penalty)
            except OptionError as e:
                raise RunConfigError(f"evaluation.length_penalty (--eval-length-penalty): {e}") from None

    @property
    def compute_dtype(self):
        return COMPUTE_DTYPES[self.dtype]

    def build_model(self, rngs):
        """The run's Flax model: its ModelConfig, compute dtype and layer layout."""
        return Transformer.from_config(self.model, dtype=self.compute_dtype, scan_layers=self.scan_layers,
                                       remat=self.remat, rngs=rngs)

    def abstract_model(self):
        """``build_model``'s model with shapes in place of arrays (``Transformer.abstract``)."""
        return Transformer.abstract(self.model, dtype=self.compute_dtype, scan_layers=self.scan_layers,
                                    remat=self.remat)

    def to_dict(self):
        d = {"format": FORMAT, "version": VERSION, **dataclasses.asdict(self), "model": self.model.to_dict(),
             "train": _train_dict(self), "data": self.data.to_dict()}
        for key in ("init_from", "averaged"):  # None: no key, as a config.json written without the field
            if d[key] is None:
                del d[key]
        return d

    @classmethod
    def from_dict(cls, d, source="config"):
        if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") not in (1, VERSION):
            got = (d.get("format"), d.get("version")) if isinstance(d, dict) else (None, None)
            raise RunConfigError(f"{source}: not a flaxformer-mini run config (format {got[0]!r}, version {got[1]!r})")
        try:
            data = dict(d["data"])
            if d["version"] == 1 and data.get("kind") == "tsv":
                # Version 1 stored a text run's max_len as the model's (tokens + EOS).
                data["max_len"] -= 1
            return cls(
                model=ModelConfig(**d["model"]),
                train=TrainConfig(**{k: v for k, v in d["train"].items() if k not in _DERIVED_TRAIN_KEYS}),
                data=DataConfig(**data),
                batch_size=d["batch_size"],
                dtype=d["dtype"],
                max_tokens=d.get("max_tokens"),
                accumulate=d.get("accumulate", 1),
                scan_layers=d.get("scan_layers", False),
                remat=d.get("remat", False),
                init_from=InitFrom(**d["init_from"]) if d.get("init_from") is not None else None,
                evaluation=EvalConfig(**d.get("evaluation", {})),
                averaged=Averaged(**d["averaged"]) if d.get("averaged") is not None else None,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise RunConfigError(f"{source}: malformed run config: {e}") from None


# The settings each schedule ignores: config.json leaves them out where they
# hold their defaults (what a CLI run always has), so an rsqrt run does not show a
# learning_rate it never used. from_dict fills them back in with the same defaults.
_UNUSED_BY = {"rsqrt": ("learning_rate", "decay_steps"), "constant": ("lr_factor", "warmup_steps", "decay_steps"),
              "cosine": ("lr_factor",)}
# Written for the reader, recomputed from the others, ignored on load.
_DERIVED_TRAIN_KEYS = ("peak_learning_rate",)


def _train_dict(config: RunConfig):
    train = config.train
    d = {k: v for k, v in dataclasses.asdict(train).items()
         if not (k in _UNUSED_BY[train.schedule] and v == TrainConfig.__dataclass_fields__[k].default)}
    if train.schedule == "rsqrt":  # the --lr the run was made from: lr_factor alone does not say it
        d["peak_learning_rate"] = float(f"{peak_lr(train, config.model.embed_size):.12g}")  # 3e-3, not 0.0030000000000000005
    return d


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """What a user asks ``flaxformer-mini train`` for: the CLI's options, parsed."""

    preset: str = "small"
    # Overrides of the preset's size (None: the preset's).
    embed_size: int | None = None
    heads: int | None = None
    num_layers: int | None = None
    ffn_dim: int | None = None
    batch_size: int = 64
    lr: float = 3e-3  # the peak learning rate
    schedule: str = "rsqrt"
    warmup: int = 200
    steps: int | None = None  # --steps: where schedule "cosine" reaches 0 (the other schedules ignore it)
    weight_decay: float = 0.0
    clip_norm: float | None = 1.0
    label_smoothing: float = 0.0
    dropout: float | None = None  # None: the preset's
    dtype: str = "float32"
    seed: int = 0
    max_tokens: int | None = None
    accumulate: int = 1
    scan_layers: bool = False
    remat: bool = False
    init_from: str | None = None  # --init-from FILE: step 0's parameters (init_from.py)
    tie_embeddings: str | None = None  # --tie-embeddings: ModelConfig.tie_embeddings (None: untied)
    ema: float | None = None  # --ema DECAY: the parameters' moving average (train/ema.py)
    eval_beam_size: int = 1
    eval_length_penalty: float = DEFAULT_LENGTH_PENALTY
    best_metric: str | None = None


def model_config_for(preset, source_vocab_size, target_vocab_size, max_len, dropout=None, **sizes):
    """The preset's width, heads, depth and feed-forward width (each overridden by ``sizes``
    where not None; ``tie_embeddings`` too) with the data's vocabularies and lengths."""
    base = get_preset(preset)
    return base.replace(
        src_pad_idx=0, source_vocab_size=source_vocab_size, target_vocab_size=target_vocab_size,
        max_len=max_len, dropout=base.dropout if dropout is None else dropout,
        **{k: v for k, v in sizes.items() if v is not None},
    )


def train_config_for(options: TrainOptions, d_model):
    """The optimizer settings, with ``options.lr`` as the schedule's peak.

    The paper's lr = factor * D^-0.5 * min(n^-0.5, n * w^-1.5) peaks at n = w, at
    factor * (D * w)^-0.5; so a peak ``lr`` needs factor = lr * sqrt(D * w).
    """
    common = dict(weight_decay=options.weight_decay, clip_norm=options.clip_norm,
                  label_smoothing=options.label_smoothing, seed=options.seed, ema_decay=options.ema)
    if options.schedule == "rsqrt":
        return TrainConfig(schedule="rsqrt", lr_factor=options.lr * math.sqrt(d_model * options.warmup),
                           warmup_steps=options.warmup, **common)
    if options.schedule == "cosine":
        return TrainConfig(schedule="cosine", learning_rate=options.lr, warmup_steps=options.warmup,
                           decay_steps=options.steps, **common)
    return TrainConfig(schedule=options.schedule, learning_rate=options.lr, **common)


def peak_lr(train: TrainConfig, d_model):
    """The --lr an rsqrt ``train`` config was made from (``train_config_for``'s inverse)."""
    return train.lr_factor / math.sqrt(d_model * train.warmup_steps)


def check_tie(tie_embeddings, data: DataConfig):
    """Refuse (RunConfigError naming the options) ``--tie-embeddings all`` without one
    vocabulary for both sides: a text run's needs --shared-vocab (its own, or that of the run
    --tokenizer-from names), where one tokenizer numbers both sides, so row i of the one table
    is one token on both; a synthetic task's sides share their integer tokens."""
    if tie_embeddings != "all" or data.kind != "tsv" or data.shared_vocab:
        return
    whose = (f"the run --tokenizer-from {data.tokenizer_from} names has one tokenizer a side" if data.tokenizer_from
             else "give --shared-vocab too")
    raise RunConfigError(f"--tie-embeddings all shares one embedding table between source and target, which needs "
                         f"one vocabulary for both sides (--shared-vocab): {whose}; --tie-embeddings decoder ties the "
                         f"target embedding and the output projection alone")


def resolve_config(options: TrainOptions, data: DataConfig, source_vocab_size, target_vocab_size):
    """The run's whole config from the user's options and the data's vocabulary sizes."""
    check_tie(options.tie_embeddings, data)
    model = model_config_for(options.preset, source_vocab_size, target_vocab_size, data.model_max_len,
                             dropout=options.dropout, embed_size=options.embed_size, heads=options.heads,
                             num_layers=options.num_layers, ffn_dim=options.ffn_dim,
                             tie_embeddings=options.tie_embeddings)
    return RunConfig(model=model, train=train_config_for(options, model.embed_size), data=data,
                     batch_size=options.batch_size, dtype=options.dtype, max_tokens=options.max_tokens,
                     accumulate=options.accumulate, scan_layers=options.scan_layers, remat=options.remat,
                     evaluation=EvalConfig(beam_size=options.eval_beam_size, length_penalty=options.eval_length_penalty,
                                           best_metric=options.best_metric))
