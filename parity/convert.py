"""torch <-> Flax weight conversion, driven by one declarative table of rules.

The table says, for each Flax layer type, which torch parameter becomes which Flax
parameter and how. Keys are never guessed from names or shapes: the Flax model is walked,
each layer found is looked up in ``RULES``, and that yields the exact set of torch keys the
model expects. A parameter no rule covers is refused (the converter never half-handles a
model it does not understand).

torch key                                   Flax path                                       rule
encoder.transformer_layers.0.attention.W_q.weight  encoder/transformer_layers/0/attention/W_q/kernel  transpose
encoder.embedding_layer.weight              encoder/embedding_layer/embedding               copy
encoder.transformer_layers.0.norm1.weight   encoder/transformer_layers/0/norm1/scale        copy
"""

import dataclasses
import difflib
import re
from collections import defaultdict
from typing import Callable

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch
from flax import nnx

from flaxformer_mini import primitives


class ConversionError(ValueError):
    """A state dict does not fit a model. Lists every offending key at once.

    Attributes: ``missing`` (expected keys absent from the state dict), ``unexpected`` (keys
    the model has no place for), ``mismatched`` ({key: (got_shape, expected_shape)}) and
    ``invalid`` ({key: why}) for values that are not float arrays.
    """

    def __init__(self, message, *, missing=(), unexpected=(), mismatched=None, invalid=None):
        super().__init__(message)
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.mismatched = dict(mismatched or {})
        self.invalid = dict(invalid or {})


def _copy(a):
    return a


def _transpose(a):
    # torch.nn.Linear stores weight as (out, in) and computes x @ W.T; nnx.Linear stores
    # kernel as (in, out) and computes x @ kernel.
    return np.ascontiguousarray(a.T)


@dataclasses.dataclass(frozen=True)
class Rule:
    torch_name: str  # the torch parameter's name inside its module: "weight"
    flax_name: str  # the Flax parameter's attribute: "kernel"
    to_flax: Callable[[np.ndarray], np.ndarray]
    to_torch: Callable[[np.ndarray], np.ndarray]


_LINEAR_RULES = (Rule("weight", "kernel", _transpose, _transpose), Rule("bias", "bias", _copy, _copy))

RULES = {
    nnx.Linear: _LINEAR_RULES,
    # flaxformer_mini's Linear: the same parameters, computed over flattened leading axes.
    primitives.Linear: _LINEAR_RULES,
    nnx.Embed: (Rule("weight", "embedding", _copy, _copy),),
    nnx.LayerNorm: (Rule("weight", "scale", _copy, _copy), Rule("bias", "bias", _copy, _copy)),
}


@dataclasses.dataclass(frozen=True)
class _Entry:
    module: nnx.Module
    rule: Rule
    module_path: tuple

    @property
    def flax_path(self):
        return "/".join(map(str, (*self.module_path, self.rule.flax_name)))

    @property
    def param(self) -> nnx.Param:
        return getattr(self.module, self.rule.flax_name)

    @property
    def torch_shape(self):
        shape = tuple(self.param.get_value().shape)
        return shape[::-1] if self.rule.to_flax is _transpose else shape


def _plan(model):
    """Map every torch key the model expects to the Flax parameter it fills."""
    plan, covered = {}, set()
    for path, module in nnx.iter_modules(model):
        rules = RULES.get(type(module))
        if rules is None:
            continue
        for rule in rules:
            param = getattr(module, rule.flax_name, None)
            if param is None:  # e.g. a Linear built with use_bias=False
                continue
            key = ".".join(str(p) for p in (*path, rule.torch_name))
            plan[key] = _Entry(module, rule, tuple(path))
            covered.add((*path, rule.flax_name))
    uncovered = sorted(
        "/".join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param)) if path not in covered
    )
    if uncovered:
        raise ConversionError(
            f"no conversion rule covers these parameters of {type(model).__name__}: {', '.join(uncovered)}; "
            f"parity.RULES handles {', '.join(t.__name__ for t in RULES)}"
        )
    return plan


def torch_key_shapes(model):
    """{torch key: torch-layout shape} that ``torch_to_flax`` expects for ``model``."""
    return {key: entry.torch_shape for key, entry in _plan(model).items()}


@dataclasses.dataclass(frozen=True)
class ParamLink:
    """One parameter as both frameworks name and lay it out."""

    torch_key: str  # 'encoder.transformer_layers.0.attention.W_q.weight'
    flax_path: str  # 'encoder/transformer_layers/0/attention/W_q/kernel'
    rule: Rule
    torch_shape: tuple
    flax_shape: tuple


def param_links(model):
    """A ``ParamLink`` for every parameter of the Flax model ``model`` (which may be abstract,
    from ``nnx.eval_shape``), in the model's order. For converters that move arrays without
    JAX (files, any dtype): ``rule.to_flax`` / ``rule.to_torch`` do the layout change."""
    return [
        ParamLink(key, e.flax_path, e.rule, e.torch_shape, tuple(e.param.get_value().shape))
        for key, e in _plan(model).items()
    ]


