"""`parity check` and `parity convert` and the paths they are given: Ctrl-C.

Properties checked:
- Ctrl-C exits 130 with one line, no traceback, and leaves neither an output nor a temporary
  file or directory (a .safetensors file, an orbax directory, a --json report).

Checkpoints are torch_ref's, of a 1-layer tiny model; every call is ``parity.cli.main``
in-process, and none runs a model.
"""

import pytest
import torch

import torch_ref
from parity.cli import main

CONFIG = dict(src_pad_idx=0, source_vocab_size=11, target_vocab_size=11, max_len=6, embed_size=30, heads=5,
              num_layers=1, dropout=0.1)


@pytest.fixture(scope="module")
def state_dict():
    torch.manual_seed(3)
    return torch_ref.Transformer(**CONFIG).state_dict()


@pytest.fixture
def pt(state_dict, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(state_dict, path)
    return path


def listing(directory):
    return sorted(p.name for p in directory.iterdir())


def refused(capsys, message):
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- Ctrl-C


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("out", ["model.safetensors", "model_orbax"])
def test_ctrl_c_during_convert_exits_130_in_one_line_leaving_no_output_nor_temporary(pt, tmp_path, out, monkeypatch,
                                                                                     capsys):
    # Pressed while the bytes are written: after the temporary file (or staging directory) exists.
    if out.endswith(".safetensors"):
        monkeypatch.setattr("flaxformer_mini.files.os.fsync", _interrupt)
    else:
        monkeypatch.setattr("parity.flax_io._nest", _interrupt)
    assert main(["convert", str(pt), str(tmp_path / out), "--heads", "5"]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["parity convert: stopped by Ctrl-C; no output was left half-written"], err
    assert listing(tmp_path) == ["model.pt"]


def test_ctrl_c_during_check_exits_130_in_one_line_writing_no_report(pt, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("parity.check.check_twins", _interrupt)
    report = tmp_path / "report.json"
    assert main(["check", "--torch-checkpoint", str(pt), "--heads", "5", "--json", str(report)]) == 130
    assert "parity check: stopped by Ctrl-C" in refused(capsys, "no output was left half-written")
    assert listing(tmp_path) == ["model.pt"]
