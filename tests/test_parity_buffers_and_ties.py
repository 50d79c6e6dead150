"""Torch buffers and tied weights, through the public conversion API, on a small model that is
not ours: a float buffer (``pos``), an int64 buffer (``position_ids``) and an output head tied
to the embedding (``lm_head.weight = tok.weight``).

The Flax twin holds each buffer as its own ``nnx.Variable`` type (not an ``nnx.Param``: a torch
buffer gets no gradient), ``position_ids`` as int32 (JAX's default integer without x64), and
the head as ``embed.attend``: one variable where torch's state dict has two keys. The torch
embedding is called ``tok``, the Flax one ``embed``, so ties (in the user's torch names) and a
rename map work together.
"""

import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import parity
from parity import ConversionError, Rule, flax_to_torch, torch_key_shapes, torch_to_flax

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

V, D, L = 11, 6, 7  # vocabulary, width, positions: distinct, so a swapped axis changes a shape
RENAME = {"tok.weight": "embed.weight"}
TIED = {"lm_head.weight": "tok.weight"}  # the user's names: the copy, then the key it is tied to
IDS = np.array([[1, 4, 2, 0, 9], [7, 3, 10, 5, 5]])


class TorchLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(V, D)
        self.register_buffer("pos", torch.randn(L, D) * 0.1)
        self.register_buffer("position_ids", torch.arange(L).flip(0))  # int64; not the identity
        self.norm = torch.nn.LayerNorm(D)
        self.lm_head = torch.nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.tok.weight  # tied: one Parameter, two state-dict keys

    def forward(self, ids):
        x = self.tok(ids) + self.pos[self.position_ids[: ids.shape[1]]]
        return self.lm_head(self.norm(x))


class Buffer(nnx.Variable):
    """torch's register_buffer: model state that no optimizer trains."""


