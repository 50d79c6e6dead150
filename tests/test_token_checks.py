"""Where the token checks run (``flaxformer_mini/model/token_checks.py``'s docstring says it in words).

- Eager: one forward checks each input once, at the Transformer's boundary; the Encoder and
  Decoder still check when a user calls them directly. The same in both twins.
- Plain ``jax.jit``: values are not checked (documented misuse: NaN, or another token's
  logits), and the traced check is not even traced: the train, eval and decoding steps'
  jaxprs carry no effect, so JAX dispatches them on its C++ fast path (an ErrorEffect would
  send every call through Python: ``python -m tools.dispatch``). Likewise under
  ``torch.compile``: the value check is skipped, so the model is one graph, not three.
- ``fm.checked(fn)``: an id equal to the vocabulary size or negative raises on the host
  after the compiled call, naming the input, the id and the vocabulary size; valid ids give
  the logits of the unchecked path. ``checkify.checkify`` applied by hand reports the same
  inside ``fm.traced_checks()``.
"""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from jax.experimental import checkify

import flaxformer_mini as fm
import flaxformer_mini.model.transformer
from flaxformer_mini.decode import search as decoding
from flaxformer_mini.data import Batch
from flaxformer_mini.train.accumulation import zero_gradient_sums
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer
import torch_ref
import torch_ref.model
from parity import sample_batch

TINY = fm.get_preset("tiny")  # source V 23, target V 19, max_len 17, D 30, H 5
# One layer a side where a program is traced or compiled: the ids are checked at the embedding
# boundaries, before any layer, so a second layer is only more to trace and compile. The
# eager twins keep the preset's two.
ONE_LAYER = TINY.replace(num_layers=1)
B, S, T = 2, 5, 4  # distinct, so a swapped axis shows


@pytest.fixture(scope="module")
def flax_model():
    model = fm.Transformer.from_config(ONE_LAYER, rngs=nnx.Rngs(0))
    model.eval()
    return model


@pytest.fixture(scope="module")
def batch():
    return sample_batch(TINY, batch=B, seed=1, source_len=S, target_len=T)


def counting(monkeypatch, module):
    """Replace ``module.check_tokens`` with a wrapper that counts calls by input name."""
    counts = collections.Counter()
    original = module.check_tokens

    def spy(tokens, vocab_size, max_len, name="input"):
        counts[name] += 1
        return original(tokens, vocab_size, max_len, name)

    monkeypatch.setattr(module, "check_tokens", spy)
    return counts


# --- eager: once per call, at the boundary ----------------------------------------------------


def _flax_twin(batch):
    model = fm.Transformer.from_config(TINY, rngs=nnx.Rngs(0))
    model.eval()
    return flaxformer_mini.model.transformer, model, tuple(map(jnp.asarray, batch))


def _torch_twin(batch):
    return torch_ref.model, torch_ref.Transformer(**TINY.to_dict()).eval(), tuple(map(torch.from_numpy, batch))


@pytest.mark.parametrize("make_twin", [_flax_twin, _torch_twin], ids=["flax", "torch"])
def test_one_eager_forward_checks_each_input_once(monkeypatch, batch, make_twin):
    module, model, (source, target) = make_twin(batch)
    counts = counting(monkeypatch, module)
    model(source, target)
    assert counts == {"source input": 1, "target input": 1}
    counts.clear()
    model.encode(source)
    assert counts == {"source input": 1}


@pytest.mark.parametrize("bad", [TINY.source_vocab_size, -1], ids=["id_equal_to_vocab", "negative_id"])
def test_encoder_and_decoder_called_directly_still_refuse_out_of_range_ids(bad):
    encoder = fm.Encoder(TINY.source_vocab_size, TINY.max_len, 30, 5, 1, 0.0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=rf"source input: token id {bad} is outside the vocabulary \[0, 23\)"):
        encoder(jnp.array([[1, bad]]), None)
    decoder = fm.Decoder(TINY.target_vocab_size, TINY.max_len, 30, 5, 1, 0.0, rngs=nnx.Rngs(0))
    bad_target = TINY.target_vocab_size if bad >= 0 else bad
    with pytest.raises(ValueError, match=rf"target input: token id {bad_target} is outside the vocabulary \[0, 19\)"):
        decoder(jnp.array([[1, bad_target]]), jnp.zeros((1, 3, 30)), None, None)
    torch_encoder = torch_ref.Encoder(TINY.source_vocab_size, TINY.max_len, 30, 5, 1, 0.0)
    with pytest.raises(ValueError, match=rf"source input: token id {bad} is outside"):
        torch_encoder(torch.tensor([[1, bad]]), None)


# --- plain jax.jit: no value check, no effect ------------------------------------------------


def pure_apply(model):
    graphdef, state = nnx.split(model)

    def apply(state, source, target):
        return nnx.merge(graphdef, state)(source, target)

    return apply, state


@pytest.fixture(scope="module")
def compiled(flax_model):
    """``(jax.jit(apply), fm.checked(apply), state)`` of ``pure_apply(flax_model)``, made once:
    every call of the batch's shapes runs one compiled program of each (each ``fm.checked``
    jits anew), and the checked one judges each call's values."""
    apply, state = pure_apply(flax_model)
    return jax.jit(apply), fm.checked(apply), state


