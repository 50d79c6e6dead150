"""The torch <-> Flax weight conversion (``parity.torch_to_flax`` / ``parity.flax_to_torch``).

Properties checked:
- round trips are bit-exact in both directions, for the Transformer and the small twins;
- what flax_to_torch returns loads into torch_ref with strict=True;
- bad input is refused with a ConversionError naming every offending key, and the Flax
  model is left bit-for-bit as it was (nothing is half-loaded);
- a parameter no rule covers is refused, not guessed;
- bfloat16 survives both ways; converted arrays never share memory with their source.

Sizes are odd and distinct (the tiny preset: D=30, H=5, vocabularies 23 and 19) so a swapped
axis changes a shape. The torch twins are seeded differently from the Flax twins, so a load
that did nothing, or did half, shows up as a difference.
"""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
import torch_ref
from parity import ConversionError, flax_to_torch, torch_key_shapes, torch_to_flax

TORCH_SEED = 7  # torch twins' seed
FLAX_SEED = 3  # Flax twins' seed: a different one, so the two start out different


# Each small twin, built with the same arguments on both sides. Sizes: distinct and odd where
# the seed allows it; FeedForward's non-square layers make a missing transpose a shape error.
SMALL_TWINS = {
    "SelfAttention": ("SelfAttention", (30, 5)),
    "MultiHeadAttention": ("MultiHeadAttention", (21, 3)),
    "PerHeadSelfAttention": ("PerHeadSelfAttention", (30, 5)),  # no-bias K x K projections
    "MultiHeadSelfAttention": ("MultiHeadSelfAttention", (35, 7)),  # no bias anywhere
    "FeedForward": ("FeedForward", (7, 11)),
    "LearnedPositionalEncoding": ("LearnedPositionalEncoding", (13, 17)),
}


def torch_twin(name, args, seed=TORCH_SEED):
    torch.manual_seed(seed)
    return getattr(torch_ref, name)(*args)


def flax_twin(name, args, seed=FLAX_SEED, **kwargs):
    return getattr(fm, name)(*args, **kwargs, rngs=nnx.Rngs(seed))


def torch_transformer(config, seed=TORCH_SEED):
    torch.manual_seed(seed)
    return torch_ref.Transformer(**config.to_dict())


def flax_transformer(config, seed=FLAX_SEED, **kwargs):
    return fm.Transformer.from_config(config, **kwargs, rngs=nnx.Rngs(seed))


PAIR_NAMES = ["Transformer", *SMALL_TWINS]


@pytest.fixture(params=PAIR_NAMES)
def pair(request, tiny_config):
    """(make_torch(seed), make_flax(seed)): builders of the two twins of one module."""
    name = request.param
    if name == "Transformer":
        return (lambda seed=TORCH_SEED: torch_transformer(tiny_config, seed),
                lambda seed=FLAX_SEED: flax_transformer(tiny_config, seed))
    cls_name, args = SMALL_TWINS[name]
    return (lambda seed=TORCH_SEED: torch_twin(cls_name, args, seed),
            lambda seed=FLAX_SEED: flax_twin(cls_name, args, seed))


# -- bitwise comparison helpers ------------------------------------------------------------

_TORCH_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}


def assert_tensors_bit_identical(got, want):
    """Same key set, and each tensor has the same dtype, shape and bits (0.0 != -0.0)."""
    assert set(got) == set(want), f"key sets differ: only got {set(got) - set(want)}, only want {set(want) - set(got)}"
    for key in want:
        a, b = got[key], want[key]
        assert a.dtype == b.dtype, f"{key}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{key}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert torch.equal(a, b), f"{key}: values differ"
        bits = _TORCH_BITS[a.dtype]
        assert torch.equal(a.contiguous().view(bits), b.contiguous().view(bits)), f"{key}: bits differ"


def flax_params(model):
    """{path: numpy copy} of every nnx.Param of ``model``."""
    return {path: np.array(value.get_value()) for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _bits(array):
    return array.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[array.dtype.itemsize])


def assert_params_bit_identical(got, want):
    assert set(got) == set(want), f"param paths differ: {set(got) ^ set(want)}"
    for path in want:
        a, b = got[path], want[path]
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}"
        assert np.array_equal(_bits(a), _bits(b)), f"{path}: bits differ"


