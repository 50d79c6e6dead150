"""Bad input gets a clear error, in both twins, before the Flax twin runs any layer.

PyTorch's embedding lookup raises on an id outside its table; JAX's gather does not (it
returns NaN, or wraps a negative id around like numpy), so the Flax twin checks its token
inputs on the host. These tests pin the messages of both twins (they name the input and
the limit), show what JAX does without the check, and check the limits themselves are
accepted (no off-by-one in either direction).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.model import primitives
import torch_ref

TINY = fm.get_preset("tiny")  # source V 23, target V 19, max_len 17, D 30, H 5
# Distinct sizes, so a swapped axis shows: batch 2, source length 5, target length 4.
B, S, T = 2, 5, 4


def _good_batch(batch=B, source_len=S, target_len=T, target_batch=None):
    rng = np.random.default_rng(0)
    source = rng.integers(1, TINY.source_vocab_size, size=(batch, source_len))
    target = rng.integers(0, TINY.target_vocab_size, size=(target_batch or batch, target_len))
    return source, target


def _with(array, value):
    array = array.copy()
    array[-1, 1] = value  # not in row 0 or column 0, so a check of the first item misses it
    return array


def _source_id(value):
    source, target = _good_batch()
    return _with(source, value), target


def _target_id(value):
    source, target = _good_batch()
    return source, _with(target, value)


def _floats(which):
    source, target = _good_batch()
    if which == "source":
        return source.astype(np.float32), target
    return source, target.astype(np.float32)


# name -> (build (source, target) numpy arrays, exception type, message pattern, bad side)
BAD_INPUTS = {
    "source_id_equal_to_vocab_size": (
        lambda: _source_id(TINY.source_vocab_size), ValueError,
        r"source input: token id 23 is outside the vocabulary \[0, 23\)", "source"),
    "target_id_equal_to_vocab_size": (
        lambda: _target_id(TINY.target_vocab_size), ValueError,
        r"target input: token id 19 is outside the vocabulary \[0, 19\)", "target"),
    "source_id_far_above_vocab": (
        lambda: _source_id(10_000), ValueError, r"source input: token id 10000 is outside the vocabulary", "source"),
    "negative_source_id": (
        lambda: _source_id(-1), ValueError, r"source input: token id -1 is outside the vocabulary", "source"),
    "negative_target_id": (
        lambda: _target_id(-3), ValueError, r"target input: token id -3 is outside the vocabulary", "target"),
    "float_source_ids": (
        lambda: _floats("source"), TypeError, r"source input: token ids must be integers", "source"),
    "float_target_ids": (
        lambda: _floats("target"), TypeError, r"target input: token ids must be integers", "target"),
    "source_longer_than_max_len": (
        lambda: _good_batch(source_len=TINY.max_len + 1), ValueError,
        r"source input: length 18 exceeds max_len=17", "source"),
    "target_longer_than_max_len": (
        lambda: _good_batch(target_len=TINY.max_len + 1), ValueError,
        r"target input: length 18 exceeds max_len=17", "target"),
    "source_and_target_batch_sizes_differ": (
        lambda: _good_batch(batch=2, target_batch=3), ValueError,
        r"source and target batch sizes differ: 2 vs 3", "both"),
}
CASES = [pytest.param(*spec, id=name) for name, spec in BAD_INPUTS.items()]


@pytest.fixture(scope="module")
def torch_model():
    torch.manual_seed(0)
    return torch_ref.Transformer(**TINY.to_dict()).eval()


@pytest.fixture(scope="module")
def flax_model():
    model = fm.Transformer.from_config(TINY, rngs=nnx.Rngs(0))
    model.eval()
    return model


# --- the whole model, both twins ----------------------------------------------------------


@pytest.mark.parametrize("make, exc, match, side", CASES)
def test_torch_twin_rejects_bad_input_with_a_message_naming_it(torch_model, make, exc, match, side):
    source, target = make()
    with pytest.raises(exc, match=match):
        torch_model(torch.from_numpy(source), torch.from_numpy(target))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.uint32], ids=str)
def test_torch_twin_refuses_integer_ids_nn_embedding_cannot_look_up_naming_the_dtype(torch_model, dtype):
    # Unrefused, int8/uint8/int16 fail inside nn.Embedding and uint16/uint32 in the value check,
    # neither naming the input; the Flax twin looks up any integer dtype.
    source, target = _good_batch()
    with pytest.raises(TypeError, match=rf"source input: token ids must be torch.int32 or torch.int64 .*got dtype {dtype}"):
        torch_model(torch.from_numpy(source).to(dtype), torch.from_numpy(target))
    for fine in (torch.int32, torch.int64):
        torch_model(torch.from_numpy(source).to(fine), torch.from_numpy(target).to(fine))


@pytest.mark.parametrize("make, exc, match, side", CASES)
def test_flax_twin_rejects_bad_input_with_a_message_naming_it(flax_model, make, exc, match, side):
    source, target = make()
    with pytest.raises(exc, match=match):
        flax_model(jnp.asarray(source), jnp.asarray(target))


@pytest.mark.parametrize("make, exc, match, side", CASES)
def test_flax_twin_accepts_numpy_input_and_checks_it_the_same_way(flax_model, make, exc, match, side):
    source, target = make()
    with pytest.raises(exc, match=match):
        flax_model(source, target)


def test_flax_twin_given_torch_tensors_says_to_convert_them(flax_model, layer_calls):
    # Side by side with the torch twin, passing it torch tensors is the natural slip; numpy
    # alone would fail with "Cannot interpret 'torch.int64' as a data type", naming nothing.
    source, target = _good_batch()
    convert = r"got torch\.Tensor \(convert it with \.numpy\(\)"
    with pytest.raises(TypeError, match=r"source input: expected a numpy or JAX array of token ids, " + convert):
        flax_model(torch.from_numpy(source), torch.from_numpy(target))
    with pytest.raises(TypeError, match=r"target input: expected a numpy or JAX array of token ids, " + convert):
        flax_model(source, torch.from_numpy(target))
    assert layer_calls == [], f"layers ran before the error: {layer_calls}"
    with pytest.raises(TypeError, match=r"ids: expected a numpy or JAX array of token ids, " + convert):
        fm.check_tokens(torch.tensor([[1, 2]]), vocab_size=5, max_len=7, name="ids")


def test_both_twins_accept_ids_and_lengths_at_the_limits(torch_model, flax_model):
    # The largest valid id (V - 1), id 0 and a sequence of exactly max_len: no off-by-one.
    source, target = _good_batch(source_len=TINY.max_len, target_len=TINY.max_len)
    source[0, :2] = [0, TINY.source_vocab_size - 1]
    target[1, :2] = [0, TINY.target_vocab_size - 1]
    with torch.no_grad():
        torch_logits = torch_model(torch.from_numpy(source), torch.from_numpy(target))
    flax_logits = flax_model(jnp.asarray(source), jnp.asarray(target))
    assert tuple(torch_logits.shape) == flax_logits.shape == (B, TINY.max_len, TINY.target_vocab_size)
    assert torch.isfinite(torch_logits).all() and bool(jnp.isfinite(flax_logits).all())


# --- the Flax check runs before any layer ------------------------------------------------


@pytest.fixture
def layer_calls(monkeypatch):
    """Record every call of an Embed, Linear or LayerNorm: the compiled work of a forward.
    (The model's LayerNorm has a ``__call__`` of its own; its Linear calls nnx.Linear's.)"""
    calls = []
    for cls in (nnx.Embed, nnx.Linear, primitives.LayerNorm):
        original = cls.__call__

        def spy(self, *args, _original=original, _name=cls.__name__, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__call__", spy)
    return calls


def test_layer_spy_sees_the_layers_of_a_good_forward_pass(flax_model, layer_calls):
    # Without this, the test below would pass vacuously if the spy saw nothing.
    source, target = _good_batch()
    flax_model(jnp.asarray(source), jnp.asarray(target))
    assert {"Embed", "Linear", "LayerNorm"} <= set(layer_calls)


@pytest.mark.parametrize(
    "make, exc, match, side",
    [
        pytest.param(*spec, id=name)
        for name, spec in BAD_INPUTS.items()
    ],
)
def test_flax_twin_rejects_bad_input_before_any_layer_runs(flax_model, layer_calls, make, exc, match, side):
    source, target = make()
    with pytest.raises(exc, match=match):
        flax_model(jnp.asarray(source), jnp.asarray(target))
    assert layer_calls == [], f"layers ran before the error: {layer_calls}"


# --- why the check exists: JAX alone is silently wrong ------------------------------------


def test_nnx_embed_alone_returns_numbers_for_out_of_range_ids():
    """Without the check, JAX's gather raises nothing: an id past the table gives NaN (or the
    clamped last row, depending on the gather mode), and -1 wraps around to the last row."""
    V, D = 5, 3
    embed = nnx.Embed(V, D, rngs=nnx.Rngs(0))
    table = np.asarray(embed.embedding.get_value())
    out = np.asarray(embed(jnp.array([V, -1, 2])))  # no exception
    assert out.shape == (3, D)
    past_end = out[0]
    assert np.isnan(past_end).all() or np.array_equal(past_end, table[-1])
    np.testing.assert_array_equal(out[1], table[-1])  # -1 is silently the last row
    np.testing.assert_array_equal(out[2], table[2])


@pytest.mark.parametrize("bad_id", [5, -1], ids=["past_the_end", "negative"])
def test_torch_embedding_alone_raises_for_out_of_range_ids(bad_id):
    # What the Flax check restores: PyTorch refuses, though with a message naming nothing.
    embedding = torch.nn.Embedding(5, 3)
    with pytest.raises(IndexError, match="index out of range"):
        embedding(torch.tensor([bad_id]))


@pytest.mark.parametrize("as_array", [np.asarray, jnp.asarray], ids=["numpy", "jax"])
@pytest.mark.parametrize(
    "tokens, exc, match",
    [
        pytest.param([[0, 4, 5]], ValueError, r"token id 5 is outside the vocabulary \[0, 5\)", id="id_equal_to_vocab"),
        pytest.param([[0, -2, 4]], ValueError, r"token id -2 is outside the vocabulary", id="negative_id"),
        pytest.param([[0.0, 1.0]], TypeError, r"token ids must be integers, got dtype float", id="float_ids"),
        pytest.param([[True, False]], TypeError, r"token ids must be integers, got dtype bool", id="bool_ids"),
        pytest.param([[0] * 8], ValueError, r"length 8 exceeds max_len=7", id="too_long"),
        pytest.param([0, 1, 2], ValueError, r"expected shape \(batch, length\), got \(3,\)", id="one_dimensional"),
    ],
)
def test_check_tokens_raises_for_concrete_arrays(as_array, tokens, exc, match):
    with pytest.raises(exc, match=match):
        fm.check_tokens(as_array(tokens), vocab_size=5, max_len=7, name="ids")
    fm.check_tokens(as_array([[0, 4], [1, 2]]), vocab_size=5, max_len=7)  # valid ids pass


def test_check_tokens_under_jit_sees_dtype_and_length_but_not_values():
    """Dtype and shape are static, so they are checked even while tracing; values are not
    known then, which is why compiled entry points must check their ids on the host first."""

    def lookup(tokens):
        fm.check_tokens(tokens, vocab_size=5, max_len=7)
        return tokens

    with pytest.raises(TypeError, match="must be integers"):
        jax.jit(lookup)(jnp.zeros((1, 2), jnp.float32))
    with pytest.raises(ValueError, match="exceeds max_len=7"):
        jax.jit(lookup)(jnp.zeros((1, 8), jnp.int32))
    jax.jit(lookup)(jnp.array([[99]]))  # out-of-range value: invisible under jit, no error


# --- Encoder and Decoder called directly ---------------------------------------------------

V_ENC, V_DEC, MAX_LEN, D, H, LAYERS = TINY.source_vocab_size, TINY.target_vocab_size, TINY.max_len, 30, 5, 1

BAD_IDS = [
    pytest.param(lambda v: np.array([[1, v]]), ValueError, "is outside the vocabulary", id="id_equal_to_vocab"),
    pytest.param(lambda v: np.array([[1, -1]]), ValueError, "token id -1 is outside the vocabulary", id="negative_id"),
    pytest.param(lambda v: np.array([[1.0, 2.0]], np.float32), TypeError, "must be integers", id="float_ids"),
    pytest.param(lambda v: np.ones((1, MAX_LEN + 1), np.int64), ValueError, "exceeds max_len=17", id="too_long"),
]


@pytest.mark.parametrize("make, exc, match", BAD_IDS)
def test_flax_encoder_called_directly_rejects_bad_ids(make, exc, match):
    encoder = fm.Encoder(V_ENC, MAX_LEN, D, H, LAYERS, 0.0, rngs=nnx.Rngs(0))
    with pytest.raises(exc, match=f"source input: .*{match}"):
        encoder(jnp.asarray(make(V_ENC)), None)


@pytest.mark.parametrize("make, exc, match", BAD_IDS)
def test_flax_decoder_called_directly_rejects_bad_ids(make, exc, match):
    decoder = fm.Decoder(V_DEC, MAX_LEN, D, H, LAYERS, 0.0, rngs=nnx.Rngs(0))
    enc_out = jnp.zeros((1, 3, D))
    with pytest.raises(exc, match=f"target input: .*{match}"):
        decoder(jnp.asarray(make(V_DEC)), enc_out, None, None)


@pytest.mark.parametrize("make, exc, match", BAD_IDS)
def test_torch_encoder_and_decoder_called_directly_reject_bad_ids(make, exc, match):
    encoder = torch_ref.Encoder(V_ENC, MAX_LEN, D, H, LAYERS, 0.0)
    decoder = torch_ref.Decoder(V_DEC, MAX_LEN, D, H, LAYERS, 0.0)
    with pytest.raises(exc, match=f"source input: .*{match}"):
        encoder(torch.from_numpy(make(V_ENC)), None)
    with pytest.raises(exc, match=f"target input: .*{match}"):
        decoder(torch.from_numpy(make(V_DEC)), torch.zeros(1, 3, D), None, None)


# --- LearnedPositionalEncoding (seed 004) -------------------------------------------------


def test_positional_encoding_rejects_length_beyond_max_len_in_both_twins():
    d_model, max_len = 6, 4
    too_long = np.zeros((2, max_len + 1, d_model), np.float32)
    # torch needs no check of its own: nn.Embedding raises, if with a message naming nothing.
    with pytest.raises(IndexError, match="index out of range"):
        torch_ref.LearnedPositionalEncoding(d_model, max_len=max_len)(torch.from_numpy(too_long))
    # JAX would clamp to the last position silently; the twin raises and names the limit.
    with pytest.raises(ValueError, match=r"sequence length 5 exceeds max_len=4"):
        fm.LearnedPositionalEncoding(d_model, max_len=max_len, rngs=nnx.Rngs(0))(jnp.asarray(too_long))


def test_positional_encoding_accepts_length_equal_to_max_len_in_both_twins():
    d_model, max_len = 6, 4
    x = np.zeros((2, max_len, d_model), np.float32)
    assert tuple(torch_ref.LearnedPositionalEncoding(d_model, max_len=max_len)(torch.from_numpy(x)).shape) == x.shape
    assert fm.LearnedPositionalEncoding(d_model, max_len=max_len, rngs=nnx.Rngs(0))(jnp.asarray(x)).shape == x.shape


@pytest.mark.parametrize("name", ["MultiHeadAttention", "MultiHeadSelfAttention"])
def test_a_width_the_heads_do_not_divide_is_refused_with_both_numbers_in_both_twins(name):
    message = r"d_model=10 is not divisible by num_heads=4"
    with pytest.raises(ValueError, match=message):
        getattr(fm, name)(10, 4, rngs=nnx.Rngs(0))
    with pytest.raises(AssertionError, match=message):  # the seeds' assert, naming both numbers
        getattr(torch_ref, name)(10, 4)


# --- ModelConfig ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, match",
    [
        pytest.param(dict(embed_size=31), r"embed_size=31 is not divisible by heads=5", id="embed_size_not_divisible"),
        pytest.param(dict(heads=4), r"embed_size=30 is not divisible by heads=4", id="heads_not_dividing"),
        pytest.param(dict(src_pad_idx=23), r"src_pad_idx=23 is outside the source vocabulary \[0, 23\)",
                     id="pad_id_equal_to_vocab"),
        pytest.param(dict(src_pad_idx=-1), r"src_pad_idx=-1 is outside the source vocabulary", id="negative_pad_id"),
        pytest.param(dict(max_len=0), r"max_len must be >= 1, got 0", id="zero_max_len"),
        pytest.param(dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0", id="dropout_one"),
        # Values of another type, as a hand-written JSON gives them: named, not a failed comparison.
        pytest.param(dict(dropout="x"), r"dropout must be a number in \[0, 1\), got 'x'", id="dropout_string"),
        pytest.param(dict(heads="5"), r"heads must be an integer, got '5'", id="heads_string"),
        pytest.param(dict(embed_size=30.0), r"embed_size must be an integer, got 30.0", id="embed_size_float"),
        pytest.param(dict(num_layers=None), r"num_layers must be an integer, got None", id="num_layers_none"),
        pytest.param(dict(max_len=True), r"max_len must be an integer, got True", id="max_len_bool"),
    ],
)
def test_model_config_rejects_invalid_fields_naming_them(changes, match):
    with pytest.raises(ValueError, match=match):
        TINY.replace(**changes)
    # The Flax twin validates its constructor arguments through ModelConfig too.
    with pytest.raises(ValueError, match=match):
        fm.Transformer(**{**TINY.to_dict(), **changes}, rngs=nnx.Rngs(0))


def test_model_config_lists_every_problem_at_once():
    with pytest.raises(ValueError, match=r"embed_size=31 is not divisible by heads=5; src_pad_idx=40"):
        TINY.replace(embed_size=31, src_pad_idx=40)


# --- the training library: what a learner passes by mistake ---------------------------------


def test_trainer_train_step_and_check_batch_name_a_wrong_argument(flax_model):
    from flaxformer_mini.data import make_batch
    from flaxformer_mini.train.optimizer import TrainConfig
    from flaxformer_mini.train.step import check_batch, eval_step, train_step
    from flaxformer_mini.train.trainer import Trainer

    # Unchecked, each is an AttributeError ('ModelConfig' object has no attribute 'config', ...).
    with pytest.raises(TypeError, match=r"^Trainer takes a model \(a Transformer\), got ModelConfig \(build one: "
                                        r"Transformer.from_config\(config, rngs=nnx.Rngs\(0\)\)\)$"):
        Trainer(TINY, TrainConfig())
    with pytest.raises(TypeError, match=r"^Trainer's config must be a TrainConfig, got dict$"):
        Trainer(flax_model, {"learning_rate": 1e-3})
    from flaxformer_mini.train.state import TrainState

    # Unchecked: "'ModelConfig' object has no attribute 'train'" and "unhashable type: 'dict'".
    with pytest.raises(TypeError, match=r"^TrainState.create takes a model \(a Transformer\), got ModelConfig"):
        TrainState.create(TINY, TrainConfig())
    with pytest.raises(TypeError, match=r"^TrainState.create's config must be a TrainConfig, got dict$"):
        TrainState.create(flax_model, {"learning_rate": 1e-3})
    batch = make_batch([[4, 5]], [[6]])
    for step in (train_step, eval_step):
        with pytest.raises(TypeError, match=rf"^{step.__name__}'s state must be a TrainState \(Trainer.init_state\(\) "
                                            r"or TrainState.create\(model, TrainConfig\(\)\)\), got Transformer$"):
            step(flax_model, batch)
    with pytest.raises(TypeError, match=r"^a batch must be a Batch \(source, target_in, target_out: data.make_batch "
                                        r"makes one\), got tuple$"):
        check_batch(tuple(batch), TINY)
    check_batch(batch, TINY)


@pytest.mark.parametrize("changes, match", [
    pytest.param(dict(learning_rate="1e-3"), r"^TrainConfig.learning_rate must be a number, got '1e-3'$", id="string"),
    pytest.param(dict(warmup_steps=2.5), r"^TrainConfig.warmup_steps must be an integer, got 2.5$", id="float_steps"),
    pytest.param(dict(seed=True), r"^TrainConfig.seed must be an integer, got True$", id="bool_seed"),
    pytest.param(dict(clip_norm="1"), r"^TrainConfig.clip_norm must be a number or None, got '1'$", id="clip_norm"),
])
def test_train_config_names_a_field_of_the_wrong_type(changes, match):
    from flaxformer_mini.train.optimizer import TrainConfig

    # Unchecked, a string fails with "TypeError: '<' not supported between instances of 'str' and 'int'", naming no field.
    with pytest.raises(TypeError, match=match):
        TrainConfig(**changes)
    assert TrainConfig(seed=np.int64(3), learning_rate=np.float32(1e-3), clip_norm=None).seed == 3


@pytest.mark.parametrize("changes, match", [
    pytest.param(dict(b1=1.0), r"^b1 must be in \[0, 1\), got 1.0$", id="b1_1"),
    pytest.param(dict(b1=-0.5), r"^b1 must be in \[0, 1\), got -0.5$", id="b1_negative"),
    pytest.param(dict(b1=float("nan")), r"^b1 must be in \[0, 1\), got nan$", id="b1_nan"),
    pytest.param(dict(b2=1.0), r"^b2 must be in \[0, 1\), got 1.0$", id="b2_1"),
    # torch.optim.Adam accepts eps=0; here a gradient 0 so far divides 0 by 0 (NaN parameters).
    pytest.param(dict(eps=0.0), r"^eps must be a finite number > 0, got 0.0$", id="eps_0"),
    pytest.param(dict(eps=float("inf")), r"^eps must be a finite number > 0, got inf$", id="eps_inf"),
    pytest.param(dict(learning_rate=0.0), r"^learning_rate must be a finite number > 0, got 0.0$", id="lr_0"),
    pytest.param(dict(weight_decay=-1.0), r"^weight_decay must be a finite number >= 0, got -1.0$", id="decay"),
    pytest.param(dict(ema_decay=1.0), r"^ema_decay must be in \(0, 1\) or None", id="ema_1"),
    pytest.param(dict(clip_norm=0.0), r"^clip_norm must be a finite number > 0 or None", id="clip_0"),
])
def test_train_config_names_a_field_out_of_its_range(changes, match):
    from flaxformer_mini.train.optimizer import TrainConfig

    with pytest.raises(ValueError, match=match):
        TrainConfig(**changes)
    assert TrainConfig(b1=0.0, b2=0.0, eps=1e-12).b1 == 0.0  # the ends each range includes


def test_a_model_of_shapes_a_config_dict_and_an_int_for_rngs_are_named():
    from flaxformer_mini.decode.search import greedy_decode

    source, target = _good_batch()
    abstract = fm.Transformer.abstract(TINY)
    # Unchecked: "'ShapeDtypeStruct' object is not subscriptable" and "Argument 'state['decoder']...
    # of type <class 'jax.ShapeDtypeStruct'> is not a valid JAX type".
    for call in (lambda: abstract(source, target), lambda: greedy_decode(abstract, source, 3)):
        with pytest.raises(ValueError, match=r"^this Transformer holds shapes, not arrays \(Transformer.abstract or "
                                             r"nnx.eval_shape\): load weights into it first"):
            call()
    # Unchecked: "'dict' object has no attribute 'to_dict'" and "'int' object has no attribute 'params'".
    with pytest.raises(TypeError, match=r"^config must be a ModelConfig \(get_preset\('tiny'\), or ModelConfig\(\*\*d\) "
                                        r"from a dict\), got dict$"):
        fm.Transformer.from_config(TINY.to_dict(), rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"^rngs must be an nnx.Rngs \(e.g. rngs=nnx.Rngs\(0\)\), got int$"):
        fm.Transformer.from_config(TINY, rngs=0)


def test_decoding_names_a_whole_batch_for_its_source_and_a_beam_size_below_one(flax_model):
    from flaxformer_mini.data import make_batch
    from flaxformer_mini.decode.options import OptionError
    from flaxformer_mini.decode.search import decode, greedy_decode

    batch = make_batch([[4, 5]], [[6]])
    # Unchecked, numpy stacks the Batch's three arrays into one of another shape.
    with pytest.raises(TypeError, match=r"^source: expected an array of token ids, got a whole Batch \(pass its .source\)$"):
        greedy_decode(flax_model, batch, 3)
    # A beam size below 1 is refused, as beam_search refuses it, not taken for greedy search.
    for beam_size, match in ((0, r"^beam size must be >= 1, got 0$"), ("2", r"^beam size must be an integer, got '2'$")):
        with pytest.raises(OptionError, match=match):
            decode(flax_model, batch.source, 3, beam_size=beam_size)
