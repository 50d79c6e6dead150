"""``jax.jit`` of each twin computes what the eager twin computes.

Eager JAX runs op by op; under jit XLA fuses and may reorder float operations, so the two
can differ in the last bits. 1e-6 (one tenth of the parity tolerance) bounds that.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import flaxformer_mini as fm
from parity import as_inputs, sample_batch

JIT_ATOL = 1e-6
B, S, T, D, H = 3, 13, 11, 30, 5


def rand(*shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def jit_apply(model, *args):
    """Compile ``model(*args)`` as a pure function of the model's state (split/merge)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def apply(state, *args):
        return nnx.merge(graphdef, state)(*args)

    return apply(state, *args)


def build(cls, *args, **kwargs):
    m = cls(*args, **kwargs, rngs=nnx.Rngs(0))
    m.eval()
    return m


MASK = jnp.asarray(np.arange(S)[None, None, None, :] < np.array([S, 6, 1])[:, None, None, None])
CAUSAL = jnp.asarray(np.tril(np.ones((B, 1, T, T), bool)))

CASES = {
    "SelfAttention": (lambda: build(fm.SelfAttention, D, H), lambda: (rand(B, T, D), rand(B, S, D, seed=1), rand(B, S, D, seed=1), MASK)),
    "TransformerBlock": (lambda: build(fm.TransformerBlock, D, H, 0.1), lambda: (rand(B, T, D), rand(B, S, D, seed=1), rand(B, S, D, seed=1), MASK)),
    "DecoderBlock": (lambda: build(fm.DecoderBlock, D, H, 0.1), lambda: (rand(B, T, D), rand(B, S, D, seed=1), rand(B, S, D, seed=1), MASK, CAUSAL)),
    "MultiHeadAttention": (lambda: build(fm.MultiHeadAttention, D, H), lambda: (rand(B, T, D), rand(B, S, D, seed=1), rand(B, S, D, seed=1))),
    "PerHeadSelfAttention": (lambda: build(fm.PerHeadSelfAttention, D, H), lambda: (rand(B, T, D), rand(B, S, D, seed=1), rand(B, S, D, seed=1), MASK)),
    "MultiHeadSelfAttention": (lambda: build(fm.MultiHeadSelfAttention, D, H), lambda: (rand(B, T, D),)),
    "LearnedPositionalEncoding": (lambda: build(fm.LearnedPositionalEncoding, D, 17), lambda: (rand(B, T, D),)),
    "FeedForward": (lambda: build(fm.FeedForward, D, 37), lambda: (rand(B, T, D),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_of_module_equals_eager(name):
    make_model, make_args = CASES[name]
    model, args = make_model(), make_args()
    eager, jitted = model(*args), jit_apply(model, *args)
    chex.assert_trees_all_close(jitted, eager, atol=JIT_ATOL, rtol=0)


def test_jit_of_transformer_equals_eager(tiny_config):
    model = build(fm.Transformer, **tiny_config.to_dict())
    _, (src, tgt) = as_inputs(*sample_batch(tiny_config, batch=B, seed=2, source_len=S, target_len=T))
    np.testing.assert_allclose(np.asarray(jit_apply(model, src, tgt)), np.asarray(model(src, tgt)), atol=JIT_ATOL, rtol=0)


def test_jit_of_encoder_and_decoder_equals_eager(tiny_config):
    c = tiny_config
    enc = build(fm.Encoder, c.source_vocab_size, c.max_len, c.embed_size, c.heads, c.num_layers, c.dropout)
    dec = build(fm.Decoder, c.target_vocab_size, c.max_len, c.embed_size, c.heads, c.num_layers, c.dropout)
    _, (src, tgt) = as_inputs(*sample_batch(c, batch=B, seed=2, source_len=S, target_len=T))
    mask = (src != 0)[:, None, None, :]
    enc_out = enc(src, mask)
    np.testing.assert_allclose(np.asarray(jit_apply(enc, src, mask)), np.asarray(enc_out), atol=JIT_ATOL, rtol=0)
    np.testing.assert_allclose(
        np.asarray(jit_apply(dec, tgt, enc_out, mask, CAUSAL)), np.asarray(dec(tgt, enc_out, mask, CAUSAL)),
        atol=JIT_ATOL, rtol=0,
    )


def test_static_input_checks_still_raise_under_jit(tiny_config):
    # Under jit the ids are tracers, so only shape and dtype can be checked; those still
    # raise at trace time, before anything runs.
    model = build(fm.Transformer, **tiny_config.to_dict())
    too_long = jnp.ones((2, tiny_config.max_len + 1), jnp.int32)
    with pytest.raises(ValueError, match="exceeds max_len"):
        jit_apply(model, too_long, jnp.ones((2, 3), jnp.int32))
    with pytest.raises(TypeError, match="integers"):
        jit_apply(model, jnp.ones((2, 3), jnp.float32), jnp.ones((2, 3), jnp.int32))
