"""The feed-forward width option ``ffn_dim`` (F) outside the twins' forward pass: the config
field and its validation, old run configs, the presets, conversion both ways, and the
shape inference of ``parity check``.

F = 46 and D = 30 (odd, distinct), so a (D, F) weight read the wrong way round changes a
shape. The twins' forward parity with F != D is in ``tests/test_twins_forward.py``.
"""

import json

import jax
import numpy as np
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
import torch_ref
from conftest import ATOL
from parity import ConversionError, check_checkpoint, flax_to_torch, infer_config, torch_to_flax
from parity.cli import main

F = 46
ENCODER_FFN = "encoder.transformer_layers.{}.fc.0.weight"
DECODER_FFN = "decoder.decoder_layers.{}.transformer_block.fc.0.weight"


@pytest.fixture
def ffn_config(tiny_config):
    return tiny_config.replace(ffn_dim=F)


@pytest.fixture
def ffn_state_dict(ffn_config):
    torch.manual_seed(5)
    return torch_ref.Transformer(**ffn_config.to_dict()).state_dict()


# --- ModelConfig -------------------------------------------------------------------------


def test_ffn_dim_defaults_to_none_and_comes_after_the_seed_arguments_so_their_positions_are_unchanged(tiny_config):
    fields = [f.name for f in fm.ModelConfig.__dataclass_fields__.values()]
    seed_arguments = ["src_pad_idx", "source_vocab_size", "target_vocab_size", "max_len",
                      "embed_size", "heads", "num_layers", "dropout"]
    assert fields[:8] == seed_arguments and fields[8] == "ffn_dim" and tiny_config.ffn_dim is None
    assert tiny_config.feed_forward_width == tiny_config.embed_size
    assert tiny_config.replace(ffn_dim=F).feed_forward_width == F


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "64"])
def test_model_config_rejects_an_unusable_ffn_dim_naming_it(tiny_config, bad):
    with pytest.raises(ValueError, match=r"ffn_dim must be None \(= embed_size\) or an integer >= 1, got"):
        tiny_config.replace(ffn_dim=bad)


def test_numpy_integer_sizes_are_accepted_and_stored_as_python_numbers(tiny_config):
    # ffn_dim=np.int64(64) was refused while the seed's integer fields took numpy integers; and a
    # numpy scalar kept in the config would fail json.dumps of its dict (a run's config.json).
    config = tiny_config.replace(ffn_dim=np.int64(64), embed_size=np.int32(tiny_config.embed_size),
                                 dropout=np.float64(0.25))
    assert config == tiny_config.replace(ffn_dim=64, dropout=0.25)
    assert [type(config.ffn_dim), type(config.embed_size), type(config.dropout)] == [int, int, float]
    assert json.loads(json.dumps(config.to_dict()))["ffn_dim"] == 64


def test_model_dict_written_before_ffn_dim_existed_still_loads(tiny_config, ffn_config):
    # RunConfig.from_dict builds ModelConfig(**d["model"]): a run's config.json from before
    # the field has no "ffn_dim" key, and the default makes it the seed's F = D.
    old = tiny_config.to_dict()
    del old["ffn_dim"]
    assert fm.ModelConfig(**old) == tiny_config
    assert fm.ModelConfig(**json.loads(json.dumps(ffn_config.to_dict()))) == ffn_config


def test_ffn_dim_goes_through_to_dict_into_both_twins(ffn_config):
    torch_model = torch_ref.Transformer(**ffn_config.to_dict())
    flax_model = fm.Transformer.from_config(ffn_config, rngs=nnx.Rngs(0))
    assert flax_model.config == ffn_config
    for block in (torch_model.encoder.transformer_layers[0], torch_model.decoder.decoder_layers[1].transformer_block):
        assert tuple(block.fc[0].weight.shape) == (F, 30)
    for block in (flax_model.encoder.transformer_layers[0], flax_model.decoder.decoder_layers[1].transformer_block):
        assert block.fc[0].kernel.shape == (30, F)


# --- presets -------------------------------------------------------------------------------


@pytest.mark.parametrize("name, D, H, L, F_, dropout", [
    ("medium", 256, 4, 3, 1024, 0.1),
    ("transformer-base", 512, 8, 6, 2048, 0.1),  # Vaswani et al. 2017, Table 3, "base"
])
def test_real_task_presets_have_their_documented_sizes(name, D, H, L, F_, dropout):
    c = fm.get_preset(name)
    assert (c.embed_size, c.heads, c.num_layers, c.ffn_dim, c.dropout) == (D, H, L, F_, dropout)