def test_plain_jit_does_not_check_values_out_of_range_ids_give_nan_or_another_tokens_logits(compiled, batch):
    # The documented misuse: without fm.checked (or check_tokens on the host first), JAX's
    # gather fills an id past the table with NaN and wraps a negative id to V + id.
    jitted, _, state = compiled
    source, target = map(jnp.asarray, batch)
    V = TINY.source_vocab_size
    past_end = jitted(state, source.at[1, 1].set(V), target)  # no exception
    assert bool(jnp.isnan(past_end[1]).all()) and bool(jnp.isfinite(past_end[0]).all())
    wrapped, last = jitted(state, source.at[1, 1].set(-1), target), jitted(state, source.at[1, 1].set(V - 1), target)
    np.testing.assert_array_equal(np.asarray(wrapped), np.asarray(last))


def _compiled_hlo(fn, *args):
    return fn.lower(*args).compile().as_text()


def double_checked():
    """A fresh function each call: JAX caches traces per function, and the check is decided
    when the function is traced, so a function traced before would keep its first trace."""
    def double(tokens):
        fm.check_tokens(tokens, vocab_size=5, max_len=7)
        return tokens * 2

    return double


def test_traced_check_is_opt_in_plain_jit_gets_no_effect_and_no_work():
    tokens = jnp.array([[1, 4, 2]])
    assert jax.make_jaxpr(double_checked())(tokens).effects == set()
    assert not re.search(r"\breduce", _compiled_hlo(jax.jit(double_checked()), tokens))
    with fm.traced_checks():  # guard: inside the block the check is traced, with its reductions
        assert jax.make_jaxpr(double_checked())(tokens).effects
        assert re.search(r"\breduce", _compiled_hlo(jax.jit(checkify.checkify(double_checked())), tokens))
    assert jax.make_jaxpr(double_checked())(tokens).effects == set()  # and the block's end restores it


def test_train_eval_and_decoding_steps_carry_no_jaxpr_effects(flax_model, batch):
    # Each is only traced (no compile). An effect here would put every call of the step on
    # JAX's Python dispatch path; with the traced check it would be an ErrorEffect.
    source, target = map(jnp.asarray, batch)
    data = Batch(source, target, target)
    trainer = Trainer(flax_model, TrainConfig())
    state = trainer.init_state()
    graphdef, params = nnx.split(flax_model)
    traced = {
        "train_step": trainer.train_step.trace(state, data),
        "add_micro_batch": trainer.add_micro_batch.trace(state, zero_gradient_sums(state), data),
        "apply_gradient_sums": trainer.apply_gradient_sums.trace(state, zero_gradient_sums(state)),
        "eval_step": trainer.eval_step.trace(state, data),
        "greedy": decoding._token_by_token.trace(graphdef, params, source, 3, ("greedy",), jax.random.key(0),
                                                 jnp.float32(1.0)),
        "sample": decoding._token_by_token.trace(graphdef, params, source, 3, ("sample", 2), jax.random.key(0),
                                                 jnp.float32(0.7)),
        "beam": decoding._beam.trace(graphdef, params, source, 3, 2, 0.6),
        "greedy_uncached": decoding._greedy_uncached.trace(graphdef, params, source, 3),
    }
    assert {name: t.jaxpr.effects for name, t in traced.items()} == {name: set() for name in traced}


def test_checkify_by_hand_reports_a_bad_id_inside_traced_checks():
    with fm.traced_checks():
        err, _ = jax.jit(checkify.checkify(double_checked()))(jnp.array([[1, 5, 2]]))
    with pytest.raises(ValueError, match=r"input: token id 5 is outside the vocabulary \[0, 5\)"):
        err.throw()


# --- the checked path: fm.checked ---------------------------------------------------------------


@pytest.mark.parametrize("side, position, bad, vocab", [
    ("source", (1, 1), TINY.source_vocab_size, TINY.source_vocab_size),
    ("source", (1, 3), -2, TINY.source_vocab_size),
    ("target", (0, 2), TINY.target_vocab_size, TINY.target_vocab_size),
    ("target", (1, 1), -1, TINY.target_vocab_size),
], ids=["source_id_equal_to_vocab", "source_negative_id", "target_id_equal_to_vocab", "target_negative_id"])
def test_checked_path_raises_naming_input_id_and_vocabulary(compiled, batch, side, position, bad, vocab):
    _, checked, state = compiled
    source, target = map(jnp.asarray, batch)
    if side == "source":
        source = source.at[position].set(bad)
    else:
        target = target.at[position].set(bad)
    message = rf"{side} input: token id {bad} is outside the vocabulary \[0, {vocab}\)"
    with pytest.raises(ValueError, match=message):  # checkify.JaxRuntimeError is a ValueError
        checked(state, source, target)


def test_checked_path_with_valid_ids_gives_the_unchecked_logits(compiled, batch):
    jitted, checked, state = compiled
    source, target = map(jnp.asarray, batch)
    np.testing.assert_array_equal(np.asarray(checked(state, source, target)),
                                  np.asarray(jitted(state, source, target)))


def test_checked_path_still_raises_static_errors_at_trace_time(flax_model):
    apply, state = pure_apply(flax_model)
    with pytest.raises(ValueError, match="source input: length 18 exceeds max_len=17"):
        fm.checked(apply)(state, jnp.ones((1, 18), jnp.int32), jnp.ones((1, 3), jnp.int32))


def test_torch_compile_traces_the_whole_model_as_one_graph_without_the_value_check(batch):
    # The eager value check reads ids back to the host; under torch.compile it would break
    # the graph (3 graphs, each break a host sync). Like the Flax twin under jit, it is skipped.
    model = torch_ref.Transformer(**ONE_LAYER.to_dict()).eval()
    source, target = map(torch.from_numpy, batch)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(source, target)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    with pytest.raises(ValueError, match="outside the vocabulary"):  # eager still checks
        model(source, torch.full_like(target, TINY.target_vocab_size))
