"""``Transformer(..., remat=True, remat_policy=...)``: a ``jax.checkpoint`` policy for the
rematerialised blocks (the ablations' ``remat_*`` variants, tools/ablation_variants.py).

Properties checked: the policy changes what the backward pass keeps (JAX's own listing of the
saved residuals) and nothing else: the same parameter paths and initial values as the model
without it, and the same loss and gradients through the Trainer's step, which is a plain
``jax.jit`` over a merged nnx graph (the mode a remat must work in before it can be adopted);
a policy without ``remat`` is refused by name.

Sizes: D=32, 4 heads, 3 layers a side (odd: the stacked axis), B=2, S=T=8, vocabulary 40.
"""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

import flaxformer_mini as fm
from flaxformer_mini.data import Batch
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer

L, B, S, D, V = 3, 2, 8, 32, 40
POLICIES = jax.checkpoint_policies


def _model(dtype=None, **kw):
    return fm.Transformer(0, V, V, 16, D, 4, L, 0.0, dtype=dtype, scan_layers=True, rngs=nnx.Rngs(0), **kw)


def _batch():
    source = jnp.arange(1, 1 + B * S, dtype=jnp.int32).reshape(B, S) % (V - 1) + 1
    target = source[:, ::-1]
    return Batch(source, target, jnp.roll(target, -1, axis=1))


def _kept(model):
    """The lines of ``print_saved_residuals`` for the model's summed logits, as a function of
    its parameters, less the parameters themselves ("from the argument ...")."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    batch = _batch()

    def loss(params):
        return nnx.merge(graphdef, params, rest, copy=True)(batch.source, batch.target_in).astype(jnp.float32).sum()

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(loss, params)
    return [line.split(" ")[0] for line in printed.getvalue().splitlines() if "from the argument" not in line]


def test_a_policy_chooses_what_each_rematerialised_block_keeps():
    nothing = _kept(_model(jnp.bfloat16, remat=True))
    gemms = _kept(_model(jnp.bfloat16, remat=True, remat_policy=POLICIES.dots_with_no_batch_dims_saveable))
    # jax.checkpoint's default keeps each block's input alone: no per-layer GEMM output.
    per_layer_gemm = f"bf16[{L},{B * S},{D}]"  # a Linear's (B*T, D) output, stacked over L layers
    assert per_layer_gemm not in nothing
    # Encoder: Q, K, V, out, fc.0, fc.2; decoder: the same and a second attention's four (the
    # cross-attention's K and V are of the encoder output, (B*S, D): S = T here): 6 + 10 per
    # layer pair, all (B*T, D) (F = D).
    assert gemms.count(per_layer_gemm) == 16
    assert len(gemms) > len(nothing)


def test_a_policy_changes_no_parameter_and_no_value_of_the_train_step():
    plain = _model()
    policed = _model(remat=True, remat_policy=POLICIES.dots_saveable)
    assert jax.tree.structure(nnx.state(plain, nnx.Param)) == jax.tree.structure(nnx.state(policed, nnx.Param))
    for a, b in zip(jax.tree.leaves(nnx.state(plain, nnx.Param)), jax.tree.leaves(nnx.state(policed, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Adam with b1 = 0 and no clipping: the first moment after one update is the step's own
    # gradient, bit for bit ((1 - 0) * g + 0 * 0 == g), so the train step gives the gradients too.
    config = TrainConfig(schedule="constant", learning_rate=1e-3, b1=0.0, clip_norm=None)
    results = []
    for model in (plain, policed):
        trainer = Trainer(model, config)
        state, metrics = trainer.train_step(trainer.init_state(), _batch())  # jax.jit over nnx.merge
        results.append((float(metrics["loss"]), float(metrics["grad_norm"]), _gradients(state.opt_state)))
    (loss_a, norm_a, grads_a), (loss_b, norm_b, grads_b) = results
    # Recomputation repeats the same float32 operations: equal up to XLA fusing them differently.
    assert loss_a == pytest.approx(loss_b, rel=1e-6) and norm_a == pytest.approx(norm_b, rel=1e-5)
    assert len(grads_a) == len(jax.tree.leaves(nnx.state(plain, nnx.Param)))
    for a, b in zip(grads_a, grads_b, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


def _gradients(opt_state):
    """The parameters' gradients of the train step's loss on ``_batch()`` (dropout 0): Adam's
    first moment after one update at b1 = 0 without clipping (the ``ScaleByAdamState``'s ``mu``)."""
    adam, = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
             if isinstance(s, optax.ScaleByAdamState)]
    return jax.tree.leaves(adam.mu)


def test_a_policy_without_remat_is_refused_by_name():
    with pytest.raises(ValueError, match="remat_policy chooses what a rematerialised block keeps: it needs remat=True"):
        _model(remat_policy=POLICIES.dots_saveable)
    with pytest.raises(TypeError, match="remat_policy must be a jax.checkpoint policy"):
        _model(remat=True, remat_policy="dots_saveable")
