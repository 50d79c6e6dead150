"""Where the model's logical axes go on a device mesh: one rules table, ``LOGICAL_AXIS_RULES``.

The model names each parameter's axes (``model/axes.py``: ``vocab``, ``embed``, ``heads``,
``kv``, ``mlp``, ``length``); this table maps names to mesh axes, in the (logical, mesh axis)
pairs of t5x's ``logical_axis_rules`` (flaxformer/t5x ``docs/usage/partitioning.md``). A layout
is rows of it; the mesh has the axes ``('data', 'model')`` (sharding.py).

Tensor parallelism (Megatron-LM): Q/K/V and the first feed-forward layer are split by their
output columns over ``model`` (each device computes its own heads / hidden units, no
communication), the attention output projection and the second feed-forward layer by their
input rows (each device's partial product is summed by one all-reduce). That is just
``heads`` and ``mlp`` -> ``model``: XLA's sharding propagation derives the activations'
layout and the collectives from the parameters'.

A logical name with no rule, or ``None`` (e.g. a ``'layers'`` axis that ``nnx.scan`` puts in
front of stacked blocks), is not split: replicated along that axis.
"""

import re

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from flaxformer_mini.model.axes import EMBED, HEADS, MLP
from flaxformer_mini.model.paths import path_name

DATA_AXIS, MODEL_AXIS = "data", "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)


# One row per layout: (logical name, mesh axis) pairs. `--sharding` picks the row for the
# 'data' axis; a mesh with a 'model' axis (--mesh data=D,model=M) adds the 'tensor' row.
LOGICAL_AXIS_RULES = {
    # Plain data parallelism: every device holds every parameter.
    "replicated": (),
    # FSDP: each parameter split along its model width D over 'data' (XLA gathers it where a
    # computation needs it whole); the Adam moments follow their parameter.
    "fsdp": ((EMBED, DATA_AXIS),),
    # Megatron-style tensor parallelism over 'model': column-parallel in, row-parallel out.
    "tensor": ((HEADS, MODEL_AXIS), (MLP, MODEL_AXIS)),
}
STRATEGIES = ("replicated", "fsdp")  # the rows --sharding chooses from


def parse_mesh(text):
    """``'data=2,model=4'`` -> ``{'data': 2, 'model': 4}`` (an axis left out has size 1); a
    ValueError naming ``--mesh`` for anything else."""
    sizes = {}
    for part in str(text).split(","):
        name, eq, value = part.strip().partition("=")
        name = name.strip()
        if not eq or not name:
            raise ValueError(f"--mesh {text!r}: expected axis=size pairs separated by commas, e.g. --mesh data=2,model=4")
        if name not in MESH_AXES:
            raise ValueError(f"--mesh {text!r}: unknown axis {name!r}; the axes are {' and '.join(MESH_AXES)} "
                             f"(e.g. --mesh data=2,model=4)")
        if name in sizes:
            raise ValueError(f"--mesh {text!r}: the axis {name!r} is given twice")
        # int() alone would also take '2_0' (20) and non-ASCII digits.
        if not re.fullmatch(r"[+-]?[0-9]+", value.strip()):
            raise ValueError(f"--mesh {text!r}: the size of {name!r} must be an integer, got {value.strip()!r}")
        size = int(value)
        if size < 1:
            raise ValueError(f"--mesh {text!r}: the size of {name!r} must be >= 1, got {size}")
        sizes[name] = size
    return {axis: sizes.get(axis, 1) for axis in MESH_AXES}


def format_mesh(mesh):
    """``'data=2,model=4'``: a mesh (or {axis: size}) as ``--mesh`` writes it."""
    shape = dict(mesh.shape) if hasattr(mesh, "shape") and not isinstance(mesh, dict) else mesh
    return ",".join(f"{axis}={size}" for axis, size in shape.items())


