"""Which framework's model an argument holds: the entry points (``torch_to_flax``,
``flax_to_torch``, ``compare``, ``compare_gradients``) check their model arguments here, so a
class for an instance, or the two models swapped, is named in one line instead of failing deep
inside Flax's or torch's traversals."""

import torch
from flax import nnx


def _what(value):
    if isinstance(value, type):
        return f"the class {value.__name__}"
    if isinstance(value, torch.nn.Module):
        return f"the torch module {type(value).__name__}"
    if isinstance(value, nnx.Module):
        return f"the Flax module {type(value).__name__}"
    return f"a {type(value).__name__}"


def check_flax_model(model, who, argument="flax_model", swapped=""):
    """Refuse (``TypeError``) ``model`` unless it is an ``nnx.Module`` instance. ``swapped``: the
    hint for a torch module given where the Flax model goes."""
    if isinstance(model, nnx.Module):
        return
    if isinstance(model, type) and issubclass(model, nnx.Module):
        hint = f"build it first: {model.__name__}(..., rngs=nnx.Rngs(0))"
    elif isinstance(model, torch.nn.Module):
        hint = swapped or "the torch model's weights are torch_model.state_dict()"
    else:
        hint = "an nnx.Module instance"
    raise TypeError(f"{who}: {argument} is the Flax model, got {_what(model)}: {hint}")


def check_torch_model(model, who, argument="torch_model", swapped=""):
    """Refuse (``TypeError``) ``model`` unless it is a ``torch.nn.Module`` instance."""
    if isinstance(model, torch.nn.Module):
        return
    if isinstance(model, type) and issubclass(model, torch.nn.Module):
        hint = f"build it first: {model.__name__}(...)"
    elif isinstance(model, nnx.Module):
        hint = swapped or "a torch.nn.Module instance"
    else:
        hint = "a torch.nn.Module instance"
    raise TypeError(f"{who}: {argument} is the torch model, got {_what(model)}: {hint}")


def check_pair(torch_model, flax_model, who, signature):
    """Both models of a comparison, each of its own framework; ``signature``: the call as it
    goes, said when the two are swapped."""
    swapped = f"the torch model comes first: {who}({signature})"
    check_torch_model(torch_model, who, swapped=swapped)
    check_flax_model(flax_model, who, swapped=swapped)
