"""``Transformer.abstract``: the model of a config with shapes in place of arrays, what runs,
evaluation and conversion load checkpoints and state dicts into.

Properties checked: it is ``nnx.eval_shape`` of ``Transformer.from_config`` (the same graph,
the same parameter paths, shapes, dtypes and logical-axis metadata), for tied, scanned,
rematerialised and bfloat16 models; each call returns a model of its own, so filling one
leaves the next abstract; the init is traced once per set of arguments.

Sizes: the tiny preset (D=30, 5 heads, 2 + 2 layers); the tied model with one vocabulary
(its sources' size) and a feed-forward width of 50.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import flaxformer_mini as fm

TINY = fm.get_preset("tiny")
CASES = {
    "tiny": (TINY, {}),
    "tied_all_ffn_50": (TINY.replace(target_vocab_size=TINY.source_vocab_size, tie_embeddings="all", ffn_dim=50), {}),
    "scanned_remat": (TINY, {"scan_layers": True, "remat": True,
                             "remat_policy": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}),
    "bfloat16": (TINY, {"dtype": jnp.bfloat16}),
}


def _leaves(model):
    state = nnx.state(model)
    return [(path, x.shape, x.dtype) for path, x in jax.tree_util.tree_flatten_with_path(state)[0]]


def _metadata(model):
    return {path: variable.get_metadata() for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.parametrize("case", CASES)
def test_abstract_is_eval_shape_of_from_config(case):
    config, options = CASES[case]
    abstract = fm.Transformer.abstract(config, **options)
    traced = nnx.eval_shape(lambda: fm.Transformer.from_config(config, **options, rngs=nnx.Rngs(7)))
    assert nnx.graphdef(abstract) == nnx.graphdef(traced)
    assert _leaves(abstract) == _leaves(traced)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(nnx.state(abstract)))
    assert _metadata(abstract) == _metadata(traced)
    assert abstract.config == config


def test_each_call_is_a_model_of_its_own_so_filling_one_leaves_the_next_abstract():
    first = fm.Transformer.abstract(TINY)
    params = nnx.state(first, nnx.Param)
    nnx.update(first, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), params))
    table = first.decoder.embedding_layer.embedding[...]
    assert isinstance(table, jax.Array) and not np.asarray(table).any()
    second = fm.Transformer.abstract(TINY)
    assert second is not first
    assert isinstance(second.decoder.embedding_layer.embedding.get_value(), jax.ShapeDtypeStruct)


def test_the_init_is_traced_once_per_set_of_arguments(monkeypatch):
    calls = []
    build = fm.Transformer.from_config.__func__

    def counted(cls, config, **kwargs):
        calls.append(config)
        return build(cls, config, **kwargs)

    monkeypatch.setattr(fm.Transformer, "from_config", classmethod(counted))
    config = TINY.replace(max_len=TINY.max_len + 3)  # a config no other test has asked for
    for _ in range(3):
        fm.Transformer.abstract(config)
    assert calls == [config]
    fm.Transformer.abstract(config, dtype=jnp.bfloat16)  # other arguments: traced again
    assert calls == [config, config]
