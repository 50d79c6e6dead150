"""The ablation that recomputes the LayerNorms in the backward pass (``tools.ablations``'
``layer_norm_recomputed``, tools/ablation_variants.py), for the GPU lease that times it
(docs/benchmarks.md, "GPU").

Property checked: a scanned bfloat16 model keeps three float32 (L, B, T, D) arrays per
LayerNorm for its backward pass (the copies the H100's profile found), and none with the
LayerNorms recomputed.

Sizes: D=32, 4 heads, 3 layers a side (odd: the stacked axis), B=2, S=T=8.
"""

import contextlib
import io

import jax.numpy as jnp
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

import flaxformer_mini as fm
from tools import ablation_variants

L, B, S, D = 3, 2, 8, 32


def _loss(dtype, scan):
    """The model's summed logits as a function of its parameters, and those parameters."""
    model = fm.Transformer(0, 40, 40, 16, D, 4, L, 0.0, dtype=dtype, scan_layers=scan, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    source = jnp.arange(1, 1 + B * S).reshape(B, S) % 39 + 1
    target = source[:, ::-1]

    def loss(params):
        return nnx.merge(graphdef, params, rest, copy=True)(source, target).astype(jnp.float32).sum()

    return loss, params


def _float32_activations_kept(dtype, scan):
    """How many float32 (L, B, T, D) arrays (scanned) or (B, T, D) arrays (unscanned) autodiff
    keeps for the backward pass; JAX's public API prints them, a line each ("f32[3,2,8,32] ...")."""
    loss, state = _loss(dtype, scan)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(loss, state)
    per_layer = f"f32[{L},{B},{S},{D}]" if scan else f"f32[{B},{S},{D}]"
    return sum(line.split(" ")[0] == per_layer for line in printed.getvalue().splitlines())


@pytest.mark.parametrize("prevent_cse", [False, True])
def test_recomputed_layer_norms_leave_a_scanned_bfloat16_model_no_float32_activations_to_keep(prevent_cse):
    # Five LayerNorms per encoder + decoder layer pair, three float32 arrays each.
    assert _float32_activations_kept(jnp.bfloat16, scan=True) == 5 * 3
    with ablation_variants.layer_norms_recomputed(prevent_cse):
        assert _float32_activations_kept(jnp.bfloat16, scan=True) == 0
