"""SelfAttention through jax.nn.dot_product_attention computes what the seed's einsums compute.

``set_attention_impl(model, "xla")`` swaps the written-out attention for JAX's function (the
entry point of cuDNN's fused attention on GPUs, ``"cudnn"``). It must change nothing a user
can see: the same logits, gradients and decoded tokens, padding and causality included.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.model.attention import ATTENTION_IMPLS, set_attention_impl
from flaxformer_mini.decode.search import greedy_decode

ATOL = 1e-5  # DESIGN.md's parity tolerance: the two paths round differently (scale, then mask)
# One layer a side holds every kind of attention (the encoder's, the decoder's causal one and the
# cross-attention); a second layer doubles each compilation (tests/helpers.py's TINY_RUN).
CONFIG = fm.get_preset("tiny").replace(num_layers=1)


def _models(config):
    ref = fm.Transformer.from_config(config, rngs=nnx.Rngs(0))
    other = fm.Transformer.from_config(config, rngs=nnx.Rngs(0))
    for m in (ref, other):
        m.eval()
    return ref, set_attention_impl(other, "xla")


def _padded_batch(config, B=3, S=7, T=6):
    # Drawn by numpy: jax.random.randint would compile a program for each shape.
    rng = np.random.default_rng(1)
    source = rng.integers(4, config.source_vocab_size, (B, S), dtype=np.int32)
    source[0, 4:], source[1, 1:] = 0, 0  # padding, one row almost all padding
    target = rng.integers(4, config.target_vocab_size, (B, T), dtype=np.int32)
    return jnp.asarray(source), jnp.asarray(target)


# Each model's logits and gradients in one compiled program (the logits as the loss's aux), read
# by the logits test and the gradients test: running them op by op compiles every primitive of
# every shape apart (alone, AMD EPYC family 25: the gradient test 4.7 s jitted, 9.4 s op by op;
# the logits 3.3 s and 5.2 s), and a forward of its own would be a second program per model.
@nnx.jit
def _logits_and_gradients(model, source, target):
    def loss(model):
        logits = model(source, target)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 5]), logits

    (_, logits), grads = nnx.value_and_grad(loss, has_aux=True)(model)
    return logits, grads


@pytest.fixture(scope="module")
def computed():
    """{"einsum": (logits, gradients), "xla": (logits, gradients)}: the same weights and batch."""
    ref, other = _models(CONFIG)
    source, target = _padded_batch(CONFIG)
    return {"einsum": _logits_and_gradients(ref, source, target), "xla": _logits_and_gradients(other, source, target)}


def test_xla_attention_gives_the_einsum_logits(computed):
    np.testing.assert_allclose(computed["xla"][0], computed["einsum"][0], atol=ATOL, rtol=0)


def test_xla_attention_gives_the_einsum_gradients(computed):
    g_ref, g_other = computed["einsum"][1], computed["xla"][1]
    flat_ref, flat_other = nnx.to_flat_state(g_ref), nnx.to_flat_state(g_other)
    assert [p for p, _ in flat_ref] == [p for p, _ in flat_other]
    for (path, a), (_, b) in zip(flat_ref, flat_other):
        np.testing.assert_allclose(b[...], a[...], atol=ATOL, rtol=0, err_msg="/".join(map(str, path)))


def test_xla_attention_decodes_the_same_tokens():
    ref, other = _models(CONFIG)
    source, _ = _padded_batch(CONFIG)
    np.testing.assert_array_equal(greedy_decode(other, source, 6), greedy_decode(ref, source, 6))


def test_a_fully_masked_row_is_uniform_in_both_paths():
    attn = fm.SelfAttention(8, 2, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 3, 8))
    mask = jnp.array([[1, 1, 0], [0, 0, 0]])[:, None, None, :]  # row 1: every key masked
    ref = attn(x, x, x, mask)
    # Uniform weights over the three keys: every query of row 1 reads the mean of their values.
    uniform = np.broadcast_to(np.asarray(attn.fc(attn.W_v(x[1]).mean(axis=0))), (3, 8))
    np.testing.assert_allclose(ref[1], uniform, atol=ATOL, rtol=0)
    set_attention_impl(attn, "xla")
    out = attn(x, x, x, mask)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(out, ref, atol=ATOL, rtol=0)


def test_the_mask_given_to_cudnn_has_whole_sequence_axes_and_keeps_the_same_keys():
    # cuDNN takes a mask as a bias of shape (B|1, H|1, T, S) (a (B, 1, 1, S) padding mask
    # fails jax's check_layout on an H200); broadcast, it must keep exactly the same keys:
    # XLA's attention gives the same output with it as with the mask as the model makes it.
    from flaxformer_mini.model.attention import _mask_for

    B, T, S, H, K = 3, 5, 7, 2, 4
    keep = np.arange(S)[None, :] < np.array([7, 3, 1])[:, None]  # (B, S)
    padding = jnp.asarray(keep[:, None, None, :])  # (B, 1, 1, S)
    assert _mask_for("xla", padding, T, S).shape == (B, 1, 1, S)
    whole = _mask_for("cudnn", padding, T, S)
    assert whole.shape == (B, 1, T, S) and whole.dtype == jnp.bool_
    np.testing.assert_array_equal(whole, np.broadcast_to(keep[:, None, None, :], (B, 1, T, S)))
    causal = _mask_for("cudnn", jnp.tril(jnp.ones((T, T), bool)), T, T)  # a rank-2 mask, as torch allows
    assert causal.shape == (1, 1, T, T)

    q, k, v = jax.random.normal(jax.random.key(0), (3, B, S, H, K))
    attend = lambda m: jax.nn.dot_product_attention(q[:, :T], k, v, mask=m, implementation="xla")
    np.testing.assert_array_equal(attend(whole), attend(padding))


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the error given where there is no GPU")
def test_cudnn_attention_without_a_gpu_is_refused_by_name():
    _, other = _models(CONFIG)
    set_attention_impl(other, "cudnn")
    source, target = _padded_batch(CONFIG)
    with pytest.raises(ValueError, match="attention_impl='cudnn' needs an NVIDIA GPU; JAX's backend here is 'cpu'"):
        other(source, target)


def test_unknown_attention_impls_and_models_without_attention_are_refused():
    model = fm.Transformer.from_config(CONFIG, rngs=nnx.Rngs(0))  # the file's model: its init is compiled
    with pytest.raises(ValueError, match="unknown attention_impl 'flash'; choose one of einsum, xla, cudnn"):
        set_attention_impl(model, "flash")
    assert {a.attention_impl for _, a in nnx.iter_modules(model) if isinstance(a, fm.SelfAttention)} == {"einsum"}
    with pytest.raises(ValueError, match="FeedForward has no SelfAttention"):
        set_attention_impl(fm.FeedForward(rngs=nnx.Rngs(0)), "xla")
    assert ATTENTION_IMPLS == ("einsum", "xla", "cudnn")


@pytest.mark.parametrize("impl", ["einsum", "xla"])
def test_bfloat16_attention_keeps_its_scores_in_float32(impl):
    # One query over two keys whose scores, 256 and 257 before the 1/sqrt(K) scale, are exact
    # in float32 but not both in bfloat16 (8 significant bits: 257 rounds to 256). Kept in
    # float32, the second key's weight is sigmoid(1/sqrt(2)) = 0.670; rounded, it would be 0.5.
    attn = fm.SelfAttention(2, 1, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    for layer in (attn.W_q, attn.fc):  # identity projections: the scores are q . k
        layer.kernel.set_value(jnp.eye(2))
        layer.bias.set_value(jnp.zeros(2))
    set_attention_impl(attn, impl)
    query = jnp.array([[[16.0, 1.0]]], jnp.bfloat16)  # (B 1, T 1, D 2)
    k = jnp.array([[[[16.0, 0.0], [16.0, 1.0]]]], jnp.bfloat16)  # (B 1, H 1, S 2, K 2), head-first
    v = jnp.array([[[[0.0, 0.0], [1.0, 1.0]]]], jnp.bfloat16)
    out = attn.attend(query, k, v, None)
    assert out.dtype == jnp.bfloat16
    expected = 1 / (1 + np.exp(-1 / np.sqrt(2)))
    # The output is bfloat16: within one of its steps at 0.67 (2**-8) of 0.670, and far from 0.5.
    np.testing.assert_allclose(np.asarray(out, np.float32), np.full((1, 1, 2), expected), atol=2**-8, rtol=0)
