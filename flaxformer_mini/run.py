"""A training run's directory: its config, data, metrics log and loss plot.

    OUT/config.json          model, optimizer and data settings (checked on resume)
    OUT/vocab_source.json    for text runs: the vocabularies built from the training file
    OUT/vocab_target.json
    OUT/metrics.jsonl        one JSON object per logged step and per evaluation
    OUT/checkpoints/<step>/  rotating orbax checkpoints
    OUT/loss.png             the loss curves, drawn at the end of the run
"""

import dataclasses
import json
import os
from pathlib import Path

from flaxformer_mini.config import ModelConfig, get_preset
from flaxformer_mini.data import SyntheticTask, TextPairs, Vocab, read_tsv
from flaxformer_mini.training import TrainConfig

FORMAT, VERSION = "flaxformer-mini-run", 1
DTYPES = ("float32", "bfloat16")


class RunConfigError(ValueError):
    """An --out directory, a run config or an option that cannot be used."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
    kind: str  # "synthetic" or "tsv"
    task: str | None = None  # synthetic: copy, reverse, sort
    vocab_size: int = 16  # synthetic: ids, the 4 special tokens included
    min_len: int = 1
    max_len: int = 10  # synthetic: content length; tsv: the model's max_len (tokens + EOS)
    eval_sequences: int = 512
    train_path: str | None = None
    valid_path: str | None = None


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    train: TrainConfig
    data: DataConfig
    batch_size: int = 64
    dtype: str = "float32"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise RunConfigError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.batch_size < 1:
            raise RunConfigError(f"batch_size must be >= 1, got {self.batch_size}")

    def to_dict(self):
        return {"format": FORMAT, "version": VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d, source="config"):
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise RunConfigError(f"{source}: not a flaxformer-mini run config (format {d.get('format')!r}, version {d.get('version')!r})")
        try:
            return cls(
                model=ModelConfig(**d["model"]),
                train=TrainConfig(**d["train"]),
                data=DataConfig(**d["data"]),
                batch_size=d["batch_size"],
                dtype=d["dtype"],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise RunConfigError(f"{source}: malformed run config: {e}") from None


def model_config_for(preset, source_vocab_size, target_vocab_size, max_len, dropout=None):
    """The preset's width, heads and depth with the data's vocabularies and lengths."""
    base = get_preset(preset)
    return base.replace(
        src_pad_idx=0, source_vocab_size=source_vocab_size, target_vocab_size=target_vocab_size,
        max_len=max_len, dropout=base.dropout if dropout is None else dropout,
    )


def _write_atomic(path, text):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic: a kill mid-write never leaves half a file


def _write_json(path, obj):
    _write_atomic(path, json.dumps(obj, indent=2) + "\n")


class RunDir:
    def __init__(self, path):
        self.path = Path(path)
        self.config_path = self.path / "config.json"
        self.metrics_path = self.path / "metrics.jsonl"
        self.checkpoints = self.path / "checkpoints"
        self.plot_path = self.path / "loss.png"

    def exists(self):
        return self.config_path.is_file()

    def load_config(self) -> RunConfig:
        if not self.exists():
            raise RunConfigError(f"{self.path}: no run here (config.json is missing)")
        try:
            d = json.loads(self.config_path.read_text())
        except json.JSONDecodeError as e:
            raise RunConfigError(f"{self.config_path}: not valid JSON: {e}") from None
        return RunConfig.from_dict(d, source=str(self.config_path))

    def start_or_resume(self, config: RunConfig):
        """Write ``config`` for a new run, or check that it matches the run already here."""
        if self.exists():
            old = self.load_config()
            if old != config:
                diffs = _differences(old.to_dict(), config.to_dict())
                raise RunConfigError(
                    f"--out {self.path} holds another run whose config differs: {'; '.join(diffs)}. "
                    f"Use another --out, or the same options to resume it. Nothing was overwritten."
                )
            return True
        if self.path.exists() and any(self.path.iterdir()):
            raise RunConfigError(f"--out {self.path} exists and is not a flaxformer-mini run; choose an empty or new directory")
        self.path.mkdir(parents=True, exist_ok=True)
        _write_json(self.config_path, config.to_dict())
        return False

    def truncate_metrics(self, step):
        """Drop log lines past ``step`` (the restored checkpoint), so a resumed run's log has
        each step once."""
        if not self.metrics_path.exists():
            return
        kept = [line for line in self.metrics_path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        _write_atomic(self.metrics_path, "".join(line + "\n" for line in kept))

    def log(self, record):
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def read_metrics(self):
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]


def _differences(old, new, prefix=""):
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} in the run, {b!r} now")
    return out


def load_data(config: DataConfig, run: RunDir):
    """(train data, eval data, vocabularies) for a run.

    Synthetic: the task serves both, no vocabularies. TSV: TextPairs of the training and
    validation files. The vocabularies are the run's own when it has saved them (a resumed
    run keeps its ids even if the training file changed), else built from the training file;
    ``save_vocabularies`` writes them once the run's config is written.
    """
    if config.kind == "synthetic":
        task = SyntheticTask(config.task, config.vocab_size, config.min_len, config.max_len)
        return task, task, None
    pairs = read_tsv(config.train_path)
    src_path, tgt_path = run.path / "vocab_source.json", run.path / "vocab_target.json"
    if src_path.exists() and tgt_path.exists():
        vocabs = (Vocab.load(src_path), Vocab.load(tgt_path))
    else:
        vocabs = (Vocab.build([s for s, _ in pairs]), Vocab.build([t for _, t in pairs]))
    train = TextPairs(pairs, *vocabs, config.max_len)
    valid = TextPairs(read_tsv(config.valid_path), *vocabs, config.max_len) if config.valid_path else train
    return train, valid, vocabs


def save_vocabularies(run: RunDir, vocabs):
    if vocabs is not None and not (run.path / "vocab_source.json").exists():
        vocabs[0].save(run.path / "vocab_source.json")
        vocabs[1].save(run.path / "vocab_target.json")


def load_vocabularies(run: RunDir):
    return Vocab.load(run.path / "vocab_source.json"), Vocab.load(run.path / "vocab_target.json")
