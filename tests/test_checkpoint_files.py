"""Checkpoint files: ``parity.save_state_dict`` / ``parity.load_state_dict``.

Properties checked:
- ``.safetensors`` and ``.pt``/``.pth`` round trips give the same tensors bit for bit;
- a wrapped checkpoint ({'epoch': 3, 'model_state_dict': sd}) loads as its state dict;
- a ``.pt`` whose pickle would run code is refused before the code runs (weights_only=True);
- truncated, corrupt, unknown-suffix and missing files raise CheckpointError naming the file;
- a file holding non-tensors is refused, naming the entries.
"""

import pathlib
import pickle

import numpy as np
import pytest
import torch

import torch_ref
from parity import CheckpointError, flax_to_torch, load_state_dict, save_state_dict, torch_to_flax
from parity.checkpoint_io import read_recorded_config

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64, torch.int64: torch.int64}


def assert_same_tensors(got, want):
    assert isinstance(got, dict)
    assert set(got) == set(want), f"keys differ: {set(got) ^ set(want)}"
    for key, b in want.items():
        a = got[key]
        assert isinstance(a, torch.Tensor), key
        assert a.dtype == b.dtype and a.shape == b.shape, f"{key}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        bits = _BITS[b.dtype]
        assert torch.equal(a.contiguous().view(bits), b.contiguous().view(bits)), f"{key}: bits differ"


@pytest.fixture
def state_dict(tiny_config):
    torch.manual_seed(11)
    sd = dict(torch_ref.Transformer(**tiny_config.to_dict()).state_dict())
    # Beyond float32 weights: bfloat16, float64, a negative zero, and a non-contiguous view.
    sd["extra.bf16"] = torch.randn(5, 7).to(torch.bfloat16)
    sd["extra.f64"] = torch.tensor([-0.0, 1e-300, 3.5], dtype=torch.float64)
    sd["extra.transposed"] = torch.randn(7, 3).T
    return sd


