"""Test-wide numerics: parity runs use exact float32 matmuls on both sides (DESIGN.md), and,
as in Equinox's tests, implicit rank promotion is an error so a missing axis is caught."""

import jax
import numpy as np
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
from parity import parity_numerics

parity_numerics()
jax.config.update("jax_numpy_rank_promotion", "raise")
torch.set_num_threads(2)

# The tolerance of DESIGN.md's parity policy (Hugging Face's PT/Flax standard).
ATOL = 1e-5


@pytest.fixture
def tiny_config():
    return fm.get_preset("tiny")


def assert_close(flax_value, torch_value, atol=ATOL):
    """Max absolute difference of a Flax and a torch value, in float64, within ``atol``."""
    a = np.asarray(flax_value, np.float64)
    b = torch_value.detach().cpu().numpy().astype(np.float64) if isinstance(torch_value, torch.Tensor) else np.asarray(torch_value, np.float64)
    assert a.shape == b.shape, f"shapes differ: Flax {a.shape}, torch {b.shape}"
    err = float(np.abs(a - b).max()) if a.size else 0.0
    assert err <= atol, f"max abs diff {err:.3e} > {atol:g}"
    return err


def flax_twin_of(torch_module, flax_cls, *args, **kwargs):
    """The Flax twin of ``torch_module`` (built with the same constructor arguments), holding
    its weights, in eval mode."""
    from parity import torch_to_flax

    model = flax_cls(*args, **kwargs, rngs=nnx.Rngs(0))
    torch_to_flax(torch_module.state_dict(), model)
    model.eval()
    return model