def assert_some_param_differs(a, b):
    """Guard that makes a comparison meaningful: the two models did start out different."""
    assert any(not np.array_equal(_bits(a[p]), _bits(b[p])) for p in b), "the two models start identical"


# -- round trips ---------------------------------------------------------------------------


def test_round_trip_torch_flax_torch_is_bit_exact(pair):
    make_torch, make_flax = pair
    original = dict(make_torch().state_dict())
    flax_model = make_flax()
    before = flax_params(flax_model)
    torch_to_flax(original, flax_model)
    assert_some_param_differs(flax_params(flax_model), before)  # the load did something
    assert_tensors_bit_identical(flax_to_torch(flax_model), original)


def test_round_trip_flax_torch_flax_is_bit_exact(pair):
    make_torch, make_flax = pair
    source = make_flax()
    want = flax_params(source)

    torch_model = make_torch()
    result = torch_model.load_state_dict(flax_to_torch(source), strict=True)
    assert result.missing_keys == [] and result.unexpected_keys == []

    fresh = make_flax(FLAX_SEED + 1)  # built anew, with its own initialisation
    assert_some_param_differs(flax_params(fresh), want)
    torch_to_flax(torch_model.state_dict(), fresh)
    assert_params_bit_identical(flax_params(fresh), want)


def test_flax_to_torch_loads_into_torch_ref_strictly(tiny_config, tmp_path):
    # The contract: a state dict saved from the torch twin -> Flax -> flax_to_torch -> a
    # fresh torch_ref.Transformer with strict=True, which then computes the same logits.
    original = torch_transformer(tiny_config).eval()
    path = tmp_path / "seed_model.pt"
    torch.save(original.state_dict(), path)
    saved = torch.load(path, weights_only=True)

    flax_model = flax_transformer(tiny_config)
    torch_to_flax(saved, flax_model)

    reloaded = torch_transformer(tiny_config, seed=TORCH_SEED + 3).eval()
    result = reloaded.load_state_dict(flax_to_torch(flax_model), strict=True)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert_tensors_bit_identical(reloaded.state_dict(), dict(original.state_dict()))

    source = torch.tensor([[5, 3, 22, 1, 0, 0, 0], [9, 18, 2, 7, 11, 4, 6]])
    target = torch.tensor([[1, 2, 18, 3, 4], [0, 6, 5, 9, 17]])
    with torch.no_grad():
        assert torch.equal(reloaded(source, target), original(source, target))


def test_torch_key_shapes_are_torch_refs_state_dict_shapes(pair):
    make_torch, make_flax = pair
    want = {k: tuple(v.shape) for k, v in make_torch().state_dict().items()}
    assert torch_key_shapes(make_flax()) == want


def test_no_bias_twins_expect_no_bias_keys():
    for name in ("PerHeadSelfAttention", "MultiHeadSelfAttention"):
        _, args = SMALL_TWINS[name]
        keys = set(torch_key_shapes(flax_twin(name, args)))
        assert keys == set(torch_twin(name, args).state_dict()), name
    assert not any(k.endswith("bias") for k in torch_key_shapes(flax_twin("MultiHeadSelfAttention", (35, 7))))


def test_loaded_flax_params_do_not_share_memory_with_the_torch_tensors(tiny_config):
    # An optimizer step updates torch parameters in place; it must not reach the Flax twin.
    torch_model = torch_transformer(tiny_config)
    flax_model = flax_transformer(tiny_config)
    torch_to_flax(torch_model.state_dict(), flax_model)
    before = flax_params(flax_model)
    with torch.no_grad():
        for p in torch_model.parameters():
            p.add_(1.0)
    assert_params_bit_identical(flax_params(flax_model), before)


@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16])
def test_flax_to_torch_tensors_do_not_share_memory_with_the_flax_params(tiny_config, param_dtype):
    flax_model = flax_transformer(tiny_config, param_dtype=param_dtype)
    before = flax_params(flax_model)
    exported = flax_to_torch(flax_model)
    for tensor in exported.values():
        tensor.add_(1.0)
    assert_params_bit_identical(flax_params(flax_model), before)


# -- bad input: ConversionError naming every key, model untouched ---------------------------


def randomized(state_dict, seed=TORCH_SEED):
    """The same keys and shapes, every value random: loading it changes every parameter
    (LayerNorm's ones and zeros included), so a half-load cannot go unnoticed."""
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=generator, dtype=v.dtype) for k, v in state_dict.items()}