class FlaxLM(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(V, D, rngs=rngs)
        self.pos = Buffer(jnp.zeros((L, D)))
        self.position_ids = Buffer(jnp.zeros((L,), jnp.int32))
        self.norm = nnx.LayerNorm(D, epsilon=1e-5, rngs=rngs)  # torch's eps; Flax's default is 1e-6

    def __call__(self, ids):
        x = self.embed(ids) + self.pos.get_value()[self.position_ids.get_value()[: ids.shape[1]]][None]
        return self.embed.attend(self.norm(x))  # the head, tied: x @ embedding.T


RULES = dict(parity.RULES)
parity.register_rule(FlaxLM, Rule("pos", "pos"), Rule("position_ids", "position_ids"), table=RULES)


def convert_in(state_dict, model=None, **kw):
    return torch_to_flax(state_dict, model or FlaxLM(nnx.Rngs(1)), rename=RENAME, rules=RULES, **kw)


def flax_state(model):
    return {"/".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


def refused_leaving_it_as_it_was(model, convert):
    """The ConversionError ``convert()`` raises; ``model`` must be as it was: nothing half-loaded."""
    before = flax_state(model)
    with pytest.raises(ConversionError) as info:
        convert()
    after = flax_state(model)
    assert all(np.array_equal(after[k], v) for k, v in before.items())
    return info.value


@pytest.fixture
def torch_model():
    torch.manual_seed(0)
    return TorchLM().eval()


def test_buffers_and_a_tied_head_round_trip_bit_exact_and_load_strictly(torch_model):
    state = torch_model.state_dict()
    flax_model = convert_in(state, tied=TIED)
    assert isinstance(flax_model.pos, Buffer) and "pos" not in nnx.state(flax_model, nnx.Param)  # not trainable
    np.testing.assert_array_equal(flax_model.position_ids.get_value(), [6, 5, 4, 3, 2, 1, 0])
    assert flax_model.position_ids.get_value().dtype == jnp.int32

    back = flax_to_torch(flax_model, rename=RENAME, rules=RULES, tied=TIED)
    assert set(back) == set(state)
    assert back["position_ids"].dtype == torch.int32  # the Flax variable's dtype; load_state_dict casts it
    # The copy is a tensor of its own, so safetensors' save_file (which refuses shared memory) takes it.
    assert torch.equal(back["lm_head.weight"], back["tok.weight"])
    assert back["lm_head.weight"].data_ptr() != back["tok.weight"].data_ptr()

    torch.manual_seed(1)
    fresh = TorchLM()
    fresh.load_state_dict(back, strict=True)
    for key, value in state.items():
        got = fresh.state_dict()[key]
        assert got.dtype == value.dtype and torch.equal(got, value), key
    assert fresh.lm_head.weight is fresh.tok.weight  # still tied after loading


def test_forward_outputs_agree_within_1e_5(torch_model):
    flax_model = convert_in(torch_model.state_dict(), tied=TIED)
    with torch.no_grad():
        want = torch_model(torch.as_tensor(IDS)).cpu().numpy()
    got = np.asarray(flax_model(jnp.asarray(IDS)))
    assert got.shape == want.shape == (2, 5, V)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_torch_key_shapes_with_rename_and_ties_are_the_torch_state_dicts(torch_model):
    want = {key: tuple(value.shape) for key, value in torch_model.state_dict().items()}
    assert torch_key_shapes(FlaxLM(nnx.Rngs(0)), rules=RULES, rename=RENAME, tied=TIED) == want
    # Without them, the plan's own names: the Flax model's, no copy.
    assert set(torch_key_shapes(FlaxLM(nnx.Rngs(0)), rules=RULES)) == {"embed.weight", "pos", "position_ids",
                                                                       "norm.weight", "norm.bias"}


def test_a_checkpoint_whose_tied_weights_differ_is_refused_naming_both_keys(torch_model):
    state = dict(torch_model.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"].clone()
    state["lm_head.weight"][3, 2] += 1e-3
    model = FlaxLM(nnx.Rngs(1))
    error = refused_leaving_it_as_it_was(model, lambda: convert_in(state, model, tied=TIED))
    assert list(error.invalid) == ["lm_head.weight"]
    assert ("invalid value for 'lm_head.weight': tied to 'tok.weight', but 1 of 66 values differ "
            "(max abs difference 1.000e-03): a checkpoint whose tied weights differ is not tied") in str(error)


@pytest.mark.parametrize("tied, why", [
    ({"lm_head.weight": "tok.weights"},
     "'lm_head.weight' is tied to 'tok.weights', which is not a key of FlaxLM (did you mean 'tok.weight'?)"),
    ({"tok.weight": "lm_head.weight"},  # the wrong way round: the kept key is the copy
     "'tok.weight' is a key of FlaxLM (it has a Flax variable of its own), not a tied copy"),
], ids=["unknown-source", "reversed"])
def test_a_tie_that_does_not_fit_the_model_is_refused_naming_the_key(torch_model, tied, why):
    model = FlaxLM(nnx.Rngs(0))
    for convert in (lambda: convert_in(torch_model.state_dict(), model, tied=tied),
                    lambda: flax_to_torch(model, rename=RENAME, rules=RULES, tied=tied),
                    lambda: torch_key_shapes(model, rules=RULES, rename=RENAME, tied=tied)):
        with pytest.raises(ConversionError, match=re.escape(why)):
            convert()


@pytest.mark.parametrize("tied, why", [
    ({"a.weight": "a.weight"}, "'a.weight' is tied to itself"),
    ({"a.weight": "b.weight", "b.weight": "c.weight"},
     "'a.weight' is tied to 'b.weight', itself a copy tied to 'c.weight': tie each copy to the key the model keeps"),
    ({"a.weight": None}, "'a.weight': None is not a pair of torch keys"),
], ids=["itself", "chain", "not-a-key"])
def test_a_tie_table_that_is_not_copy_to_source_is_refused(tied, why):
    with pytest.raises(ConversionError, match=re.escape(why)):
        parity.Tied(tied)


@pytest.mark.parametrize("drop", ["lm_head.weight", "tok.weight"])
def test_a_checkpoint_holding_one_name_of_a_tie_loads_from_it(torch_model, drop):
    # safetensors' save_model keeps one name of tensors that share memory.
    state = {k: v for k, v in torch_model.state_dict().items() if k != drop}
    flax_model = convert_in(state, tied=TIED)
    np.testing.assert_array_equal(flax_model.embed.embedding.get_value(), torch_model.tok.weight.detach().cpu().numpy())


@pytest.mark.parametrize("key, value, why", [
    ("position_ids", torch.arange(L, dtype=torch.float32), "dtype float32 is not an integer dtype (the model's variable is int32)"),
    ("position_ids", torch.ones(L, dtype=torch.bool), "dtype bool is not an integer dtype (the model's variable is int32)"),
    ("position_ids", torch.full((L,), 2**40), f"values {2**40}..{2**40} do not fit the model's int32 variable"),
    ("pos", torch.zeros(L, D, dtype=torch.int64), "dtype int64 is not a floating-point dtype"),  # as for any float weight
], ids=["int-buffer-given-float", "int-buffer-given-bool", "int-buffer-overflow", "float-buffer-given-int"])
def test_a_buffer_given_the_wrong_kind_of_value_is_refused_by_key(torch_model, key, value, why):
    state = dict(torch_model.state_dict())
    state[key] = value
    with pytest.raises(ConversionError) as info:
        convert_in(state, tied=TIED)
    assert info.value.invalid == {key: why}
    assert f"invalid value for {key!r}: {why}" in str(info.value)


def test_an_int32_buffer_loads_from_any_integer_dtype_that_fits(torch_model):
    state = dict(torch_model.state_dict())
    state["position_ids"] = state["position_ids"].to(torch.int16)
    flax_model = convert_in(state, tied=TIED)
    np.testing.assert_array_equal(flax_model.position_ids.get_value(), np.arange(L)[::-1])


def test_a_buffer_no_rule_covers_is_named_with_its_variable_type(torch_model):
    with pytest.raises(ConversionError) as info:
        torch_to_flax(torch_model.state_dict(), FlaxLM(nnx.Rngs(0)), rename=RENAME, tied=TIED)
    message = str(info.value)
    assert "no conversion rule covers these variables of FlaxLM: pos (a FlaxLM), position_ids (a FlaxLM)" in message
    assert message.endswith("their variable types: Buffer (pos, position_ids); a torch buffer (register_buffer) "
                            "needs a rule on the module that holds it (parity.Rule('pos', 'pos')), and one registered "
                            "with persistent=False is in no state dict: compute it in __call__ rather than hold it as "
                            "an array")


def test_an_array_a_port_holds_for_a_non_persistent_torch_buffer_is_refused_saying_to_compute_it():
    # torch's register_buffer(..., persistent=False) (rotary inv_freq) is in no state dict; a
    # port holding it as an array (NNX state, as any array attribute) has nothing to load it from.
    class Port(nnx.Module):
        def __init__(self):
            self.fc = nnx.Linear(D, D, rngs=nnx.Rngs(0))
            self.inv_freq = jnp.arange(D, dtype=jnp.float32)

    torch_model = torch.nn.Linear(D, D)
    state = {f"fc.{k}": v for k, v in torch_model.state_dict().items()}
    with pytest.raises(ConversionError, match=r"their variable types: ArrayImpl \(inv_freq\); a torch buffer "
                                              r"\(register_buffer\) needs a rule on the module that holds it "
                                              r"\(parity.Rule\('inv_freq', 'inv_freq'\)\), and one registered with "
                                              r"persistent=False is in no state dict: compute it in __call__"):
        torch_to_flax(state, Port())


class _Tempered(nnx.Module):  # its torch twin also keeps a float buffer "temperature", which the port drops
    def __init__(self, rngs):
        self.proj = nnx.Linear(3, 5, rngs=rngs)


def test_a_rule_that_drops_a_key_needs_a_torch_default_and_writes_it_in_torchs_dtype():
    with pytest.raises(ValueError, match=re.escape("Rule('lm_head.weight', None) drops a torch-only buffer")) as info:
        Rule("lm_head.weight", None)
    assert "pass tied={'lm_head.weight': 'the key it is tied to'}" in str(info.value)
    rules = dict(parity.RULES)
    parity.register_rule(_Tempered, Rule("temperature", None, torch_default=0.5), table=rules)
    back = flax_to_torch(_Tempered(nnx.Rngs(0)), rules=rules)
    assert back["temperature"].dtype == torch.float32 and back["temperature"].item() == 0.5  # not truncated to 0


def test_a_tensor_given_for_a_dropped_scalar_buffer_is_refused_not_lost():
    # Rule(name, None) stands for a torch-only scalar (num_batches_tracked); a tensor under
    # such a rule (an LSTM's second bias) would be dropped without a word and saved back as a
    # scalar. A scalar of any value still loads: a trained BatchNorm's count is no default.
    rules = dict(parity.RULES)
    parity.register_rule(_Tempered, Rule("temperature", None, torch_default=0.5), table=rules)
    torch_proj = torch.nn.Linear(3, 5)
    state = {"proj.weight": torch_proj.weight, "proj.bias": torch_proj.bias, "temperature": torch.full((5,), 0.7)}
    model = _Tempered(nnx.Rngs(0))
    error = refused_leaving_it_as_it_was(model, lambda: torch_to_flax(state, model, rules=rules))
    assert list(error.invalid) == ["temperature"]
    assert ("invalid value for 'temperature': a tensor of shape (5,), but its rule Rule('temperature', None, "
            "torch_default=0.5) drops a torch-only scalar buffer and would lose these values") in str(error)
    state["temperature"] = torch.tensor(0.7)
    torch_to_flax(state, model, rules=rules)
    np.testing.assert_array_equal(model.proj.kernel.get_value(), torch_proj.weight.detach().cpu().numpy().T)


class _TorchMasked(torch.nn.Module):  # a persistent causal mask: in the state dict
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(3, 5)
        self.register_buffer("causal", torch.ones(4, 4, dtype=torch.bool).tril())


class _FlaxMasked(nnx.Module):  # the port recomputes the mask where it needs it
    def __init__(self, rngs):
        self.proj = nnx.Linear(3, 5, rngs=rngs)


def test_a_constant_the_port_recomputes_loads_when_equal_and_comes_back_as_torch_held_it():
    rules = dict(parity.RULES)
    parity.register_rule(_FlaxMasked, Rule("causal", None, torch_default=np.tril(np.ones((4, 4), bool))), table=rules)
    torch_model = _TorchMasked()
    model = torch_to_flax(torch_model.state_dict(), _FlaxMasked(nnx.Rngs(0)), rules=rules)
    back = flax_to_torch(model, rules=rules)
    assert back["causal"].dtype == torch.bool and torch.equal(back["causal"], torch_model.causal)
    _TorchMasked().load_state_dict(back, strict=True)
    # A checkpoint whose mask is not the port's: the port would attend otherwise, so refused.
    state = dict(torch_model.state_dict())
    state["causal"] = state["causal"].clone()
    state["causal"][0, 3] = True
    with pytest.raises(ConversionError) as info:
        torch_to_flax(state, _FlaxMasked(nnx.Rngs(0)), rules=rules)
    assert info.value.invalid == {"causal": "1 of 16 values differ from the constant its rule "
                                            "Rule('causal', None, torch_default=...) holds"}
    state["causal"] = torch.ones(4, 4)  # a float mask for a boolean one
    with pytest.raises(ConversionError, match=re.escape("dtype float32, not the boolean dtype of the constant")):
        torch_to_flax(state, _FlaxMasked(nnx.Rngs(0)), rules=rules)


def test_a_tie_left_out_is_named_by_the_key_its_copy_equals(torch_model):
    # torch writes both names of a tied weight; a call not told of the tie meets lm_head.weight
    # as an unexpected key, and the refusal says which loaded key it equals bit for bit.
    with pytest.raises(ConversionError) as info:
        convert_in(torch_model.state_dict())
    assert info.value.unexpected == ["lm_head.weight"]
    assert ("unexpected key 'lm_head.weight' (equal to 'tok.weight' bit for bit: a tied weight? "
            "pass tied={'lm_head.weight': 'tok.weight'})") in str(info.value)
    state = dict(torch_model.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"].clone() + 1.0  # no copy of anything: no such hint
    with pytest.raises(ConversionError) as info:
        convert_in(state)
    assert "bit for bit" not in str(info.value)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_a_tied_models_state_dict_saves_and_loads_strictly_both_ways(torch_model, tmp_path, suffix):
    # safetensors refuses two keys on one tensor; the file holds the copy as its own tensor.
    path = parity.save_state_dict(torch_model.state_dict(), tmp_path / f"tied{suffix}")
    loaded = parity.load_state_dict(path)
    assert sorted(loaded) == sorted(torch_model.state_dict())  # safetensors writes its keys sorted
    for key, value in torch_model.state_dict().items():
        assert torch.equal(loaded[key], value.cpu()), key  # a file loads onto the CPU
    fresh = TorchLM()
    fresh.load_state_dict(loaded, strict=True)
    for key, value in torch_model.state_dict().items():  # both names of the tie, and the rest
        assert torch.equal(fresh.state_dict()[key], value), key
    model = convert_in(loaded, tied=TIED)
    assert np.array_equal(np.asarray(model.embed.embedding.get_value()), torch_model.tok.weight.detach().cpu().numpy())


class _TorchTwoNorms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(6), torch.nn.LayerNorm(6)


class _FlaxOneNorm(nnx.Module):  # a port that left out ln2
    def __init__(self, rngs):
        self.ln1 = nnx.LayerNorm(6, epsilon=1e-5, rngs=rngs)


def test_a_layer_left_out_at_its_init_values_is_not_called_a_tie():
    # A fresh LayerNorm's ones and zeros equal every other fresh LayerNorm's bit for bit: ln2 is
    # a layer the port lacks, not a copy of ln1, and the refusal must not suggest tied=.
    with pytest.raises(ConversionError) as info:
        torch_to_flax(_TorchTwoNorms().state_dict(), _FlaxOneNorm(nnx.Rngs(0)))
    assert info.value.unexpected == ["ln2.weight", "ln2.bias"]  # in the state dict's order
    assert "tied" not in str(info.value) and "bit for bit" not in str(info.value)


class _Stateful(nnx.Module):
    """Variables no torch state dict holds, beside one Linear: RNG state, a decoding cache, a value kept from a call."""

    def __init__(self, rngs):
        self.proj = nnx.Linear(3, 5, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)  # nnx.RngKey and nnx.RngCount
        self.attn = nnx.MultiHeadAttention(1, 5, decode=True, use_bias=False, rngs=rngs)

    def __call__(self, x):
        h = self.proj(x)
        self.kept = nnx.Intermediate(h)  # as sow does
        return self.attn(h)


def test_rng_state_decoding_caches_and_kept_values_are_not_converted():
    model = _Stateful(nnx.Rngs(0))
    model.attn.init_cache((2, 4, 5))
    model(jnp.ones((2, 1, 3)))  # one decoding step: the cache index moves
    kinds = {type(v).__name__ for _, v in nnx.to_flat_state(nnx.state(model))}
    assert {"RngKey", "RngCount", "Cache", "Intermediate"} <= kinds
    want = {"proj.weight": (5, 3), "proj.bias": (5,), "attn.in_proj_weight": (15, 5), "attn.out_proj.weight": (5, 5)}
    assert torch_key_shapes(model) == want
    back = flax_to_torch(model)
    assert {k: tuple(v.shape) for k, v in back.items()} == want
    fresh = _Stateful(nnx.Rngs(7))
    torch_to_flax(back, fresh)
    np.testing.assert_array_equal(fresh.proj.kernel.get_value(), model.proj.kernel.get_value())


class _TorchLMHeadFirst(TorchLM):
    """The head built before the embedding: torch then lists the tied parameter under the
    copy's name, lm_head.weight, in named_parameters() (and so in .grad's names)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.lm_head = torch.nn.Linear(D, V, bias=False)
        self.tok = torch.nn.Embedding(V, D)
        self.register_buffer("pos", torch.randn(L, D) * 0.1)
        self.register_buffer("position_ids", torch.arange(L).flip(0))
        self.norm = torch.nn.LayerNorm(D)
        self.lm_head.weight = self.tok.weight


def test_a_tied_gradient_torch_lists_under_the_copys_name_is_compared_given_tied_as_the_guide_says():
    # Tied gradients "need nothing more" only when the source (tok) is registered first; here
    # torch names the gradient lm_head.weight, met only with tied=, as docs/porting.md says.
    torch.manual_seed(0)
    t = _TorchLMHeadFirst().eval()
    assert [name for name, _ in t.named_parameters()] == ["lm_head.weight", "norm.weight", "norm.bias"]
    f = convert_in(t.state_dict(), tied=TIED)
    args = (lambda m, ids: m(ids).square().mean(), lambda m, ids: jnp.square(m(ids)).mean(),
            (torch.as_tensor(IDS),), (IDS,))
    untied = parity.compare_gradients(t, f, *args, rename=RENAME, rules=RULES)
    assert not untied.ok and untied.first_divergence.name == "grad:lm_head.weight"
    report = parity.compare_gradients(t, f, *args, rename=RENAME, rules=RULES, tied=TIED)
    assert report.ok and [row.name for row in report.rows] == ["loss", "grad:lm_head.weight", "grad:norm.weight",
                                                                 "grad:norm.bias"]
    guide = (Path(__file__).resolve().parents[1] / "docs" / "porting.md").read_text()
    assert "Gradients need the same `tied=`" in guide