@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".pth"])
def test_file_round_trip_is_bit_exact(state_dict, tmp_path, suffix):
    path = tmp_path / f"model{suffix}"
    assert save_state_dict(state_dict, path) == path
    assert_same_tensors(load_state_dict(path), state_dict)
    # Written atomically: the temporary file is gone, only the checkpoint remains.
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_a_save_failing_midway_keeps_the_previous_file_and_leaves_no_temporary_file(state_dict, tmp_path, suffix,
                                                                                   monkeypatch):
    import errno
    import os

    import flaxformer_mini.files
    from helpers import DiskFullAfterHalf

    path = tmp_path / f"model{suffix}"
    previous = {"w": torch.arange(6.0)}
    save_state_dict(previous, path)
    sizes, real_fdopen = [], os.fdopen
    monkeypatch.setattr(flaxformer_mini.files.os, "fdopen", lambda fd, *a, **k: DiskFullAfterHalf(real_fdopen(fd, *a, **k), sizes))
    with pytest.raises(OSError) as info:
        save_state_dict(state_dict, path)
    assert info.value.errno == errno.ENOSPC and sizes and sizes[0] > 0
    monkeypatch.undo()
    assert_same_tensors(load_state_dict(path), previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_save_with_unknown_suffix_is_refused_and_writes_nothing(state_dict, tmp_path):
    path = tmp_path / "model.npz"
    with pytest.raises(CheckpointError, match="unknown checkpoint type '.npz'") as info:
        save_state_dict(state_dict, path)
    assert str(path) in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_a_config_given_as_a_dict_of_its_fields_is_recorded_as_the_modelconfig(state_dict, tiny_config, tmp_path):
    # torch_ref.Transformer's keyword arguments, what read_recorded_config gives back.
    path = save_state_dict(state_dict, tmp_path / "w.safetensors", config=tiny_config.to_dict())
    assert read_recorded_config(path) == (tiny_config.to_dict(), ())


@pytest.mark.parametrize("config, message", [
    (dict(bogus=1), r"config: ModelConfig.__init__\(\) got an unexpected keyword argument 'bogus'"),
    ([("max_len", 8)], "config: expected a ModelConfig or a dict of its fields, got list"),
])
def test_a_config_that_is_no_modelconfig_is_refused_and_writes_nothing(state_dict, tmp_path, config, message):
    with pytest.raises(TypeError, match=message):
        save_state_dict(state_dict, tmp_path / "w.safetensors", config=config)
    assert list(tmp_path.iterdir()) == []


def test_flax_weights_survive_a_safetensors_file(tiny_config, tmp_path):
    import flaxformer_mini as fm
    from flax import nnx

    source = fm.Transformer.from_config(tiny_config, rngs=nnx.Rngs(1))
    path = save_state_dict(flax_to_torch(source), tmp_path / "flax.safetensors")
    fresh = fm.Transformer.from_config(tiny_config, rngs=nnx.Rngs(2))
    torch_to_flax(load_state_dict(path), fresh)
    want, got = nnx.state(source, nnx.Param), nnx.state(fresh, nnx.Param)
    for (path_a, a), (path_b, b) in zip(nnx.to_flat_state(want), nnx.to_flat_state(got), strict=True):
        assert path_a == path_b
        assert np.array_equal(np.asarray(a.get_value()).view(np.uint32), np.asarray(b.get_value()).view(np.uint32)), path_a


@pytest.mark.parametrize("wrapper_key", ["model_state_dict", "state_dict", "model"])
def test_wrapped_checkpoint_loads_as_its_state_dict(state_dict, tmp_path, wrapper_key):
    path = tmp_path / "wrapped.pt"
    torch.save({"epoch": 3, wrapper_key: state_dict, "optimizer": {"lr": 1e-3}}, path)
    assert_same_tensors(load_state_dict(path), state_dict)


# -- unsafe pickles ---------------------------------------------------------------------------


class _TouchOnLoad:
    """Unpickling this creates ``marker``: harmless stand-in for os.system."""

    def __init__(self, marker):
        self.marker = pathlib.Path(marker)

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _write_with_torch_save(obj, path):
    torch.save(obj, path)


def _write_with_pickle(obj, path):
    # Protocol 2, torch.load's own: the refusal is then about the payload, not the protocol.
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _read_unsafely_with_torch(path):
    torch.load(path, weights_only=False)


def _read_unsafely_with_pickle(path):
    with open(path, "rb") as f:
        pickle.load(f)


@pytest.mark.parametrize("write, read_unsafely", [
    (_write_with_torch_save, _read_unsafely_with_torch),
    (_write_with_pickle, _read_unsafely_with_pickle),
], ids=["torch.save", "pickle.dump"])
def test_pickle_that_runs_code_is_refused_before_it_runs(tmp_path, write, read_unsafely):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    write({"weight": torch.zeros(3), "payload": _TouchOnLoad(marker)}, path)

    with pytest.raises(CheckpointError) as info:
        load_state_dict(path)
    message = str(info.value)
    assert str(path) in message
    assert "refused" in message and "weights_only" in message
    assert not marker.exists(), "the pickle's code ran"

    # Control: the file really does run code when unpickled without weights_only, so the
    # check above is not passing because the payload was inert.
    control = tmp_path / "control"
    write({"payload": _TouchOnLoad(control)}, tmp_path / "control.pt")
    read_unsafely(tmp_path / "control.pt")
    assert control.exists()


# -- unreadable files -------------------------------------------------------------------------


def _truncated_zip_pt(tmp_path, sd):
    path = tmp_path / "truncated.pt"
    torch.save(sd, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _truncated_legacy_pt(tmp_path, sd):
    path = tmp_path / "truncated_legacy.pt"
    torch.save(sd, path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _random_bytes_pt(tmp_path, sd):
    path = tmp_path / "random.pth"
    path.write_bytes(np.random.default_rng(0).bytes(301))
    return path


def _empty_pt(tmp_path, sd):
    path = tmp_path / "empty.pt"
    path.write_bytes(b"")
    return path


def _truncated_safetensors(tmp_path, sd):
    path = tmp_path / "truncated.safetensors"
    save_state_dict(sd, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _random_bytes_safetensors(tmp_path, sd):
    path = tmp_path / "random.safetensors"
    path.write_bytes(np.random.default_rng(1).bytes(301))
    return path


def _empty_safetensors(tmp_path, sd):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    return path


def _safetensors_with_corrupt_header(tmp_path, sd):
    path = tmp_path / "bad_header.safetensors"
    save_state_dict(sd, path)
    data = bytearray(path.read_bytes())
    data[8:20] = b"not json!!!!"  # the JSON header starts after an 8-byte length
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("make", [
    _truncated_zip_pt, _truncated_legacy_pt, _random_bytes_pt, _empty_pt,
    _truncated_safetensors, _random_bytes_safetensors, _empty_safetensors, _safetensors_with_corrupt_header,
], ids=lambda f: f.__name__.lstrip("_"))
def test_unreadable_file_raises_checkpoint_error_naming_it(tmp_path, make):
    sd = {"w": torch.randn(5, 7), "b": torch.randn(7)}
    path = make(tmp_path, sd)
    with pytest.raises(CheckpointError) as info:
        load_state_dict(path)
    # Named, and said to be unreadable (random bytes read as a pickle: refused), not missing or
    # of an unknown type.
    assert str(info.value).startswith((f"{path}: not ", f"{path}: refused to load"))


@pytest.mark.parametrize("name", ["model.npz", "model.txt", "model"])
def test_unknown_suffix_is_refused_naming_the_file(tmp_path, name):
    path = tmp_path / name
    torch.save({"w": torch.zeros(2)}, path)  # readable as a .pt: the suffix alone decides
    with pytest.raises(CheckpointError, match="unknown checkpoint type") as info:
        load_state_dict(path)
    assert str(path) in str(info.value)


def test_missing_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "nowhere" / "model.safetensors"
    with pytest.raises(CheckpointError, match="no such file") as info:
        load_state_dict(path)
    assert str(path) in str(info.value)


# -- files that hold something other than a state dict ----------------------------------------


def test_non_tensor_entries_are_refused_by_name(tmp_path):
    path = tmp_path / "numbers.pt"
    torch.save({"a": 1, "w": torch.zeros(2), "b": "text"}, path)
    with pytest.raises(CheckpointError) as info:
        load_state_dict(path)
    message = str(info.value)
    assert str(path) in message
    assert "these entries are not tensors: a, b" in message


def test_non_tensor_entries_with_mixed_key_types_are_refused_by_name(tmp_path):
    path = tmp_path / "mixed.pt"
    torch.save({0: 1, "b": 2.0}, path)
    with pytest.raises(CheckpointError, match="these entries are not tensors: 0, b"):
        load_state_dict(path)


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "list.pt"
    torch.save([torch.zeros(2)], path)
    with pytest.raises(CheckpointError, match="expected a state dict") as info:
        load_state_dict(path)
    assert str(path) in str(info.value)