@pytest.fixture
def model_and_state(tiny_config):
    """A Flax Transformer, a snapshot of its params, and a fitting state dict of other values."""
    flax_model = flax_transformer(tiny_config)
    state = randomized(torch_transformer(tiny_config).state_dict())
    return flax_model, flax_params(flax_model), state


def refused(state, flax_model, before):
    """Load ``state``, expect a ConversionError, check nothing changed; return the error."""
    with pytest.raises(ConversionError) as info:
        torch_to_flax(state, flax_model)
    assert_params_bit_identical(flax_params(flax_model), before)
    return info.value


def test_good_state_dict_changes_every_param(model_and_state):
    # The control for the "model unchanged" checks below: the state dict they break, unbroken,
    # loads and changes every parameter.
    flax_model, before, state = model_and_state
    torch_to_flax(state, flax_model)
    after = flax_params(flax_model)
    for path in before:
        assert not np.array_equal(after[path], before[path]), f"{path} was not loaded"


def test_missing_keys_are_all_named_and_nothing_loads(model_and_state):
    flax_model, before, state = model_and_state
    gone = ["encoder.transformer_layers.1.norm2.bias", "decoder.fc.weight", "decoder.embedding_layer.weight"]
    for key in gone:
        del state[key]
    err = refused(state, flax_model, before)
    assert sorted(err.missing) == sorted(gone)
    assert err.unexpected == [] and err.mismatched == {}
    for key in gone:
        assert f"missing key {key!r}" in str(err)


def test_unexpected_keys_are_all_named_and_nothing_loads(model_and_state):
    flax_model, before, state = model_and_state
    extra = {"encoder.extra.weight": torch.zeros(3, 5), "decoder.fc.scale": torch.ones(19)}
    state.update(extra)
    err = refused(state, flax_model, before)
    assert sorted(err.unexpected) == sorted(extra)
    assert err.missing == [] and err.mismatched == {}
    for key in extra:
        assert f"unexpected key {key!r}" in str(err)


def test_shape_mismatches_are_all_named_with_both_shapes(model_and_state):
    flax_model, before, state = model_and_state
    state["encoder.embedding_layer.weight"] = torch.zeros(29, 30)
    state["decoder.decoder_layers.0.norm.weight"] = torch.ones(31)
    err = refused(state, flax_model, before)
    assert err.mismatched == {
        "encoder.embedding_layer.weight": ((29, 30), (23, 30)),
        "decoder.decoder_layers.0.norm.weight": ((31,), (30,)),
    }
    assert "'encoder.embedding_layer.weight': checkpoint (29, 30), model expects (23, 30)" in str(err)
    assert "'decoder.decoder_layers.0.norm.weight': checkpoint (31,), model expects (30,)" in str(err)


def test_transposed_linear_weight_is_called_transposed(model_and_state):
    flax_model, before, state = model_and_state
    state["decoder.fc.weight"] = state["decoder.fc.weight"].T.contiguous()  # (19, 30) -> (30, 19)
    err = refused(state, flax_model, before)
    assert err.mismatched == {"decoder.fc.weight": ((30, 19), (19, 30))}
    assert "looks transposed" in str(err)


def test_shape_mismatch_that_is_not_a_transpose_is_not_called_transposed(model_and_state):
    flax_model, before, state = model_and_state
    state["decoder.fc.weight"] = torch.zeros(30, 18)
    err = refused(state, flax_model, before)
    assert "decoder.fc.weight" in err.mismatched
    assert "transposed" not in str(err)


def test_deeper_checkpoint_names_the_layer_counts(tiny_config):
    flax_model = flax_transformer(tiny_config)  # 2 layers
    before = flax_params(flax_model)
    deeper = randomized(torch_transformer(tiny_config.replace(num_layers=3)).state_dict())
    err = refused(deeper, flax_model, before)
    message = str(err)
    assert "encoder.transformer_layers has 3 layers in the checkpoint, 2 in the model" in message
    assert "decoder.decoder_layers has 3 layers in the checkpoint, 2 in the model" in message
    extra = sorted(k for k in deeper if ".transformer_layers.2." in k or ".decoder_layers.2." in k)
    assert extra and sorted(err.unexpected) == extra
    assert err.missing == [] and err.mismatched == {}
    for key in extra:
        assert repr(key) in message
    # Every key of layers 0 and 1 is supplied, so none of them is what an extra key "meant".
    assert "did you mean" not in message