def tensor_to_numpy(value):
    """A torch tensor (any float dtype, bfloat16 included) or array-like -> numpy array."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:  # numpy has no bfloat16; ml_dtypes' is bit-identical
            return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return value.numpy()
    return np.asarray(value)


def numpy_to_tensor(array):
    array = np.ascontiguousarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        # .copy(), as below: np.asarray of a jax array is a read-only view of its buffer, and a
        # tensor wrapping it would let in-place torch ops write into the Flax parameter.
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())


_LAYER_INDEX = re.compile(r"^(.*?)\.(\d+)\.")


def layer_depths(keys):
    """{list prefix: number of blocks} from keys like ``encoder.transformer_layers.5.norm1.weight``
    (the first ``.N.`` in a key is the layer index): highest index + 1 per prefix."""
    out = defaultdict(int)
    for key in keys:
        m = _LAYER_INDEX.match(str(key))
        if m:
            out[m.group(1)] = max(out[m.group(1)], int(m.group(2)) + 1)
    return dict(out)


def _depth_hints(expected, got):
    """'encoder.transformer_layers: checkpoint has 6 layers, the model 2' for each list."""
    have, want = layer_depths(got), layer_depths(expected)
    return [
        f"{prefix} has {have[prefix]} layers in the checkpoint, {want[prefix]} in the model"
        for prefix in sorted(want)
        if prefix in have and have[prefix] != want[prefix]
    ]


def _closest(key, candidates):
    match = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def check_state_dict(state_dict, model):
    """Everything wrong with loading ``state_dict`` into ``model``, as a ConversionError, or
    the converted Flax arrays {key: array} when nothing is."""
    plan = _plan(model)
    if not hasattr(state_dict, "keys"):
        raise ConversionError(f"expected a mapping of torch key -> tensor, got {type(state_dict).__name__}")
    given = list(state_dict.keys())
    missing = [k for k in plan if k not in state_dict]
    unexpected = [k for k in given if k not in plan]
    mismatched, invalid, converted = {}, {}, {}
    for key in given:
        if key not in plan:
            continue
        try:
            value = tensor_to_numpy(state_dict[key])
        except Exception as e:  # noqa: BLE001 - reported with the key, below
            invalid[key] = f"cannot read as an array ({e})"
            continue
        if not np.issubdtype(value.dtype, np.floating) and value.dtype != ml_dtypes.bfloat16:
            invalid[key] = f"dtype {value.dtype} is not a floating-point dtype"
            continue
        entry = plan[key]
        if tuple(value.shape) != entry.torch_shape:
            mismatched[key] = (tuple(value.shape), entry.torch_shape)
            continue
        param = entry.param.get_value()
        # Cast to the parameter's dtype, as torch's load_state_dict copies into its own.
        # copy=True: on CPU jnp.asarray may wrap the numpy buffer without copying, and that
        # buffer is the torch tensor's own memory (Tensor.numpy() shares it), so an in-place
        # torch update after loading (an optimizer step) would silently change the Flax params.
        converted[key] = jnp.array(entry.rule.to_flax(value), dtype=param.dtype, copy=True)

    if missing or unexpected or mismatched or invalid:
        lines = [f"state dict does not fit {type(model).__name__}:"]
        lines += _depth_hints(list(plan), given)
        for key in missing:
            lines.append(f"  missing key {key!r}{_closest(key, unexpected)}")
        for key in unexpected:
            # Suggest only keys that are missing: a key the checkpoint already supplies is never
            # what an extra key was meant to be (an extra layer would "mean" the layer before it).
            lines.append(f"  unexpected key {key!r}{_closest(key, missing)}")
        for key, (got, want) in mismatched.items():
            hint = ""
            if len(got) == 2 and got == want[::-1] and plan[key].rule.to_flax is _transpose:
                hint = " (looks transposed: torch Linear weights are (out_features, in_features))"
            lines.append(f"  shape mismatch for {key!r}: checkpoint {got}, model expects {want}{hint}")
        for key, why in invalid.items():
            lines.append(f"  invalid value for {key!r}: {why}")
        raise ConversionError(
            "\n".join(lines), missing=missing, unexpected=unexpected, mismatched=mismatched, invalid=invalid
        )
    return plan, converted


def torch_to_flax(state_dict, model):
    """Load a torch state dict (key -> tensor or array) into the Flax twin ``model``, in place.

    Strict: any missing key, unexpected key or shape mismatch raises ConversionError naming
    all of them, and ``model`` is left exactly as it was. Returns ``model``.
    """
    plan, converted = check_state_dict(state_dict, model)
    # Every value is converted before the first assignment, so nothing is half-loaded.
    for key, value in converted.items():
        plan[key].param.set_value(value)
    return model


def flax_to_torch(model):
    """The torch state dict of the Flax twin ``model``; the torch twin loads it with strict=True."""
    return {
        key: numpy_to_tensor(entry.rule.to_torch(np.asarray(entry.param.get_value())))
        for key, entry in _plan(model).items()
    }
