"""torch_ref reproduces the numbers printed in seed 004, and the Flax twins reproduce them too.

The seed seeds torch's RNG with 123 inside its modules' constructors (slip 8, removed); seeding
outside the constructor in the same order regenerates the same weights. The notebook's
FeedForward cell ran out of order, so its RNG state (and printout) cannot be regenerated.
"""

import jax.numpy as jnp
import numpy as np
import torch
import torch.nn as nn
import pytest

import seed_classes

import flaxformer_mini as fm
import torch_ref
from conftest import assert_close, flax_twin_of

TOKEN_IDS = [[0, 1, 2, 3, 0, 4, 2, 5]]  # "my shoes are small, my feet are big."
PRINT_ATOL = 1e-4  # the seed prints 4 decimals

# Rows 0-1 of each printout in seed 004.
SEED_EMBEDDED = [[0.3374, -0.1778, -0.3035, -0.5880], [0.3486, 0.6603, -0.2196, -0.3792]]
SEED_WITH_POSITIONS = [[0.6747, -0.3556, -0.6071, -1.1760], [0.6972, 1.3207, -0.4393, -0.7583]]
SEED_MHA_OUT = [[-0.1172, 0.0805, -0.3105, 0.2153], [-0.1017, 0.0579, -0.3384, 0.1675]]
SEED_WEIGHTS_HEAD0_ROW0 = [0.1174, 0.1157, 0.1151, 0.1445, 0.1276, 0.1423, 0.1021, 0.1353]
SEED_ADD_NORM = [[1.5543, 0.2013, -0.8427, -0.9129], [0.5031, 1.3901, -1.0524, -0.8408]]


def seed_004_walkthrough():
    torch.manual_seed(123)
    embedded = nn.Embedding(6, 4)(torch.tensor(TOKEN_IDS))
    torch.manual_seed(123)
    pe = torch_ref.LearnedPositionalEncoding(d_model=4, max_len=10)
    torch.manual_seed(123)
    mha = torch_ref.MultiHeadSelfAttention(d_model=4, num_heads=2)
    return embedded.detach(), pe, mha


def test_torch_ref_reproduces_seed_004_printouts():
    embedded, pe, mha = seed_004_walkthrough()
    with torch.no_grad():
        x = pe(embedded)
        out, weights = mha(x)
        normed = nn.LayerNorm(4)(x + out)
    np.testing.assert_allclose(embedded[0, :2], SEED_EMBEDDED, atol=PRINT_ATOL)
    np.testing.assert_allclose(x[0, :2], SEED_WITH_POSITIONS, atol=PRINT_ATOL)
    np.testing.assert_allclose(out[0, :2], SEED_MHA_OUT, atol=PRINT_ATOL)
    np.testing.assert_allclose(weights[0, 0, 0], SEED_WEIGHTS_HEAD0_ROW0, atol=PRINT_ATOL)
    np.testing.assert_allclose(normed[0, :2], SEED_ADD_NORM, atol=PRINT_ATOL)


def test_flax_twins_reproduce_seed_004_printouts():
    embedded, pe, mha = seed_004_walkthrough()
    f_pe = flax_twin_of(pe, fm.LearnedPositionalEncoding, 4, 10)
    f_mha = flax_twin_of(mha, fm.MultiHeadSelfAttention, 4, 2)
    x = f_pe(jnp.asarray(embedded.numpy()))
    out, weights = f_mha(x)
    np.testing.assert_allclose(x[0, :2], SEED_WITH_POSITIONS, atol=PRINT_ATOL)
    np.testing.assert_allclose(out[0, :2], SEED_MHA_OUT, atol=PRINT_ATOL)
    np.testing.assert_allclose(weights[0, 0, 0], SEED_WEIGHTS_HEAD0_ROW0, atol=PRINT_ATOL)
    # Beyond the printout's 4 decimals, the twins agree to the parity tolerance.
    with torch.no_grad():
        assert_close(out, mha(pe(embedded))[0])


SEED_CASES = {
    # class name: (constructor args, input shapes or ids)
    "SelfAttention": ((30, 5), "qkv_mask"),
    "TransformerBlock": ((30, 5, 0.1), "qkv_mask"),
    "DecoderBlock": ((30, 5, 0.1), "decoder_block"),
    "Encoder": ((23, 17, 30, 5, 2, 0.1), "encoder"),
    "Decoder": ((19, 17, 30, 5, 2, 0.1), "decoder"),
    "Transformer": ((0, 23, 19, 17, 30, 5, 2, 0.1), "transformer"),
    "MultiHeadAttention": ((30, 5), "qkv"),
    "PerHeadSelfAttention": ((30, 5), "qkv_mask"),
    "LearnedPositionalEncoding": ((30, 17), "x"),
    "MultiHeadSelfAttention": ((30, 5), "x"),
    "FeedForward": ((30, 37), "x"),
}