def test_shallower_checkpoint_names_the_layer_counts(tiny_config):
    flax_model = flax_transformer(tiny_config)
    before = flax_params(flax_model)
    shallower = randomized(torch_transformer(tiny_config.replace(num_layers=1)).state_dict())
    err = refused(shallower, flax_model, before)
    assert "encoder.transformer_layers has 1 layers in the checkpoint, 2 in the model" in str(err)
    assert sorted(err.missing) == sorted(k for k in torch_key_shapes(flax_model) if k not in shallower)


def test_wider_checkpoint_names_every_mismatched_key(tiny_config):
    flax_model = flax_transformer(tiny_config)  # embed_size 30
    before = flax_params(flax_model)
    wider = randomized(torch_transformer(tiny_config.replace(embed_size=35, heads=5)).state_dict())
    err = refused(wider, flax_model, before)
    expected = torch_key_shapes(flax_model)
    # Every parameter's shape but the logits' bias (V,) involves D: all of them are named.
    wrong = {k: (tuple(v.shape), expected[k]) for k, v in wider.items() if tuple(v.shape) != expected[k]}
    assert set(wrong) == set(wider) - {"decoder.fc.bias"}
    assert err.mismatched == wrong
    assert err.missing == [] and err.unexpected == []
    for key in wrong:
        assert f"shape mismatch for {key!r}" in str(err)
    assert "'decoder.fc.weight': checkpoint (19, 35), model expects (19, 30)" in str(err)


def test_renamed_key_suggests_the_expected_name(model_and_state):
    flax_model, before, state = model_and_state
    right = "encoder.transformer_layers.0.attention.W_q.weight"
    wrong = "encoder.transformer_layers.0.attention.Wq.weight"
    state[wrong] = state.pop(right)
    err = refused(state, flax_model, before)
    assert err.missing == [right] and err.unexpected == [wrong]
    assert f"unexpected key {wrong!r} (did you mean {right!r}?)" in str(err)
    assert f"missing key {right!r} (did you mean {wrong!r}?)" in str(err)


@pytest.mark.parametrize(("prefix", "whose"), [
    ("module.", "a DistributedDataParallel or DataParallel wrapper's"),
    ("_orig_mod.", "torch.compile's wrapper's"),
    ("module._orig_mod.", "DDP's and torch.compile's wrappers'"),
    ("net.", None),  # a wrapper of the user's own: the same line, without a name for it
])
def test_a_state_dict_of_a_wrapped_model_is_said_in_one_line_with_how_to_strip_its_prefix(model_and_state, prefix,
                                                                                          whose):
    flax_model, before, state = model_and_state
    wrapped = {prefix + k: v for k, v in state.items()}
    err = refused(wrapped, flax_model, before)
    assert sorted(err.unexpected) == sorted(wrapped) and sorted(err.missing) == sorted(state)
    first = next(iter(wrapped))
    assert str(err).splitlines() == [
        "state dict does not fit Transformer:",
        f"  {len(state)} keys of the state dict are the model's keys with {prefix!r} before them"
        + (f" ({whose})" if whose else "") + f", e.g. {first!r}: strip it, "
        f"{{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}"]
    unwrapped = {k.removeprefix(prefix): v for k, v in wrapped.items()}  # the line's own fix works
    torch_to_flax(unwrapped, flax_model)
    # With a rename map, the map is what fails first: its line says the prefix before the patterns.
    with pytest.raises(ConversionError) as info:
        torch_to_flax(wrapped, flax_model, rename={"decoder.fc.{}": "decoder.fc.{}"})
    assert str(info.value).splitlines()[1:] == (
        [f"  every key of the state dict starts with {prefix!r} ({whose}): strip it, "
         f"{{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}"] if whose else []
    ) + ["  pattern 'decoder.fc.{}' matches no key"]


class _Wrapping(nnx.Module):  # a port that holds the ported model as a submodule
    def __init__(self, config):
        self.model = flax_transformer(config)


def test_a_model_wrapping_the_checkpoints_model_is_said_in_one_line(tiny_config):
    state = randomized(torch_transformer(tiny_config).state_dict())
    wrapping = _Wrapping(tiny_config)
    with pytest.raises(ConversionError) as info:
        torch_to_flax(state, wrapping)
    assert sorted(info.value.missing) == sorted("model." + k for k in state)
    assert str(info.value).splitlines() == [
        "state dict does not fit _Wrapping:",
        f"  {len(state)} keys of the model are the state dict's keys with 'model.' before them, e.g. "
        f"{info.value.missing[0]!r}: add it, {{'model.' + k: v for k, v in state_dict.items()}}, or convert into "
        f"the model's 'model' submodule"]
    torch_to_flax({"model." + k: v for k, v in state.items()}, wrapping)  # the line's own fix works


