"""flaxformer_mini's Linear is nnx.Linear computed over flattened (tokens, features) rows.

It exists for speed (docs/benchmarks.md, finding 2), so what must hold is that nothing
else changes: the same outputs and gradients as nnx.Linear for every input rank, and a
kernel gradient that is one plain matrix product contracting a single axis.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxformer_mini.model.primitives import Linear, linear


def _pair(use_bias):
    ours = linear(6, 5, use_bias=use_bias, rngs=nnx.Rngs(0))
    plain = nnx.Linear(6, 5, use_bias=use_bias, rngs=nnx.Rngs(1))
    nnx.update(plain, nnx.state(ours))  # the same parameters in both
    return ours, plain


@pytest.mark.parametrize("shape", [(6,), (3, 6), (2, 3, 6), (2, 3, 4, 6)], ids=["1d", "2d", "3d", "4d"])
@pytest.mark.parametrize("use_bias", [True, False], ids=["bias", "no-bias"])
def test_linear_equals_nnx_linear_in_value_and_gradient(shape, use_bias):
    ours, plain = _pair(use_bias)
    x = jax.random.normal(jax.random.key(2), shape)
    np.testing.assert_allclose(ours(x), plain(x), rtol=1e-6, atol=1e-6)
    assert ours(x).shape == shape[:-1] + (5,)

    def loss(model, x):
        return jnp.sum(jnp.sin(model(x)))  # a non-linear loss: gradients differ per element

    g_ours, gx_ours = nnx.grad(loss, argnums=(0, 1))(ours, x)
    g_plain, gx_plain = nnx.grad(loss, argnums=(0, 1))(plain, x)
    np.testing.assert_allclose(gx_ours, gx_plain, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g_ours["kernel"][...], g_plain["kernel"][...], rtol=1e-5, atol=1e-6)
    if use_bias:
        np.testing.assert_allclose(g_ours["bias"][...], g_plain["bias"][...], rtol=1e-5, atol=1e-6)


def test_kernel_gradient_contracts_one_flattened_axis():
    # The point of the class: over (B, T, D) nnx.Linear's kernel gradient contracts B and T
    # together, which XLA:CPU compiled into transposing copies; ours contracts one axis.
    def kernel_grad_contractions(layer):
        x = jnp.ones((4, 8, 6))
        jaxpr = jax.make_jaxpr(nnx.grad(lambda m: jnp.sum(m(x))))(layer)
        dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
        return sorted(len(e.params["dimension_numbers"][0][0]) for e in dots)

    ours, plain = _pair(True)
    assert isinstance(ours, Linear)
    assert kernel_grad_contractions(ours) == [1, 1]  # forward product, kernel gradient
    assert kernel_grad_contractions(plain) == [1, 2]
