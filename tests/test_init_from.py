"""`flaxformer-mini train --init-from FILE`: a new run starts from weights trained in PyTorch
(or converted by parity), exactly, and a resume is held to the file it started from."""

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import flaxformer_mini as fm
import torch_ref
from flaxformer_mini.runs.run import Run
from flaxformer_mini.runs.config import DataConfig, TrainOptions
from parity import flax_to_torch
from helpers import TINY_RUN, cli

# TINY_RUN's model: the tiny preset (width 30, 5 heads) with one layer, 11 token ids, --max-len 5
# (max_len 6 with the BOS/EOS). Dropout 0, so the first step's loss is a function of the weights.
SIZES = dict(src_pad_idx=0, source_vocab_size=11, target_vocab_size=11, max_len=6, embed_size=30, heads=5,
             num_layers=1, dropout=0.0)
RUN = [*TINY_RUN, "--dropout", "0", "--log-every", "1"]


def torch_model(seed=0, **changes):
    torch.manual_seed(seed)
    return torch_ref.Transformer(**{**SIZES, **changes}).eval()


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    d = tmp_path_factory.mktemp("weights")
    model = torch_model()
    save_file(model.state_dict(), d / "model.safetensors")
    return model, d / "model.safetensors"


@pytest.fixture(scope="module")
def started(weights, tmp_path_factory):
    """A run of one step started from the torch model's weights."""
    out = tmp_path_factory.mktemp("runs") / "from_torch"
    result = cli("train", *RUN, "--steps", "1", "--init-from", str(weights[1]), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"starting from the weights of {weights[1]}" in result.stderr
    return out


def assert_state_dicts_equal(got, want):
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_step_zero_holds_the_files_weights_and_the_first_loss_is_torchs(weights, started, tmp_path):
    model, path = weights
    record = json.loads((started / "config.json").read_text())["init_from"]
    assert record["path"] == str(path) and len(record["sha256"]) == 64

    # The first logged loss is step 0's parameters on batch 0 (before the update): torch's loss
    # on the same batch, within float32 rounding of two implementations.
    first = json.loads((started / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1
    run = Run.open(started)
    (batch,) = run.train_batches(0)
    with torch.no_grad():
        logits = model(torch.from_numpy(np.asarray(batch.source)).long(), torch.from_numpy(np.asarray(batch.target_in)).long())
        loss = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(np.asarray(batch.target_out)).long().flatten(),
                               ignore_index=0)
    assert abs(first["loss"] - loss.item()) <= 1e-5, (first["loss"], loss.item())

    # Step 0's state, as restore_or_init builds it for a run without a checkpoint (a copy of the
    # run with its checkpoints removed: resumed before its first save), is the file's, bit for bit.
    copy = tmp_path / "copy"
    shutil.copytree(started, copy)
    shutil.rmtree(copy / "checkpoints")
    run = Run.open(copy)
    state = run.restore_or_init(run.checkpoints(), echo=lambda m: None)
    assert int(state.step) == 0
    assert_state_dicts_equal(flax_to_torch(run.trainer.model(state)), model.state_dict())


def test_scan_layers_stacks_the_files_layers(weights, tmp_path):
    model, path = weights
    model2 = torch_model(seed=1, num_layers=2)  # two layers, so a stacking order matters
    save_file(model2.state_dict(), tmp_path / "two.safetensors")
    options = TrainOptions(preset="tiny", num_layers=2, dropout=0.0, scan_layers=True,
                           init_from=str(tmp_path / "two.safetensors"))
    data = DataConfig(kind="synthetic", task="copy", vocab_size=11, max_len=5, eval_sequences=16)
    run = Run.start(tmp_path / "out", options, data, echo=lambda m: None)
    try:
        state = run.restore_or_init(run.checkpoints(), echo=lambda m: None)
    finally:
        run.close()
    stacked = state.params["encoder"]["transformer_layers"]["norm1"]["scale"]
    assert stacked.shape == (2, 30)
    assert_state_dicts_equal(flax_to_torch(run.trainer.model(state)), model2.state_dict())


def test_a_file_of_another_shape_is_refused_by_key_and_shapes_and_nothing_is_written(tmp_path):
    save_file(torch_model(source_vocab_size=13).state_dict(), tmp_path / "v13.safetensors")
    out = tmp_path / "out"
    result = cli("train", *RUN, "--steps", "1", "--init-from", str(tmp_path / "v13.safetensors"), "--out", str(out))
    assert result.returncode == 2
    message = result.stderr
    assert "'encoder.embedding_layer.weight' is (13, 30) in the file, (11, 30) in the run's model" in message
    assert "--vocab-size 11" in message and "--preset tiny" in message and "--embed-size" in message
    assert "Traceback" not in message
    assert not out.exists()


def test_heads_recorded_in_a_parity_exports_metadata_must_be_the_runs(tmp_path):
    # The weights fit any head count that divides the width; the count parity recorded (not
    # assumed) is the model's, so another one is refused before anything is written, whether
    # the file holds torch keys or Flax paths.
    import contextlib
    import io

    import flaxformer_mini as fm
    from parity.checkpoint_io import save_state_dict
    from parity.cli import main as parity_main

    model = torch_model(heads=3)  # width 30: 3 heads of 10
    torch_file = save_state_dict(model.state_dict(), tmp_path / "three_heads.safetensors",
                                 config=fm.ModelConfig(**{**SIZES, "heads": 3}))
    flax_file = tmp_path / "three_heads_flax.safetensors"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert parity_main(["convert", str(torch_file), str(flax_file)]) == 0  # heads from the metadata
    for path in (torch_file, flax_file):
        out = tmp_path / f"run_{path.stem}"
        result = cli("train", *RUN, "--steps", "1", "--init-from", str(path), "--out", str(out))
        assert result.returncode == 2, result.stderr
        assert (f"--init-from {path}: its metadata records a model of 3 heads, and this run's has 5 (--heads, "
                f"--preset): the weights fit both, but only 3 computes the model's outputs. Train with --heads 3"
                in result.stderr), result.stderr
        assert not out.exists()


def test_a_resume_is_held_to_the_file_it_started_from(weights, started, tmp_path):
    _, path = weights
    run = tmp_path / "run"
    shutil.copytree(started, run)
    before = (run / "config.json").read_bytes()
    save_file(torch_model(seed=5).state_dict(), tmp_path / "other.safetensors")
    other = cli("train", *RUN, "--steps", "2", "--init-from", str(tmp_path / "other.safetensors"), "--out", str(run))
    assert other.returncode == 2
    assert f"--init-from: {path} in the run, {tmp_path / 'other.safetensors'} now" in other.stderr
    without = cli("train", *RUN, "--steps", "2", "--out", str(run))
    assert without.returncode == 2 and f"the run started from {path}" in without.stderr
    assert (run / "config.json").read_bytes() == before

    # The same path with other contents: refused by its sha256.
    changed = tmp_path / "changed.safetensors"
    shutil.copy(path, changed)
    run2 = tmp_path / "run2"
    assert cli("train", *RUN, "--steps", "1", "--init-from", str(changed), "--out", str(run2)).returncode == 0
    save_file(torch_model(seed=6).state_dict(), changed)
    refused = cli("train", *RUN, "--steps", "2", "--init-from", str(changed), "--out", str(run2))
    assert refused.returncode == 2 and "the file changed since the run started from it" in refused.stderr

    # The same file resumes from the checkpoint (with a checkpoint, the file's contents do not matter).
    same = cli("train", *RUN, "--steps", "2", "--init-from", str(path), "--out", str(run))
    assert same.returncode == 0, same.stderr
    assert "resuming" in same.stderr and "starting from the weights" not in same.stderr
    # Moved with its contents, or gone: the checkpoints hold the run, which resumes (a note says so).
    moved = tmp_path / "moved.safetensors"
    shutil.copy(path, moved)
    resumed = cli("train", *RUN, "--steps", "3", "--init-from", str(moved), "--out", str(run))
    assert resumed.returncode == 0, resumed.stderr
    assert f"--init-from {moved} holds what the run started from (recorded at {path})" in resumed.stderr
    changed.unlink()
    resumed = cli("train", *RUN, "--steps", "2", "--init-from", str(changed), "--out", str(run2))
    assert resumed.returncode == 0, resumed.stderr
    assert f"--init-from {changed} is gone; the run resumes from its checkpoints" in resumed.stderr


def test_a_run_resumed_before_its_first_checkpoint_reads_the_file_where_it_moved(weights, started, tmp_path):
    _, path = weights
    run = tmp_path / "run"  # killed before its first save: the config written, no checkpoint
    shutil.copytree(started, run)
    shutil.rmtree(run / "checkpoints")
    # The run records a file that is gone; its contents are at `moved`.
    config = json.loads((run / "config.json").read_text())
    record = config["init_from"]
    config["init_from"] = {**record, "path": str(tmp_path / "gone.safetensors")}
    config["checksums"].pop("config", None)
    (run / "config.json").write_text(json.dumps(config))
    moved = tmp_path / "moved.safetensors"
    shutil.copy(path, moved)
    resumed = cli("train", *RUN, "--steps", "1", "--init-from", str(moved), "--out", str(run))
    assert resumed.returncode == 0, resumed.stderr
    assert f"starting from the weights of {moved}" in resumed.stderr
    assert json.loads((run / "config.json").read_text())["init_from"]["sha256"] == record["sha256"]


def test_the_weight_reader_is_parity_s_found_through_its_entry_point():
    # flaxformer_mini never imports parity (DESIGN.md): it finds the reader by the packaging
    # entry point that pyproject.toml declares, which `pip install -e .` registers.
    from importlib.metadata import entry_points

    import parity.init_weights
    from flaxformer_mini.runs import init_from

    assert ("parity", "parity.init_weights") in [(e.name, e.value) for e in entry_points(group=init_from.READERS)]
    assert init_from.weight_reader() is parity.init_weights


def test_without_a_weight_reader_init_from_says_how_to_install_one(monkeypatch, weights, tmp_path):
    from importlib.metadata import EntryPoint, EntryPoints

    from flaxformer_mini.runs import init_from

    monkeypatch.setattr(init_from, "entry_points", lambda group: EntryPoints(()))
    with pytest.raises(init_from.InitFromError, match=r"--init-from needs a weight reader, and none is installed: "
                       r".*`pip install -e \.` in a checkout"):
        init_from.read_params(str(weights[1]), None)
    for value, problem in [("parity.no_such_reader", "cannot be loaded: ModuleNotFoundError"),
                           ("parity.init_weights:no_such_name", "cannot be loaded: AttributeError"),
                           ("json", "lacks read_params and params_into_model")]:
        broken = EntryPoints([EntryPoint("parity", value, init_from.READERS)])
        monkeypatch.setattr(init_from, "entry_points", lambda group, broken=broken: broken)
        with pytest.raises(init_from.InitFromError, match=f"the weight reader parity = {value} {problem}"):
            init_from.weight_reader()


def test_a_reader_that_leaves_parameters_without_values_is_refused_by_name(monkeypatch):
    # The run loads the file into the state's shapes (no random init): a reader that skipped
    # parameters instead of refusing the file would leave shapes where values belong.
    import types

    import jax
    from flax import nnx

    from flaxformer_mini.runs import init_from
    from flaxformer_mini.train.optimizer import TrainConfig
    from flaxformer_mini.train.trainer import Trainer

    lazy = types.SimpleNamespace(__name__="lazy_reader", read_params=None, params_into_model=lambda params, model: model)
    monkeypatch.setattr(init_from, "weight_reader", lambda: lazy)
    template = Trainer(nnx.eval_shape(lambda: fm.Transformer.from_config(fm.get_preset("tiny"), rngs=nnx.Rngs(0))),
                       TrainConfig()).state_template()
    n = len(jax.tree.leaves(template.params))
    with pytest.raises(init_from.InitFromError, match=rf"--init-from: the weight reader lazy_reader left {n} "
                                                      r"parameter\(s\) without values, e\.g\. decoder/"):
        init_from.load_into_state(template, {})


def test_a_directory_is_read_once_per_process_and_its_digest_follows_its_contents(tmp_path, monkeypatch):
    # An orbax directory given to --init-from is digested for the options check and again for
    # the record: each file is read once (run_dir.data_file_sha256's cache, keyed by size and
    # mtime), and a changed file still changes the digest.
    import os

    from flaxformer_mini.runs import init_from
    from flaxformer_mini.runs import directory as run_dir

    d = tmp_path / "params"
    (d / "sub").mkdir(parents=True)
    (d / "a").write_bytes(b"alpha")
    (d / "sub" / "b").write_bytes(b"beta")
    reads = []
    real = run_dir.file_sha256
    monkeypatch.setattr(run_dir, "file_sha256", lambda p: reads.append(os.path.relpath(p, d)) or real(p))
    first = init_from.digest(str(d))
    assert init_from.digest(str(d)) == first and sorted(reads) == ["a", "sub/b"]
    (d / "sub" / "b").write_bytes(b"betA")
    os.utime(d / "sub" / "b", ns=(1, 1))  # another mtime even on a coarse clock
    assert init_from.digest(str(d)) != first and sorted(reads) == ["a", "sub/b", "sub/b"]