def test_a_key_that_is_not_a_string_is_refused_as_unexpected_by_name(model_and_state):
    # torch.save keeps a dict's int keys; a pickle may mix them with the str ones.
    flax_model, before, state = model_and_state
    state[7] = torch.zeros(3)
    wrapped = {"module." + k: v for k, v in state.items() if isinstance(k, str)} | {8: torch.zeros(3)}
    err = refused(state, flax_model, before)
    assert err.unexpected == [7] and err.missing == [] and err.mismatched == {}
    assert str(err).splitlines() == ["state dict does not fit Transformer:", "  unexpected key 7"]
    err = refused(wrapped, flax_model, before)  # the wrapper's prefix is still said, the int key beside it
    assert 8 in err.unexpected and "keys with 'module.' before them" in str(err)
    assert "  unexpected key 8" in str(err).splitlines()


def test_a_suggested_name_has_the_shape_the_key_needs(model_and_state):
    # A name alone would pair W_q.weight with the nearest-spelt key whatever its size; the
    # suggestion is taken among the keys of the expected shape.
    import difflib

    flax_model, before, state = model_and_state
    right = "encoder.transformer_layers.0.attention.W_q.weight"
    spelt_close = "encoder.transformer_layers.0.attention.W_qq.weight"  # the wrong size
    renamed = "encoder.transformer_layers.0.attention.query.weight"  # the right tensor, another name
    state[renamed] = state.pop(right)
    state[spelt_close] = torch.zeros(3, 4)
    assert difflib.get_close_matches(right, [spelt_close, renamed], n=1)[0] == spelt_close  # names alone mislead
    err = refused(state, flax_model, before)
    assert f"missing key {right!r} (did you mean {renamed!r}?)" in str(err)
    assert f"unexpected key {renamed!r} (did you mean {right!r}?)" in str(err)
    assert f"unexpected key {spelt_close!r}\n" in str(err) + "\n"  # no key of its shape is missing


def test_several_problems_are_reported_together(model_and_state):
    flax_model, before, state = model_and_state
    del state["decoder.decoder_layers.1.attention.W_v.bias"]
    state["encoder.bogus.weight"] = torch.zeros(2, 2)
    state["encoder.positional_encoding.weight"] = torch.zeros(16, 30)
    state["decoder.fc.weight"] = state["decoder.fc.weight"].T.contiguous()
    state["decoder.fc.bias"] = torch.arange(19)
    err = refused(state, flax_model, before)
    assert err.missing == ["decoder.decoder_layers.1.attention.W_v.bias"]
    assert err.unexpected == ["encoder.bogus.weight"]
    assert set(err.mismatched) == {"encoder.positional_encoding.weight", "decoder.fc.weight"}
    assert set(err.invalid) == {"decoder.fc.bias"}
    message = str(err)
    for key in ("decoder.decoder_layers.1.attention.W_v.bias", "encoder.bogus.weight",
                "encoder.positional_encoding.weight", "decoder.fc.weight", "decoder.fc.bias"):
        assert repr(key) in message, key
    assert "looks transposed" in message


@pytest.mark.parametrize("bad", [
    torch.zeros(19, dtype=torch.int64),
    torch.zeros(19, dtype=torch.int32),
    torch.zeros(19, dtype=torch.bool),
    np.zeros(19, dtype=np.int16),
], ids=["int64", "int32", "bool", "numpy-int16"])
def test_non_float_value_is_refused_by_name(model_and_state, bad):
    flax_model, before, state = model_and_state
    state["decoder.fc.bias"] = bad
    err = refused(state, flax_model, before)
    assert list(err.invalid) == ["decoder.fc.bias"]
    assert "invalid value for 'decoder.fc.bias'" in str(err)
    assert "not a floating-point dtype" in str(err)


def test_a_mapping_is_required(model_and_state):
    flax_model, before, state = model_and_state
    err = refused(list(state.values()), flax_model, before)
    assert "mapping" in str(err)


