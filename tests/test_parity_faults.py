"""``parity`` under faults: a write that fails midway, an OUT that exists, weights a check
cannot judge, files it may not read, and ``--debug``.

Properties checked:
- a conversion whose writer fails after writing some bytes (a simulated full disk) leaves no
  output and no temporary file, and an existing OUT (replaced with --force) unchanged; for
  .safetensors and .pt files and for orbax directories;
- an existing OUT is refused without --force (exit 2, naming the file and --force), replaced
  with it, and a directory parity did not write is never replaced;
- ``check --torch-checkpoint`` refuses int64 weights in the words of ``convert``, and NaN or
  Inf weights by key, before any comparison (no report table);
- weights that overflow float32 give a strict JSON report: null for a non-finite difference,
  its note saying why (NaN on a side, an infinity the other side does not have);
- a damaged orbax directory is one short line, and orbax's threads add no stray "Event loop is
  closed" tracebacks afterwards;
- a file it may not read is named with the reason; ``--debug`` (or PARITY_DEBUG) shows the
  traceback that is otherwise replaced by one line.
"""

import errno
import os

import numpy as np
import pytest
import torch

import flaxformer_mini.files
import torch_ref
from parity import ConversionError, check_checkpoint, infer_config, load_flax_params, load_state_dict
from parity.cli import DEBUG_ENV, main
from parity.file_kinds import CheckpointError

from helpers import DiskFullAfterHalf

SIZES = dict(src_pad_idx=0, source_vocab_size=11, target_vocab_size=13, max_len=7, embed_size=8, heads=2,
             num_layers=1, dropout=0.0)
NORM = "encoder.transformer_layers.0.norm1.weight"


@pytest.fixture(scope="module")
def state_dict():
    torch.manual_seed(3)
    return torch_ref.Transformer(**SIZES).state_dict()


