"""TensorBoard events: what the writer writes reads back, and torch stays out."""

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from flaxformer_mini.runs import tensorboard

REPO = Path(__file__).resolve().parents[1]


def test_scalars_written_read_back_with_their_steps(tmp_path):
    with tensorboard.open_writer(tmp_path / "tb") as writer:
        writer.scalars(0, {"train/loss": 2.5, "train/learning_rate": 1e-3})
        writer.scalars(10, {"train/loss": np.float32(1.25), "eval/bleu": 31.7, "train/tokens_per_s": 12345})
        writer.scalars(20, {"train/loss": float("nan")})
    got = tensorboard.read_scalars(tmp_path / "tb")
    assert sorted(got) == ["eval/bleu", "train/learning_rate", "train/loss", "train/tokens_per_s"]
    # Event files store float32: compare with the float32 rounding of what was written.
    steps, values = zip(*got["train/loss"])
    assert steps == (0, 10, 20)
    assert values[:2] == (np.float32(2.5), np.float32(1.25)) and math.isnan(values[2])
    assert got["train/learning_rate"] == [(0, np.float32(1e-3))]
    assert got["eval/bleu"] == [(10, np.float32(31.7))]
    assert got["train/tokens_per_s"] == [(10, 12345.0)]


def test_non_number_scalar_is_an_error_naming_the_tag(tmp_path):
    with tensorboard.open_writer(tmp_path) as writer:
        with pytest.raises(TypeError, match="'eval/note' must be a number"):
            writer.scalars(1, {"eval/note": "good"})


def test_writing_events_does_not_import_torch(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys
        from flaxformer_mini.runs import tensorboard
        assert "tensorboardX" not in sys.modules  # imported lazily, only to write
        with tensorboard.open_writer({str(tmp_path)!r}) as w:
            w.scalars(1, {{"loss": 1.0}})
        assert "tensorboardX" in sys.modules
        assert not [m for m in sys.modules if m.partition(".")[0] == "torch"], "torch imported"
        assert "torch" not in sys.modules  # the None placeholder is gone: torch imports normally later
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