def test_float64_and_numpy_values_load_cast_to_the_param_dtype(model_and_state):
    # As torch's load_state_dict copies into its own dtype, a float64 checkpoint loads into float32.
    flax_model, _, state = model_and_state
    state64 = {k: v.double().numpy() for k, v in state.items()}
    torch_to_flax(state64, flax_model)
    assert_tensors_bit_identical(flax_to_torch(flax_model), state)


# -- parameters no rule covers ---------------------------------------------------------------


class _WithConv(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(3, 5, rngs=rngs)
        # A layer type parity.RULES has no rule for.
        self.conv = nnx.ConvTranspose(3, 5, kernel_size=(3,), rngs=rngs)


class _WithRawParam(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(3, 5, rngs=rngs)
        self.gate = nnx.Param(jnp.ones((5,)))


class _MyLinear(nnx.Linear):
    """A subclass may compute something else: the table matches exact types, not look-alikes."""


class _WithSubclassedLinear(nnx.Module):
    def __init__(self, rngs):
        self.proj = _MyLinear(3, 5, rngs=rngs)


@pytest.mark.parametrize("make, uncovered", [
    (_WithConv, ["conv/bias (a ConvTranspose)", "conv/kernel (a ConvTranspose)"]),
    (_WithRawParam, ["gate (a _WithRawParam)"]),
    (_WithSubclassedLinear, ["proj/bias (a _MyLinear)", "proj/kernel (a _MyLinear)"]),
], ids=["conv", "raw-param", "linear-subclass"])
def test_parameter_no_rule_covers_is_refused(make, uncovered):
    model = make(nnx.Rngs(0))
    before = flax_params(model)
    good = {"proj.weight": torch.zeros(5, 3), "proj.bias": torch.zeros(5)}
    for convert in (flax_to_torch, lambda m: torch_to_flax(good, m), torch_key_shapes):
        with pytest.raises(ConversionError) as info:
            convert(model)
        # Each variable is named with its layer type.
        assert f"no conversion rule covers these variables of {type(model).__name__}: {', '.join(uncovered)}" in str(info.value)
    assert_params_bit_identical(flax_params(model), before)


# -- bfloat16 ---------------------------------------------------------------------------------


def test_bfloat16_torch_weights_load_bit_exact_into_a_bfloat16_model(tiny_config):
    torch_model = torch_transformer(tiny_config).to(torch.bfloat16)
    state = torch_model.state_dict()
    flax_model = flax_transformer(tiny_config, param_dtype=jnp.bfloat16)
    torch_to_flax(state, flax_model)

    params = flax_params(flax_model)
    assert all(v.dtype == ml_dtypes.bfloat16 for v in params.values())
    # Values preserved: each Flax param holds the torch tensor's bits (transposed for kernels).
    kernel = params[("decoder", "fc", "kernel")]
    torch_bits = state["decoder.fc.weight"].view(torch.int16).numpy()
    assert np.array_equal(_bits(kernel), torch_bits.T.view(np.uint16))
    emb = params[("encoder", "embedding_layer", "embedding")]
    assert np.array_equal(_bits(emb), state["encoder.embedding_layer.weight"].view(torch.int16).numpy().view(np.uint16))

    back = flax_to_torch(flax_model)
    assert all(t.dtype == torch.bfloat16 for t in back.values())
    assert_tensors_bit_identical(back, dict(state))


def test_bfloat16_flax_torch_flax_round_trip_is_bit_exact(tiny_config):
    source = flax_transformer(tiny_config, param_dtype=jnp.bfloat16)
    torch_model = torch_transformer(tiny_config).to(torch.bfloat16)
    torch_model.load_state_dict(flax_to_torch(source), strict=True)

    fresh = flax_transformer(tiny_config, seed=FLAX_SEED + 1, param_dtype=jnp.bfloat16)
    assert_some_param_differs(flax_params(fresh), flax_params(source))
    torch_to_flax(torch_model.state_dict(), fresh)
    assert_params_bit_identical(flax_params(fresh), flax_params(source))


def test_bfloat16_checkpoint_into_a_float32_model_is_an_exact_upcast(tiny_config):
    state = torch_transformer(tiny_config).to(torch.bfloat16).state_dict()
    flax_model = flax_transformer(tiny_config)  # float32 params
    torch_to_flax(state, flax_model)
    assert_tensors_bit_identical(flax_to_torch(flax_model), {k: v.float() for k, v in state.items()})
