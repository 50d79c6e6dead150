"""The conversion engine needs no torch (DESIGN.md's import rules, issue #13 item 0): the plan,
the rules, rename maps and Flax parameter files all work with torch blocked, as they must on a
JAX-only machine; and the plan of an abstract model is the plan of the live one.
"""

import numpy as np
from flax import nnx

import flaxformer_mini as fm
from parity import engine
from helpers import run_blocking

NO_TORCH = """
import numpy as np
from flax import nnx
import flaxformer_mini as fm
from parity import engine, flax_io, rename, rules

config = fm.get_preset("tiny")
the_plan = engine.plan(flax_io.abstract_model(config))
params = {link.flax_path: np.zeros(link.flax_shape, np.float32) for link in the_plan.links}
torch_arrays = flax_io.torch_arrays_from_flax_params(params, config)
assert set(torch_arrays) == set(the_plan)
back = flax_io.flax_params_from_state_dict(torch_arrays, config)
assert set(back) == set(params)
mha = nnx.MultiHeadAttention(3, 12, decode=False, rngs=nnx.Rngs(0))
assert engine.plan(mha).torch_shape("in_proj_weight") == (36, 12)
"""


def test_plan_rules_rename_and_flax_files_work_without_torch():
    run_blocking({"torch", "torch_ref"}, NO_TORCH)


def test_abstract_and_live_models_have_the_same_plan():
    config = fm.get_preset("tiny")
    live = fm.Transformer.from_config(config, rngs=nnx.Rngs(0))
    abstract = nnx.eval_shape(lambda: fm.Transformer.from_config(config, rngs=nnx.Rngs(0)))
    a, b = engine.plan(live), engine.plan(abstract)
    assert list(a) == list(b)
    assert [(x.flax_path, x.torch_shape) for x in a.links] == [(x.flax_path, x.torch_shape) for x in b.links]


def test_attention_chunks_round_trip_through_one_numpy_function_both_ways():
    mha = nnx.MultiHeadAttention(3, 12, decode=False, rngs=nnx.Rngs(0))
    the_plan = engine.plan(mha)
    rng = np.random.default_rng(0)
    torch_arrays = {key: rng.standard_normal(the_plan.torch_shape(key)).astype(np.float32) for key in the_plan}
    flax_arrays = engine.to_flax(the_plan, torch_arrays)
    # Head h of the query kernel is rows h*K..(h+1)*K of in_proj_weight's first third, transposed.
    np.testing.assert_array_equal(flax_arrays["query/kernel"][:, 1, :], torch_arrays["in_proj_weight"][4:8].T)
    back = engine.to_torch(the_plan, flax_arrays)
    for key, value in torch_arrays.items():
        np.testing.assert_array_equal(back[key], value)