@pytest.fixture
def checkpoint(state_dict, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(state_dict, path)
    return path


def run(capsys, *args):
    code = main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def listing(directory):
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*"))


def snapshot(directory):
    return {p: p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- a write that fails midway


def _flax_safetensors(tmp_path, checkpoint, capsys):
    path = tmp_path / "flax.safetensors"
    assert run(capsys, "convert", checkpoint, path, "--heads", "2")[0] == 0
    return path


@pytest.mark.parametrize("direction", ["torch->flax.safetensors", "flax->torch.pt", "flax->torch.safetensors"])
@pytest.mark.parametrize("existing", [False, True], ids=["new OUT", "existing OUT with --force"])
def test_a_write_failing_midway_leaves_no_output_no_temp_file_and_an_existing_output_unchanged(
        direction, existing, checkpoint, tmp_path, capsys, monkeypatch):
    source = checkpoint if direction.startswith("torch") else _flax_safetensors(tmp_path, checkpoint, capsys)
    out = tmp_path / ("out" + direction[direction.index("."):])
    if existing:
        out.write_bytes(b"the user's previous file")
    before = snapshot(tmp_path)

    # From here on every file write_atomic opens fails half-way (os.fdopen is its way in).
    sizes, real_fdopen = [], os.fdopen
    monkeypatch.setattr(flaxformer_mini.files.os, "fdopen", lambda fd, *a, **k: DiskFullAfterHalf(real_fdopen(fd, *a, **k), sizes))
    options = ["--heads", "2"] if direction.startswith("torch") else []
    code, _, err = run(capsys, "convert", source, out, *options, *(["--force"] if existing else []))

    assert sizes and sizes[0] > 0, "the writer never wrote anything: the fault was not midway"
    assert code == 2 and "Traceback" not in err
    assert f"no space left on the device writing {out}; nothing was written" in err
    assert snapshot(tmp_path) == before, "a file was changed, or a partial or temporary file was left"


def test_a_report_whose_write_fails_midway_is_not_left_half_written(checkpoint, tmp_path, capsys, monkeypatch):
    sizes, real_fdopen = [], os.fdopen
    monkeypatch.setattr(flaxformer_mini.files.os, "fdopen", lambda fd, *a, **k: DiskFullAfterHalf(real_fdopen(fd, *a, **k), sizes))
    before = snapshot(tmp_path)
    code, out, err = run(capsys, "check", "--torch-checkpoint", checkpoint, "--heads", "2", "--json", tmp_path / "r.json")
    assert sizes and sizes[0] > 0
    assert code == 2 and "no space left on the device; nothing was written" in err and "Traceback" not in err
    assert "intermediates within" in out  # the comparison itself ran and was printed
    assert snapshot(tmp_path) == before and listing(tmp_path) == ["model.pt"]


def test_an_orbax_write_failing_midway_leaves_no_directory_and_an_existing_one_unchanged(checkpoint, tmp_path, capsys,
                                                                                         monkeypatch):
    import orbax.checkpoint as ocp

    out = tmp_path / "flax_orbax"
    assert run(capsys, "convert", checkpoint, out, "--heads", "2")[0] == 0
    before_files, before_bytes = listing(tmp_path), snapshot(tmp_path)

    def save_half_then_fail(self, directory, *args, **kwargs):
        (directory / "params").mkdir(parents=True)
        (directory / "params" / "chunk").write_bytes(b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ocp.Checkpointer, "save", save_half_then_fail)
    code, _, err = run(capsys, "convert", checkpoint, out, "--heads", "2", "--force")
    assert code == 2 and "no space left on the device" in err and "Traceback" not in err
    assert listing(tmp_path) == before_files and snapshot(tmp_path) == before_bytes

    fresh = tmp_path / "fresh_orbax"
    assert run(capsys, "convert", checkpoint, fresh, "--heads", "2")[0] == 2
    assert listing(tmp_path) == before_files, "the staging directory or a partial OUT was left"


# ----------------------------------------------------------------------------- an existing OUT


@pytest.mark.parametrize("name", ["flax.safetensors", "flax_orbax"])
def test_an_existing_output_is_refused_without_force_naming_it_and_force(name, checkpoint, tmp_path, capsys):
    out = tmp_path / name
    if name.endswith(".safetensors"):
        out.write_bytes(b"precious")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("precious")
    before = snapshot(tmp_path)
    code, _, err = run(capsys, "convert", checkpoint, out, "--heads", "2")
    assert code == 2 and "Traceback" not in err
    assert f"OUT {out}: already exists" in err and "--force" in err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["flax.safetensors", "flax_orbax"])
def test_force_replaces_an_earlier_conversion_with_the_new_one(name, state_dict, checkpoint, tmp_path, capsys):
    out = tmp_path / name
    assert run(capsys, "convert", checkpoint, out, "--heads", "2")[0] == 0
    doubled = {k: v * 2 for k, v in state_dict.items()}
    torch.save(doubled, tmp_path / "doubled.pt")
    assert run(capsys, "convert", tmp_path / "doubled.pt", out, "--heads", "2", "--pad-idx", "3", "--force")[0] == 0

    params, config = load_flax_params(out)
    assert config.src_pad_idx == 3
    np.testing.assert_array_equal(params["encoder/embedding_layer/embedding"],
                                  doubled["encoder.embedding_layer.weight"].numpy())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "a staging directory was left"


def test_force_never_replaces_a_directory_parity_did_not_write(checkpoint, tmp_path, capsys):
    out = tmp_path / "my_project"
    out.mkdir()
    (out / "params").mkdir()
    (out / "train.py").write_text("print('mine')")
    before = snapshot(tmp_path)
    code, _, err = run(capsys, "convert", checkpoint, out, "--heads", "2", "--force")
    assert code == 2 and "is not a directory of Flax parameters written by `parity convert`" in err
    assert snapshot(tmp_path) == before and listing(out) == ["params", "train.py"]


# ----------------------------------------------------------------------------- a damaged orbax directory


_LOAD_DAMAGED_REPEATEDLY = """
import sys
from parity import load_flax_params
from parity.file_kinds import CheckpointError
for _ in range(5):
    try:
        load_flax_params(sys.argv[1])
    except CheckpointError as e:
        print(e)
"""


def test_a_damaged_orbax_directory_is_one_short_line_without_stray_tracebacks(checkpoint, tmp_path, capsys):
    # orbax's threads go on calling into a closed event loop after a failed read, each call a
    # "RuntimeError: Event loop is closed" traceback on stderr (every time, over 5 reads, without
    # flaxformer-mini's silencer, which parity uses); the one-line error must be all there is.
    import subprocess
    import sys

    damaged = tmp_path / "flax_orbax"
    assert run(capsys, "convert", checkpoint, damaged, "--heads", "2")[0] == 0
    for data in (damaged / "params" / "d").iterdir():
        os.truncate(data, 50)
    proc = subprocess.run([sys.executable, "-c", _LOAD_DAMAGED_REPEATEDLY, str(damaged)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 5
    assert all(line.startswith(f"{damaged}: cannot read its 'params' item (truncated or corrupt?): ") for line in lines)
    assert all(len(line) < 300 + 200 for line in lines)  # TensorStore's several-kB spec is cut


# ----------------------------------------------------------------------------- weights a check cannot judge


def test_check_refuses_int64_weights_in_the_words_of_convert(state_dict, tmp_path, capsys):
    path = tmp_path / "ints.pt"
    torch.save({k: v.to(torch.int64) for k, v in state_dict.items()}, path)
    check_code, check_out, check_err = run(capsys, "check", "--torch-checkpoint", path, "--heads", "2")
    convert_code, _, convert_err = run(capsys, "convert", path, tmp_path / "flax.safetensors", "--heads", "2")
    assert check_code == convert_code == 2
    for key in state_dict:  # every key named, as convert names them
        assert f"invalid value for {key!r}: dtype int64 is not a floating-point dtype" in check_err
    assert check_err.removeprefix("parity check: ") == convert_err.removeprefix("parity convert: ")
    assert "intermediate" not in check_out, "a comparison ran"


@pytest.mark.parametrize("bad, dtype", [(float("nan"), torch.float32), (float("inf"), torch.float32),
                                        (float("-inf"), torch.float64), (float("nan"), torch.bfloat16)])
def test_check_refuses_non_finite_weights_by_key_before_any_comparison(bad, dtype, state_dict, tmp_path, capsys):
    weights = {k: v.to(dtype) for k, v in state_dict.items()}
    keys = [NORM, "decoder.fc.bias"]
    for key in keys:
        weights[key] = weights[key].clone()
        weights[key][1] = bad
    path = tmp_path / "model.safetensors"
    from parity import save_state_dict

    save_state_dict(weights, path)
    code, out, err = run(capsys, "check", "--torch-checkpoint", path, "--heads", "2")
    name = "NaN" if np.isnan(bad) else "Inf"
    in_file_order = [key for key in load_state_dict(path) if key in keys]  # .safetensors sorts its keys
    assert code == 2 and "Traceback" not in err
    assert f"weights contain {name}: keys {', '.join(map(repr, in_file_order))} (2 of {len(weights)} tensors)" in err
    assert "first divergence" not in out and "intermediate" not in out, "a comparison ran"


def test_check_checkpoint_raises_naming_each_non_finite_key(state_dict):
    weights = dict(state_dict, **{NORM: torch.full_like(state_dict[NORM], float("nan"))})
    with pytest.raises(ConversionError, match=rf"weights contain NaN: key '{NORM}' \(1 of {len(state_dict)} tensors\)") as e:
        check_checkpoint(weights, infer_config(weights, heads=2), batch=2)
    assert e.value.invalid == {NORM: "contains NaN"}


def test_check_of_overflowing_weights_writes_strict_json_saying_why_each_number_is_missing(state_dict, tmp_path,
                                                                                            capsys):
    # Finite weights (refuse_unusable_weights lets them through) whose sum overflows float32 the
    # same way on every machine: the decoder's token and position embeddings are +-3e38 by feature,
    # so their sum is +-inf elementwise, and every matmul after it meets inf * w of both signs: NaN
    # in any summation order. (Weights of 3e38 in a matmul overflow on one CPU and stay finite
    # on another, AMD EPYC family 25 model 1, through FMA accumulation and cancellation: no number
    # would be missing there and the test would check nothing.)
    import json

    signs = torch.where(torch.arange(SIZES["embed_size"]) % 2 == 0, 1.0, -1.0)  # (D,)
    huge = ("decoder.embedding_layer.weight", "decoder.positional_embedding.weight")
    weights = dict(state_dict, **{key: (3e38 * signs).expand_as(state_dict[key]).clone() for key in huge})
    path, report = tmp_path / "big.pt", tmp_path / "report.json"
    torch.save(weights, path)
    code, out, err = run(capsys, "check", "--torch-checkpoint", path, "--heads", "2", "--json", report)
    assert code == 1 and "Traceback" not in err

    def strict(constant):
        raise ValueError(f"not strict JSON: {constant}")

    rows = {row["name"]: row for row in json.loads(report.read_text(), parse_constant=strict)["rows"]}
    for name in ("decoder.embedding_layer", "decoder.positional_embedding", "decoder.dropout"):
        assert rows[name]["max_abs"] == 0.0 and rows[name]["ok"], rows[name]  # 3e38s, then their equal infinities
    logits = 4 * 6 * SIZES["target_vocab_size"]  # (B, T, V) of the check's batch
    for name in ("decoder.fc", ""):  # the output layer and the logits: NaN everywhere on both sides
        assert rows[name]["note"] == f"torch has {logits} NaN; Flax has {logits} NaN", rows[name]
    missing = [row for row in rows.values() if row["max_abs"] is None]
    assert len(missing) >= 3
    for row in missing:
        assert row["max_rel"] is None and not row["ok"] and "NaN" in row["note"], row
        assert row["note"] in out  # the table says it too


# ----------------------------------------------------------------------------- files it may not read, --debug


def test_a_checkpoint_it_may_not_read_is_named_with_the_reason(checkpoint, capsys, monkeypatch):
    # Simulated: these tests may run as root, who may read any file. The first open of the
    # checkpoint (parity.file_kinds.readable_file) fails as it would without read permission.
    def no_permission(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr("parity.file_kinds.open", no_permission, raising=False)
    for args in (["check", "--torch-checkpoint", checkpoint, "--heads", "2"],
                 ["convert", checkpoint, checkpoint.with_name("flax.safetensors"), "--heads", "2"]):
        code, _, err = run(capsys, *args)
        assert code == 2 and "Traceback" not in err
        assert f"{checkpoint}: Permission denied (check its permissions)" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root may read any file")
def test_a_checkpoint_without_read_permission_is_named(checkpoint, capsys):
    checkpoint.chmod(0)
    code, _, err = run(capsys, "check", "--torch-checkpoint", checkpoint, "--heads", "2")
    assert code == 2 and f"{checkpoint}: Permission denied" in err


def test_debug_shows_the_traceback_one_line_replaces(tmp_path, capsys, monkeypatch):
    missing = tmp_path / "missing.pt"
    code, _, err = run(capsys, "check", "--torch-checkpoint", missing)
    assert code == 2 and err.strip() == f"parity check: error: {missing}: no such file"
    with pytest.raises(CheckpointError, match="no such file"):
        main(["check", "--torch-checkpoint", str(missing), "--debug"])
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(CheckpointError, match="no such file"):
        main(["convert", str(missing), str(tmp_path / "out.safetensors")])


def test_a_bug_keeps_its_traceback_without_debug(checkpoint, tmp_path, monkeypatch):
    def bug(*args, **kwargs):
        raise KeyError("a bug, not a user's mistake")

    monkeypatch.setattr("parity.checkpoint_io.load_state_dict", bug)
    with pytest.raises(KeyError, match="a bug"):
        main(["convert", str(checkpoint), str(tmp_path / "flax.safetensors"), "--heads", "2"])


@pytest.fixture
def small_disk(tmp_path):
    """A 12 KiB tmpfs (3 pages). Mounting needs root (as here and in CI); elsewhere the test
    skips, and the simulated tests above cover the same path."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(disk)], capture_output=True, text=True)
    if mount.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mount.stderr.strip()})")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_real_full_disk_leaves_the_previous_output_and_no_temporary_file(checkpoint, small_disk, capsys):
    # The disk holds the user's 4 KiB file and 8 KiB more, not the ~12 KB conversion.
    out = small_disk / "flax.safetensors"
    out.write_bytes(b"p" * 4096)
    code, _, err = run(capsys, "convert", checkpoint, out, "--heads", "2", "--force")
    assert code == 2 and "Traceback" not in err
    assert f"no space left on the device writing {out}; nothing was written ({out} is as it was)" in err
    assert listing(small_disk) == ["flax.safetensors"] and out.read_bytes() == b"p" * 4096
    # Control: the same conversion fits once the disk is free, so it was the space that failed.
    out.unlink()
    assert run(capsys, "convert", checkpoint, out, "--heads", "2")[0] == 0
    assert out.stat().st_size > 8192