def test_medium_preset_parameter_count_is_what_its_sizes_give():
    # Counted independently from the sizes: per encoder block attention 4 D^2 + 4 D (W_q, W_k,
    # W_v and the output projection, each with its bias), FFN 2 D F + F + D, two LayerNorms 4 D;
    # a decoder block adds a second attention and a LayerNorm; embeddings (V + max_len) D on each
    # side; logits D V + V.
    c = fm.get_preset("medium")
    D, F_, L, Vs, Vt, M = c.embed_size, c.ffn_dim, c.num_layers, c.source_vocab_size, c.target_vocab_size, c.max_len
    torch_model = torch_ref.Transformer(**c.to_dict())
    attention = 4 * D * D + 4 * D
    ffn = 2 * D * F_ + F_ + D
    encoder_block = attention + ffn + 4 * D
    decoder_block = 2 * attention + ffn + 6 * D
    want = L * (encoder_block + decoder_block) + (Vs + M) * D + (Vt + M) * D + D * Vt + Vt
    assert sum(p.numel() for p in torch_model.parameters()) == want
    flax_model = nnx.eval_shape(lambda: fm.Transformer.from_config(c, rngs=nnx.Rngs(0)))
    assert sum(x.size for x in jax.tree.leaves(nnx.state(flax_model, nnx.Param))) == want


# --- conversion ------------------------------------------------------------------------------


def test_conversion_round_trip_with_ffn_dim_is_bit_exact(ffn_config, ffn_state_dict):
    flax_model = fm.Transformer.from_config(ffn_config, rngs=nnx.Rngs(1))
    torch_to_flax(ffn_state_dict, flax_model)
    back = flax_to_torch(flax_model)
    assert set(back) == set(ffn_state_dict)
    for key, want in ffn_state_dict.items():
        assert back[key].shape == want.shape and torch.equal(back[key], want), key
    torch_ref.Transformer(**ffn_config.to_dict()).load_state_dict(back, strict=True)


def test_state_dict_of_another_ffn_width_is_refused_naming_the_ffn_keys(tiny_config, ffn_state_dict):
    seed_width_model = fm.Transformer.from_config(tiny_config, rngs=nnx.Rngs(0))  # F = D = 30
    with pytest.raises(ConversionError) as info:
        torch_to_flax(ffn_state_dict, seed_width_model)
    mismatched = set(info.value.mismatched)
    assert ENCODER_FFN.format(0) in mismatched and DECODER_FFN.format(1) in mismatched
    assert all(".fc." in key for key in mismatched)  # nothing else differs


# --- parity check's shape inference -----------------------------------------------------------


def test_ffn_dim_is_inferred_from_the_encoder_and_decoder_shapes(ffn_config, ffn_state_dict):
    assert infer_config(ffn_state_dict, heads=ffn_config.heads, src_pad_idx=0,
                        overrides={"dropout": ffn_config.dropout}) == ffn_config


def test_seed_width_checkpoint_infers_ffn_dim_none(tiny_config):
    state_dict = torch_ref.Transformer(**tiny_config.to_dict()).state_dict()
    assert infer_config(state_dict, heads=5, overrides={"dropout": tiny_config.dropout}) == tiny_config


@pytest.mark.parametrize("key", [ENCODER_FFN.format(1), DECODER_FFN.format(0)])
def test_checkpoint_whose_blocks_disagree_on_ffn_width_is_refused_naming_the_block(ffn_state_dict, key):
    state_dict = dict(ffn_state_dict)
    state_dict[key] = torch.zeros(F + 2, 30)
    with pytest.raises(ConversionError, match=rf"feed-forward widths disagree: .*{key}' has {F + 2}") as info:
        infer_config(state_dict, heads=5)
    assert key in info.value.mismatched


def test_config_file_ffn_dim_must_agree_with_the_shapes(ffn_state_dict):
    assert infer_config(ffn_state_dict, heads=5, overrides={"ffn_dim": F}).ffn_dim == F
    with pytest.raises(ConversionError, match=rf"config says ffn_dim=None but the checkpoint has F={F}"):
        infer_config(ffn_state_dict, heads=5, overrides={"ffn_dim": None})


def test_parity_check_of_an_ffn_checkpoint_is_within_tolerance(ffn_config, ffn_state_dict, tmp_path, capsys):
    report = check_checkpoint(ffn_state_dict, infer_config(ffn_state_dict, heads=5), batch=3, seed=2)
    assert report.ok and max(row.max_abs for row in report.rows) <= ATOL
    path = tmp_path / "ffn.pt"
    torch.save(ffn_state_dict, path)
    assert main(["check", "--torch-checkpoint", str(path), "--heads", "5"]) == 0
    assert f"intermediates within {ATOL:g}" in capsys.readouterr().out
