"""PyTorch's own nn.Transformer loads into the Flax twin through ``NN_TRANSFORMER_RENAME``.

``Seq2SeqTransformer`` (embeddings + nn.Transformer + projection) and the seed model compute
the same function: with its weights renamed into the Flax twin and into torch_ref's Transformer,
all three give the same logits on a padded batch (within 1e-5), and the map round-trips.
"""

import numpy as np
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
import torch_ref
from parity import ConversionError, flax_to_torch, torch_to_flax
from parity.cli import main
from parity.nn_transformer import (NN_TRANSFORMER_RENAME, Seq2SeqTransformer, check_module, from_seed_state_dict,
                                   is_nn_transformer, to_seed_state_dict)

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

CONFIG = dict(src_pad_idx=0, source_vocab_size=23, target_vocab_size=19, max_len=17, embed_size=30, heads=5,
              num_layers=2, dropout=0.1)
# Padded sources (pad id 0 at the end of rows 0 and 2; no row all padding: see nn_transformer.py).
SOURCE = np.array([[3, 5, 7, 0, 0, 0], [1, 2, 3, 4, 5, 6], [9, 8, 0, 0, 0, 0]])
TARGET = np.array([[1, 4, 2, 6], [2, 2, 7, 1], [5, 3, 8, 9]])


@pytest.fixture(scope="module")
def wrapped():
    torch.manual_seed(0)
    return Seq2SeqTransformer(**CONFIG).eval()


def test_nn_transformer_logits_match_the_flax_twin_and_torch_ref_on_a_padded_batch(wrapped):
    with torch.no_grad():
        want = wrapped(torch.as_tensor(SOURCE), torch.as_tensor(TARGET)).cpu().numpy()
    flax_model = torch_to_flax(wrapped.state_dict(), fm.Transformer(**CONFIG, rngs=nnx.Rngs(1)),
                               rename=NN_TRANSFORMER_RENAME)
    flax_model.eval()
    np.testing.assert_allclose(np.asarray(flax_model(SOURCE, TARGET)), want, atol=1e-5, rtol=0)
    seed = torch_ref.Transformer(**CONFIG).eval()
    seed.load_state_dict(to_seed_state_dict(wrapped.state_dict()), strict=True)
    with torch.no_grad():
        np.testing.assert_allclose(seed(torch.as_tensor(SOURCE), torch.as_tensor(TARGET)).cpu().numpy(), want,
                                   atol=1e-5, rtol=0)


def test_nn_transformer_map_round_trips_bit_exact(wrapped):
    flax_model = torch_to_flax(wrapped.state_dict(), fm.Transformer(**CONFIG, rngs=nnx.Rngs(1)),
                               rename=NN_TRANSFORMER_RENAME)
    back = flax_to_torch(flax_model, rename=NN_TRANSFORMER_RENAME)
    assert set(back) == set(wrapped.state_dict())
    for key, value in wrapped.state_dict().items():
        assert torch.equal(back[key], value), key
    again = from_seed_state_dict(to_seed_state_dict(wrapped.state_dict()))
    assert all(torch.equal(again[k], v) for k, v in wrapped.state_dict().items())


# nn.Transformer warns that norm_first disables its nested-tensor fast path: expected here.
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_final_norms_norm_first_and_gelu_are_refused_by_name():
    t = torch.nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=8,
                             norm_first=True, activation="gelu", batch_first=True)
    with pytest.raises(ConversionError) as info:
        check_module(t)
    for what in ("final encoder LayerNorm", "final decoder LayerNorm", "norm_first=True in the encoder",
                 "encoder activation gelu"):
        assert what in str(info.value)
    state = {f"transformer.{k}": v for k, v in t.state_dict().items()}
    assert is_nn_transformer(state)
    with pytest.raises(ConversionError, match=r"final encoder/decoder LayerNorms \(transformer.decoder.norm.bias"):
        to_seed_state_dict(state)
    check_module(Seq2SeqTransformer(**CONFIG).transformer)  # the wrapper passes


def test_a_layer_norm_eps_or_bias_free_layers_unlike_the_seeds_are_refused_by_name():
    # Not in the state dict, so check_module names it: at 1e-3 the logits differ by 6e-4 from the
    # twin's, at 1e-6 by less than the 1e-5 tolerance.
    for eps in (1e-3, 1e-6):
        kw = dict(d_model=8, nhead=2, dim_feedforward=8, batch_first=True, layer_norm_eps=eps)
        t = torch.nn.Transformer(**kw, custom_encoder=torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(**kw), 1, norm=None, enable_nested_tensor=False),
            custom_decoder=torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(**kw), 1, norm=None))
        with pytest.raises(ConversionError) as info:
            check_module(t)
        for name in ("encoder", "decoder"):
            assert f"layer_norm_eps={eps} in the {name} (the seed's LayerNorms use 1e-05)" in str(info.value)
    # bias=False (torch >= 2.1) leaves out keys the conversion would miss one by one: said once, by name.
    kw = dict(d_model=8, nhead=2, dim_feedforward=8, batch_first=True, bias=False)
    t = torch.nn.Transformer(**kw, custom_encoder=torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(**kw), 1, norm=None, enable_nested_tensor=False),
        custom_decoder=torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(**kw), 1, norm=None))
    with pytest.raises(ConversionError, match=r"bias=False in the encoder \(the seed's layers have biases\); "
                                              r"bias=False in the decoder"):
        check_module(t)


def test_parity_check_and_convert_accept_an_nn_transformer_checkpoint(wrapped, tmp_path, capsys):
    path = tmp_path / "nn_transformer.pt"
    torch.save(wrapped.state_dict(), path)
    assert main(["check", "--torch-checkpoint", str(path), "--heads", "5", "--batch", "2"]) == 0
    assert "nn.Transformer" in capsys.readouterr().out
    assert main(["convert", str(path), str(tmp_path / "flax.safetensors"), "--heads", "5"]) == 0
