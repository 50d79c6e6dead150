"""``flaxformer_mini.train.checkpoint.restore``: the shapes it checks a model against.

Properties checked: a checkpoint of another width is refused naming both shapes, read from
the arrays themselves, and one of another depth naming the layers it lacks, read from the
stored metadata, which a restore through host arrays that fits never reads; a state large
beside the memory free is placed by orbax array by array, its stored shapes checked first, with
the same values and layout as through host arrays; a training state of another TrainConfig
(its optimizer state or moving average) is refused naming the part; the
module checks a TrainState without importing the train step (its loss, moving average, token
checks).
"""

import subprocess
import sys

import chex
import jax
import pytest
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.train import checkpoint
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer


def trainer(embed_size):
    config = fm.ModelConfig(0, 11, 11, 6, embed_size, 5, 1, 0.0)
    return Trainer(fm.Transformer.from_config(config, rngs=nnx.Rngs(0)), TrainConfig())


@pytest.fixture
def metadata_reads(monkeypatch):
    """The steps whose stored metadata ``checkpoint.restore`` reads, in order."""
    reads = []
    read = checkpoint._read_stored_shapes
    monkeypatch.setattr(checkpoint, "_read_stored_shapes", lambda manager, step: reads.append(step) or read(manager, step))
    return reads


def test_the_stored_metadata_is_read_only_to_name_what_a_failed_restore_differs_in(tmp_path, metadata_reads):
    reads = metadata_reads
    narrow, wide = trainer(30), trainer(35)
    manager = checkpoint.open_manager(tmp_path / "checkpoints")
    checkpoint.save(manager, wide.init_state())
    restored = checkpoint.restore(manager, wide.state_template())
    chex.assert_trees_all_equal(restored.params, wide.init_state().params)
    assert reads == []  # a restore that fits reads the arrays alone
    # Another width: the arrays read name the shapes, still no metadata read.
    with pytest.raises(checkpoint.CheckpointMismatchError, match=r"W_k/kernel: checkpoint \(35, 35\), model \(30, 30\)"):
        checkpoint.restore(manager, narrow.state_template())
    assert reads == []
    # Another depth: orbax refuses the tree, and the stored metadata names the layers it lacks.
    deeper = Trainer(fm.Transformer.from_config(fm.ModelConfig(0, 11, 11, 6, 35, 5, 2, 0.0), rngs=nnx.Rngs(0)), TrainConfig())
    with pytest.raises(checkpoint.CheckpointMismatchError, match=r"decoder_layers/1/attention/W_k/bias: not in the checkpoint"):
        checkpoint.restore(manager, deeper.state_template())
    assert reads == [0]


def test_a_state_large_beside_the_memory_free_is_placed_by_orbax_with_the_same_values_and_layout(tmp_path, monkeypatch,
                                                                                                 metadata_reads):
    reads = metadata_reads
    wide = trainer(35)
    manager = checkpoint.open_manager(tmp_path / "checkpoints")
    checkpoint.save(manager, wide.init_state())
    by_host = checkpoint.restore(manager, wide.state_template())
    monkeypatch.setattr(checkpoint.memory, "host_available", lambda: 0)  # every state is large beside it
    by_orbax = checkpoint.restore(manager, wide.state_template())
    chex.assert_trees_all_equal((by_orbax.step, by_orbax.params, by_orbax.opt_state),
                                (by_host.step, by_host.params, by_host.opt_state))
    for a, b in zip(jax.tree.leaves(by_orbax.params), jax.tree.leaves(by_host.params)):
        assert a.sharding == b.sharding and a.committed and b.committed
    assert reads == [0]  # checked before orbax reads: refusing a shape itself, it leaves failing reads behind
    with pytest.raises(checkpoint.CheckpointMismatchError, match=r"W_k/kernel: checkpoint \(35, 35\), model \(30, 30\)"):
        checkpoint.restore(manager, trainer(30).state_template())
    assert reads == [0, 0]


@pytest.mark.parametrize("by", ["host", "orbax"])
@pytest.mark.parametrize("changes, part", [(dict(weight_decay=0.1), "opt_state"), (dict(clip_norm=None), "opt_state"),
                                           (dict(ema_decay=0.9), "ema")], ids=["adamw", "no_clipping", "ema"])
def test_a_training_state_of_another_train_config_is_refused_naming_the_part(tmp_path, monkeypatch, by, changes, part):
    # orbax's own error suggests partial_restore=True, which restore does not take, and prints
    # the restore target's uninitialised arrays.
    saved = trainer(30)
    manager = checkpoint.open_manager(tmp_path / "checkpoints")
    checkpoint.save(manager, saved.init_state())
    if by == "orbax":
        monkeypatch.setattr(checkpoint.memory, "host_available", lambda: 0)  # orbax places the arrays itself
    other = Trainer(fm.Transformer.from_config(fm.ModelConfig(0, 11, 11, 6, 30, 5, 1, 0.0), rngs=nnx.Rngs(0)),
                    TrainConfig(**changes))
    with pytest.raises(checkpoint.CheckpointMismatchError,
                       match=rf"^checkpoint 0 in .* holds this model's parameters but another training state "
                             rf"\(in {part}\): the TrainConfig decides .* restore it into a Trainer of the TrainConfig "
                             rf"it was saved with$"):
        checkpoint.restore(manager, other.state_template())
    assert int(checkpoint.restore(manager, saved.state_template()).step) == 0  # its own config restores


def test_a_learners_mistakes_are_named_and_a_relative_directory_saves(tmp_path, monkeypatch):
    narrow = trainer(30)
    monkeypatch.chdir(tmp_path)
    manager = checkpoint.open_manager("ckpt")  # orbax refuses a relative path at its first save
    checkpoint.save(manager, narrow.init_state())
    assert int(checkpoint.restore(checkpoint.open_manager("ckpt"), narrow.state_template()).step) == 0
    # orbax: "Must provide `args` of type `Composite` when dealing with multiple checkpointable objects."
    with pytest.raises(FileNotFoundError, match=r"^no checkpoint 7 in .*ckpt \(its steps: 0\)$"):
        checkpoint.restore(manager, narrow.state_template(), step=7)
    with pytest.raises(TypeError, match=r"^expected a checkpoint manager \(checkpoint.open_manager\(directory\)\), "
                                        r"got str 'ckpt'$"):
        checkpoint.restore("ckpt", narrow.state_template())
    with pytest.raises(TypeError, match=r"^checkpoint.restore's template must be a TrainState "
                                        r"\(Trainer.state_template\(\)\), got Transformer$"):
        checkpoint.restore(manager, narrow.init_state().model())
    with pytest.raises(TypeError, match=r"^checkpoint.save's state must be a TrainState \(Trainer.init_state\(\) or "
                                        r"TrainState.create\(model, TrainConfig\(\)\)\), got dict$"):
        checkpoint.save(manager, {"params": narrow.init_state().params})
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match=r"a checkpoint directory must be a directory, not a file: '.*file'"):
        checkpoint.open_manager("file")


def test_the_checkpoint_module_checks_a_train_state_without_importing_the_train_step():
    # In a fresh interpreter: this one has imported the steps already (Trainer).
    probe = ("import sys, flaxformer_mini.train.checkpoint; "
             "print(sorted(m for m in ('flaxformer_mini.train.step', 'flaxformer_mini.train.loss', "
             "'flaxformer_mini.train.ema', 'flaxformer_mini.model.token_checks') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout == "[]\n"
