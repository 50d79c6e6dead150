"""Forward parity of every twin pair: the torch module and its Flax twin, holding the same
weights (converted from torch), give the same outputs within 1e-5.

Sizes are odd and distinct (D=30, H=5 so K=6, S=13, T=11, B=3, vocabularies 23 and 19), so
an axis swapped anywhere changes a shape instead of passing silently.
"""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
import torch_ref
from conftest import assert_close, flax_twin_of
from parity import as_inputs, sample_batch, transformer_pair

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

B, S, T, D, H = 3, 13, 11, 30, 5
SRC_VOCAB, TGT_VOCAB, MAX_LEN = 23, 19, 17
F = 46  # the feed-forward width option (ffn_dim), distinct from D

# The blocks and their stacks at the seed's F = D and at F != D (keyword-only ffn_dim).
FFN_WIDTHS = pytest.mark.parametrize("ffn", [{}, {"ffn_dim": F}], ids=["seed_width", "ffn_dim"])


def randn(*shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return torch.as_tensor(x), jnp.asarray(x)


def padding_mask(lengths, S):
    keep = np.arange(S)[None, :] < np.asarray(lengths)[:, None]  # (B, S)
    keep = keep[:, None, None, :]  # (B, 1, 1, S)
    return torch.as_tensor(keep), jnp.asarray(keep)


def causal_mask(B, T):
    keep = np.tril(np.ones((B, 1, T, T), dtype=bool))
    return torch.as_tensor(keep), jnp.asarray(keep)


def torch_module(cls, *args, **kwargs):
    torch.manual_seed(0)
    return cls(*args, **kwargs).eval()


def pair(cls_name, *args, **kwargs):
    t = torch_module(getattr(torch_ref, cls_name), *args, **kwargs)
    return t, flax_twin_of(t, getattr(fm, cls_name), *args, **kwargs)


def test_self_attention_matches_torch_with_padding_mask():
    t, f = pair("SelfAttention", D, H)
    (tq, jq), (tk, jk) = randn(B, T, D, seed=1), randn(B, S, D, seed=2)
    tm, jm = padding_mask([S, 7, 1], S)
    assert_close(f(jq, jk, jk, jm), t(tq, tk, tk, tm))


def test_self_attention_matches_torch_without_mask():
    t, f = pair("SelfAttention", D, H)
    (tq, jq), (tk, jk), (tv, jv) = randn(B, T, D, seed=1), randn(B, S, D, seed=2), randn(B, S, D, seed=3)
    assert_close(f(jq, jk, jv, None), t(tq, tk, tv, None))


@FFN_WIDTHS
def test_transformer_block_matches_torch(ffn):
    t, f = pair("TransformerBlock", D, H, 0.1, **ffn)
    (tq, jq), (tk, jk) = randn(B, T, D, seed=1), randn(B, S, D, seed=2)
    tm, jm = padding_mask([S, 4, 9], S)
    assert_close(f(jq, jk, jk, jm), t(tq, tk, tk, tm))


@FFN_WIDTHS
def test_decoder_block_matches_torch(ffn):
    t, f = pair("DecoderBlock", D, H, 0.1, **ffn)
    (tx, jx), (te, je) = randn(B, T, D, seed=1), randn(B, S, D, seed=2)
    tsm, jsm = padding_mask([S, 4, 9], S)
    ttm, jtm = causal_mask(B, T)
    assert_close(f(jx, je, je, jsm, jtm), t(tx, te, te, tsm, ttm))


@FFN_WIDTHS
def test_encoder_matches_torch(ffn):
    t, f = pair("Encoder", SRC_VOCAB, MAX_LEN, D, H, 2, 0.1, **ffn)
    ids = np.random.default_rng(1).integers(1, SRC_VOCAB, size=(B, S))
    ids[1, 6:] = 0
    tm, jm = padding_mask([S, 6, S], S)
    (ti,), (ji,) = as_inputs(ids)
    assert_close(f(ji, jm), t(ti, tm))


@FFN_WIDTHS
def test_decoder_matches_torch(ffn):
    t, f = pair("Decoder", TGT_VOCAB, MAX_LEN, D, H, 2, 0.1, **ffn)
    ids = np.random.default_rng(1).integers(0, TGT_VOCAB, size=(B, T))
    (te, je) = randn(B, S, D, seed=2)
    tsm, jsm = padding_mask([S, 6, 2], S)
    ttm, jtm = causal_mask(B, T)
    (ti,), (ji,) = as_inputs(ids)
    assert_close(f(ji, je, jsm, jtm), t(ti, te, tsm, ttm))


def test_scaled_dot_product_attention_matches_torch():
    # V is wider than Q and K (7 vs 6): attention does not require equal widths.
    (tq, jq), (tk, jk), (tv, jv) = randn(B, H, T, 6, seed=1), randn(B, H, S, 6, seed=2), randn(B, H, S, 7, seed=3)
    assert_close(fm.scaled_dot_product_attention(jq, jk, jv), torch_ref.scaled_dot_product_attention(tq, tk, tv))
    tm, jm = padding_mask([S, 3, 8], S)
    assert_close(
        fm.scaled_dot_product_attention(jq, jk, jv, jm), torch_ref.scaled_dot_product_attention(tq, tk, tv, tm)
    )


def test_multi_head_attention_matches_torch():
    t, f = pair("MultiHeadAttention", D, H)
    (tq, jq), (tk, jk) = randn(B, T, D, seed=1), randn(B, S, D, seed=2)
    assert_close(f(jq, jk, jk), t(tq, tk, tk))


def test_multi_head_attention_with_a_mask_matches_torch_hides_masked_keys_and_prints_nothing(capsys):
    # Seed slip 6: seed 002's attention prints every shape on every call and takes no mask; the
    # twins take one (mask=None after V) and print nothing.
    t, f = pair("MultiHeadAttention", D, H)
    (tq, jq), (tk, jk) = randn(B, T, D, seed=1), randn(B, S, D, seed=2)
    lengths = [S, 6, 2]
    tm, jm = padding_mask(lengths, S)
    got = f(jq, jk, jk, jm)
    assert_close(got, t(tq, tk, tk, tm))
    # Keys and values past each row's length changed: the masked outputs do not move.
    beyond = np.arange(S)[None, :, None] >= np.asarray(lengths)[:, None, None]
    (tn, jn) = randn(B, S, D, seed=3)
    tk2, jk2 = torch.where(torch.as_tensor(beyond), tn, tk), jnp.where(beyond, jn, jk)
    assert np.array_equal(np.asarray(f(jq, jk2, jk2, jm)), np.asarray(got))
    assert torch.equal(t(tq, tk2, tk2, tm), t(tq, tk, tk, tm))
    assert not np.allclose(np.asarray(f(jq, jk2, jk2)), np.asarray(f(jq, jk, jk)))  # unmasked, they would
    assert capsys.readouterr() == ("", "")


def test_per_head_self_attention_matches_torch():
    t, f = pair("PerHeadSelfAttention", D, H)
    (tq, jq), (tk, jk) = randn(B, T, D, seed=1), randn(B, S, D, seed=2)
    tm, jm = padding_mask([S, 5, 12], S)
    assert_close(f(jq, jk, jk, jm), t(tq, tk, tk, tm))


def test_per_head_projections_are_applied():
    # Seed slip 7: the seed never applies its per-head projections. Ours must: zeroing the
    # shared query projection makes every score 0, so every query row attends uniformly.
    t = torch_module(torch_ref.PerHeadSelfAttention, D, H)
    x, _ = randn(B, T, D, seed=1)
    before = t(x, x, x, None)
    with torch.no_grad():
        t.queries.weight.zero_()
    after = t(x, x, x, None)
    assert not torch.allclose(before, after)
    uniform = after[:, 0]  # with zero scores every query row gets the same output
    assert torch.allclose(after, uniform[:, None, :].expand_as(after), atol=1e-6)


def test_learned_positional_encoding_matches_torch():
    t, f = pair("LearnedPositionalEncoding", D, MAX_LEN)
    tx, jx = randn(B, T, D, seed=1)
    assert_close(f(jx), t(tx))


def test_multi_head_self_attention_matches_torch_output_and_weights():
    t, f = pair("MultiHeadSelfAttention", D, H)
    tx, jx = randn(B, T, D, seed=1)
    (f_out, f_w), (t_out, t_w) = f(jx), t(tx)
    assert f_w.shape == (B, H, T, T)
    assert_close(f_out, t_out)
    assert_close(f_w, t_w)


def test_feed_forward_matches_torch():
    t, f = pair("FeedForward", D, 37)
    tx, jx = randn(B, T, D, seed=1)
    assert_close(f(jx), t(tx))


def test_feed_forward_width_option_builds_f_wide_layers_in_both_twins():
    t, f = pair("TransformerBlock", D, H, 0.1, ffn_dim=F)
    assert tuple(t.fc[0].weight.shape) == (F, D) and tuple(t.fc[2].weight.shape) == (D, F)
    assert f.fc[0].kernel.shape == (D, F) and f.fc[2].kernel.shape == (F, D)


def test_transformer_with_ffn_dim_matches_torch(tiny_config):
    config = tiny_config.replace(ffn_dim=F)
    t, f = transformer_pair(config, seed=4)
    assert t.encoder.transformer_layers[1].fc[0].weight.shape == (F, D)  # F really reached the blocks
    (ts, tt), (js, jt) = as_inputs(*sample_batch(config, batch=B, seed=4, source_len=S, target_len=T))
    assert_close(f(js, jt), t(ts, tt))


def test_ffn_dim_equal_to_embed_size_is_the_seed_model(tiny_config):
    # ffn_dim=D builds exactly the default (None) model: same keys, shapes and outputs.
    torch.manual_seed(0)
    default = torch_ref.Transformer(**tiny_config.to_dict())
    torch.manual_seed(0)
    explicit = torch_ref.Transformer(**tiny_config.replace(ffn_dim=tiny_config.embed_size).to_dict())
    a, b = default.state_dict(), explicit.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    (ts, tt), _ = as_inputs(*sample_batch(tiny_config, batch=2, seed=0))
    with torch.no_grad():
        assert torch.equal(default.eval()(ts, tt), explicit.eval()(ts, tt))


def test_tiny_transformer_matches_torch(tiny_config):
    t, f = transformer_pair(tiny_config, seed=3)
    (ts, tt), (js, jt) = as_inputs(*sample_batch(tiny_config, batch=B, seed=3, source_len=S, target_len=T))
    assert_close(f(js, jt), t(ts, tt))


def test_seed_size_transformer_matches_torch():
    # The seed tutorial's own config (width 512, 8 heads, 6 + 6 layers) on padded inputs.
    # Measured max abs diff ~1e-6 on the logits; the policy's 1e-5 bounds it.
    config = fm.get_preset("seed")
    t, f = transformer_pair(config, seed=0)
    (ts, tt), (js, jt) = as_inputs(*sample_batch(config, batch=4, seed=0))
    assert_close(f(js, jt), t(ts, tt))


def test_seed_example_gives_the_seed_output_shape():
    # Seed 001's example: two sentences of 10 tokens, target shifted by one -> (2, 9, 8).
    source = np.array([[1, 2, 3, 4, 5, 6, 7, 2, 0, 0], [2, 4, 5, 6, 7, 1, 5, 3, 4, 0]])
    target = np.array([[1, 2, 3, 4, 5, 6, 7, 1, 0, 0], [2, 4, 5, 6, 7, 1, 2, 3, 4, 0]])[:, :-1]
    t, f = transformer_pair(fm.get_preset("seed"), seed=1)
    (ts, tt), (js, jt) = as_inputs(source, target)
    t_out, f_out = t(ts, tt), f(js, jt)
    assert tuple(t_out.shape) == f_out.shape == (2, 9, 8)
    assert_close(f_out, t_out)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_eval_mode_is_deterministic_and_train_mode_is_not(tiny_config, dropout):
    config = tiny_config.replace(dropout=dropout)
    f = fm.Transformer.from_config(config, rngs=nnx.Rngs(0))
    (_, _), (js, jt) = as_inputs(*sample_batch(config, batch=B, seed=0))
    f.eval()
    np.testing.assert_array_equal(f(js, jt), f(js, jt))
    f.train()
    differs = not np.array_equal(np.asarray(f(js, jt)), np.asarray(f(js, jt)))
    assert differs == (dropout > 0)  # fresh dropout masks each call, only when there is dropout


def test_on_a_cpu_the_default_matmul_precision_gives_the_highest_ones_bits():
    # conftest runs the CPU suite at JAX's default precision (the commands') and an accelerator
    # at the highest: the same parity only if XLA:CPU computes float32 dots alike at both.
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("on an accelerator the default precision may round a product's inputs (TF32, bfloat16 passes)")
    _, f = pair("SelfAttention", D, H)
    (_, jq), (_, jk) = randn(B, T, D, seed=1), randn(B, S, D, seed=2)
    _, jm = padding_mask([S, 7, 1], S)
    loss = lambda m, q, k: (m(q, k, k, jm) ** 2).sum()  # noqa: E731 - forward and backward dots
    got = {}
    for precision in ("default", "highest"):
        with jax.default_matmul_precision(precision):
            got[precision] = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1, 2)))(f, jq, jk)
    leaves = [jax.tree.leaves(got[p]) for p in ("default", "highest")]
    assert len(leaves[0]) == len(leaves[1]) > 3
    for a, b in zip(*leaves):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