def seed_inputs(kind):
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((3, 11, 30)).astype(np.float32))
    mem = torch.from_numpy(rng.standard_normal((3, 13, 30)).astype(np.float32))
    mask = torch.from_numpy(np.arange(13)[None, None, None, :] < np.array([13, 5, 1])[:, None, None, None])
    causal = torch.tril(torch.ones((3, 1, 11, 11)))
    src = torch.from_numpy(rng.integers(1, 19, size=(3, 13)))
    src[1, 5:] = 0
    tgt = torch.from_numpy(rng.integers(0, 19, size=(3, 11)))
    return {
        "x": (x,),
        "qkv": (x, mem, mem),
        "qkv_mask": (x, mem, mem, mask),
        "decoder_block": (x, mem, mem, mask, causal),
        "encoder": (src, mask),
        "decoder": (tgt, mem, mask, causal),
        "transformer": (src, tgt),
    }[kind]


@pytest.mark.parametrize("name", sorted(SEED_CASES))
def test_seed_class_state_dict_loads_strictly_and_computes_the_same(name):
    args, kind = SEED_CASES[name]
    torch.manual_seed(0)
    seed_module = getattr(seed_classes, name)(*args).eval()
    ours = getattr(torch_ref, name)(*args).eval()
    ours.load_state_dict(seed_module.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(seed_module.state_dict())  # same keys, same order
    inputs = seed_inputs(kind)
    with torch.no_grad():
        for a, b in zip(torch.utils._pytree.tree_leaves(ours(*inputs)), torch.utils._pytree.tree_leaves(seed_module(*inputs)),
                        strict=True):  # an output one side leaves out is a difference
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_seed_002_attention_function_is_reproduced():
    rng = np.random.default_rng(1)
    Q, K, V = (torch.from_numpy(rng.standard_normal((2, 3, 5, 7)).astype(np.float32)) for _ in range(3))
    torch.testing.assert_close(torch_ref.scaled_dot_product_attention(Q, K, V), seed_classes.scaled_dot_product_attention(Q, K, V), rtol=0, atol=0)


@pytest.mark.parametrize("heads", [4, 0, -1])
def test_a_transformer_whose_heads_do_not_divide_its_width_is_refused_where_it_is_built(heads):
    args = dict(src_pad_idx=0, source_vocab_size=10, target_vocab_size=10, max_len=8, embed_size=30, heads=heads,
                num_layers=1, dropout=0.0)
    ids = torch.ones(2, 3, dtype=torch.long)
    if heads == 4:  # the seed's class builds it, and its forward fails in a reshape of 30 into 4 heads of 7
        with pytest.raises(RuntimeError, match=r"shape '\[2, 3, 4, 7\]' is invalid"):
            seed_classes.Transformer(*args.values())(ids, ids)
    with pytest.raises(ValueError, match=f"^heads must be a positive divisor of embed_size, got heads={heads} and embed_size=30:"):
        torch_ref.Transformer(**args)


def test_positions_and_the_causal_mask_are_made_on_the_inputs_device():
    # Seed slip 3: the seed makes its positions (torch.arange) and its causal mask (torch.ones)
    # on the CPU whatever the input's device, which fails on a GPU. Torch's meta device shows
    # where each is made on a CPU-only machine (meta tensors hold shapes, no data).
    with torch.device("meta"):
        model = torch_ref.Transformer(0, 11, 13, 9, 16, 4, 1, 0.0).eval()
        source, target = torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long)
    seen = []
    for table in (model.encoder.positional_encoding, model.decoder.positional_embedding):  # the seed's names
        table.register_forward_pre_hook(lambda module, args: seen.append(args[0].device))
    source_mask = model.create_source_mask(source)
    encoded = model.encoder(source, source_mask, check_inputs=False)  # token checks read values: meta has none
    target_mask = model.create_target_mask(target)
    logits = model.decoder(target, encoded, source_mask, target_mask, check_inputs=False)
    assert [d.type for d in seen] == ["meta", "meta"]
    assert (target_mask.device.type, logits.device.type, logits.shape) == ("meta", "meta", (2, 4, 13))
