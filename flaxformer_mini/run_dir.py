"""A run directory's files, and nothing else: where each lives and how it is written.

    OUT/config.json          the RunConfig (checked on resume)
    OUT/vocab_source.json    for text runs: the vocabularies built from the training file
    OUT/vocab_target.json
    OUT/metrics.jsonl        one JSON object per logged step and per evaluation
    OUT/checkpoints/<step>/  rotating orbax checkpoints
    OUT/loss.png             the loss curves, drawn at the end of the run
"""

import json
from pathlib import Path

from flaxformer_mini.data import Vocab
from flaxformer_mini.files import write_atomic
from flaxformer_mini.run_config import RunConfig, RunConfigError


def _write_json(path, obj):
    write_atomic(path, json.dumps(obj, indent=2) + "\n")


class RunDir:
    def __init__(self, path):
        self.path = Path(path)
        self.config_path = self.path / "config.json"
        self.metrics_path = self.path / "metrics.jsonl"
        self.checkpoints = self.path / "checkpoints"
        self.plot_path = self.path / "loss.png"
        self.vocab_paths = (self.path / "vocab_source.json", self.path / "vocab_target.json")

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
        """Write ``config`` for a new run, or check that it matches the run already here.
        Returns True when resuming."""
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

    # --- vocabularies (text runs)

    def has_vocabularies(self):
        return all(p.exists() for p in self.vocab_paths)

    def load_vocabularies(self):
        return tuple(Vocab.load(p) for p in self.vocab_paths)

    def save_vocabularies(self, vocabs):
        for vocab, path in zip(vocabs, self.vocab_paths):
            vocab.save(path)

    # --- the metrics log

    def truncate_metrics(self, step):
        """Drop log lines past ``step`` (the restored checkpoint), so a resumed run's log has
        each step once."""
        if not self.metrics_path.exists():
            return
        kept = [line for line in self.metrics_path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        write_atomic(self.metrics_path, "".join(line + "\n" for line in kept))

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