def axis_rules(strategy, mesh_axes):
    """The (logical, mesh axis) pairs of a run: ``strategy``'s row, plus the 'tensor' row when
    the mesh has a 'model' axis. ``mesh_axes``: the mesh's axis names."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown sharding strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    rules = LOGICAL_AXIS_RULES[strategy]
    if MODEL_AXIS in mesh_axes:
        rules += LOGICAL_AXIS_RULES["tensor"]
    return rules


def logical_axes(variable):
    """The logical axis names a parameter was created with (NNX's ``out_sharding`` metadata),
    or None for an unannotated variable (RNG state, counters)."""
    names = variable.get_metadata().get("out_sharding") if isinstance(variable, nnx.Variable) else None
    return tuple(names) if names else None


def logical_spec(names, shape, rules, mesh_shape, where="an array"):
    """The PartitionSpec of an array with axes ``names`` of sizes ``shape`` under ``rules`` on
    a mesh of axis sizes ``mesh_shape`` ({'data': 2, 'model': 4}).

    Written here rather than with flax's ``nnx.get_partition_spec`` under
    ``nnx.logical_axis_rules``: flax passes a name with no rule through unchanged, as if it
    were a mesh axis, so an axis it has never heard of (a scan's 'layers') would fail instead
    of being replicated; and it checks no sizes. A name with no rule, a mesh axis this mesh
    lacks and a mesh axis of size 1 leave the array whole along that axis. A dimension that a
    mesh axis does not divide is refused (ValueError naming ``where`` and the sizes), rather
    than silently replicated: a layout asked for is the layout you get.
    """
    if names is None:
        return P()
    if len(names) != len(shape):
        raise ValueError(f"{where}: {len(names)} logical axis names {names} for an array of shape {tuple(shape)}")
    table = dict(rules)
    spec = []
    for i, (name, size) in enumerate(zip(names, shape)):
        axis = table.get(name)
        if axis is None or mesh_shape.get(axis, 1) == 1:
            spec.append(None)
            continue
        if axis in spec:
            raise ValueError(f"{where}: the rules put two of its axes {names} on the mesh axis {axis!r}")
        n = mesh_shape[axis]
        if size % n:
            raise ValueError(f"{where}: its axis {i} ({name!r}, size {size}) is not divisible by the mesh "
                             f"axis {axis!r} of size {n}")
        spec.append(axis)
    while spec and spec[-1] is None:  # P(None, 'model'), P('model'): the canonical, shortest form
        spec.pop()
    return P(*spec)


def state_specs(tree, rules, mesh_shape):
    """A PartitionSpec for every array of ``tree`` (a TrainState, an ``nnx.State``, any pytree):
    an annotated variable's from its logical names, everything else (scalars, the step, RNG
    keys and counters) ``P()``. The tree keeps its structure (a Variable holds its spec, as in
    ``nnx.get_partition_spec``). Optax's Adam moments are trees of the same Variables as the
    parameters, metadata included, so each moment gets its parameter's spec."""

    def spec(path, x):
        if isinstance(x, nnx.Variable):
            names = logical_axes(x)
            shape = () if names is None else np.shape(x.get_value())  # also an abstract (eval_shape) value
            return x.replace(logical_spec(names, shape, rules, mesh_shape, path_name(path)))
        return P()

    return jax.tree_util.tree_map_with_path(spec, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def named_shardings(tree, mesh, strategy="replicated"):
    """``state_specs`` as ``NamedSharding``s on ``mesh``, under ``axis_rules(strategy, mesh)``."""
    specs = state_specs(tree, axis_rules(strategy, mesh.axis_names), dict(mesh.shape))
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


# What a user sets each split size with, for check_divisible's messages.
SIZE_OPTIONS = {EMBED: "the width D (--embed-size)", HEADS: "--heads", MLP: "the feed-forward width F (--ffn-dim)"}


def check_divisible(sizes, strategy, mesh_shape, mesh_option):
    """Refuse, before anything runs, a model whose split axes a mesh axis does not divide.

    ``sizes``: {'embed': D, 'heads': H, 'mlp': F}. 'heads' is checked as the head count H,
    not H*K: Megatron splits whole heads, so each device attends with H/M complete heads.
    ``mesh_option`` names the option that chose the mesh (``--mesh data=2,model=4``).
    """
    for name, axis in axis_rules(strategy, tuple(mesh_shape)):
        n = mesh_shape.get(axis, 1)
        size = sizes.get(name)
        if n > 1 and size is not None and size % n:
            via = f"--sharding {strategy}" if axis == DATA_AXIS else "tensor parallelism"
            raise ValueError(f"{mesh_option} with {via} splits {name!r} over {axis}={n}, but "
                             f"{SIZE_OPTIONS.get(name, name)} is {size}, not divisible by {n}")
