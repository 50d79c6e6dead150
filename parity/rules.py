"""The conversion rules, as data: for each Flax layer type, which torch parameter becomes which
Flax variable, and which layout operations take one to the other. Needs no torch.

A ``Rule`` lists its layout operations in the torch -> Flax direction; ``parity.engine`` runs
them forward (torch -> Flax) or backward (Flax -> torch) with one numpy function, and computes
the torch shape a Flax variable expects by running them backward on the Flax shape. The kinds:

- ``Transpose(axes)``: ``np.transpose``; ``axes=None`` reverses (Linear: torch (out, in) -> Flax (in, out)).
- ``ChannelsLast()``: a convolution kernel, torch (O, I, *spatial) -> Flax (*spatial, I, O).
- ``Unflatten(axis, n)``: split ``axis`` into ``n`` axes, sizes read from the Flax shape
  (attention: torch's (H*K) -> Flax's (H, K)).
- ``Reshape(torch_shape)``: the same values in another shape (torch's ``nn.PReLU`` weight (1,)
  -> ``nnx.PReLU``'s scalar ``negative_slope``).
- ``Rule.part = (i, n)``: this Flax variable is chunk ``i`` of ``n`` along axis 0 of the torch
  tensor (``nn.MultiheadAttention.in_proj_weight`` = [q; k; v]); Flax -> torch concatenates.

Users extend the table without editing the package: ``parity.register_rule(MyLayer, Rule(...), ...)``.

``STACKS`` is the second table: which layer lists a module may hold as one stacked block
(scanned layers, ``flaxformer_mini/model/scanned.py``). There torch's ``encoder.transformer_layers.{i}.…``
is slice i of axis 0 of the stacked Flax variable ``encoder/transformer_layers/…``; the engine
stacks on load and slices on save, and each slice then goes through its layer's rules as any
other variable. A list held as an ``nnx.List`` (the default model) has its indices in the
paths already and needs nothing. ``parity.register_stack`` adds a container type.
"""

import dataclasses
from collections.abc import Mapping

import numpy as np
from flax import nnx

from flaxformer_mini.model import transformer as model
from flaxformer_mini.model import primitives


@dataclasses.dataclass(frozen=True)
class Transpose:
    axes: tuple | None = None  # None: reverse all axes


@dataclasses.dataclass(frozen=True)
class ChannelsLast:
    """torch's conv kernel (O, I, *spatial) <-> Flax's (*spatial, I, O)."""


@dataclasses.dataclass(frozen=True)
class Unflatten:
    axis: int
    n: int


@dataclasses.dataclass(frozen=True)
class Reshape:
    """torch's ``torch_shape`` <-> the Flax variable's shape, the same values in C order."""

    torch_shape: tuple

    def __post_init__(self):
        # A list would make the frozen dataclass unhashable and compare unequal to a tuple.
        object.__setattr__(self, "torch_shape", tuple(int(n) for n in self.torch_shape))


COPY = ()
TRANSPOSE = (Transpose(),)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One torch tensor (or one chunk of it) <-> one Flax variable of a layer.

    ``torch_name``: the tensor's name inside the torch module (dots allowed: ``"out_proj.weight"``).
    ``flax_name``: the variable's path inside the Flax module (slashes allowed: ``"query/kernel"``);
    ``None`` for a torch buffer with no Flax counterpart, which is read and dropped on load,
    and written back as ``torch_default`` on save: a scalar for a counter whose value the port
    has no use for (``num_batches_tracked``: any scalar loads), or an array for a constant the
    port recomputes (a persistent causal mask: the checkpoint's must equal it, shape, dtype kind
    and values, or the load is refused, since the port would compute with another).
    ``ops``: layout operations, torch -> Flax. ``part``: (i, n), chunk i of n along torch axis 0.
    ``unfused_name``: for a ``part``, the torch name the chunk has on its own when the chunks
    differ in shape past axis 0, so that no one tensor holds them (``nn.MultiheadAttention``
    with ``kdim``/``vdim`` other than ``embed_dim`` keeps ``q_proj_weight``, ``k_proj_weight``
    and ``v_proj_weight`` where it otherwise keeps one ``in_proj_weight``).
    """

    torch_name: str
    flax_name: str | None
    ops: tuple = COPY
    part: tuple | None = None
    # Left out of ==: an array's == is elementwise, and a Rule's is a dataclass's.
    torch_default: int | float | np.ndarray | None = dataclasses.field(default=None, compare=False)
    unfused_name: str | None = None

    def __post_init__(self):
        if np.ndim(self.torch_default) > 0:  # a constant; a scalar (numpy's too) stays a counter's default
            constant = np.array(self.torch_default, copy=True)  # the caller's array may change later
            constant.flags.writeable = False
            object.__setattr__(self, "torch_default", constant)
        # Checked here, not when flax_to_torch would write None as a tensor: a dropped key
        # needs a value to write back, and a weight tied to another is no torch-only buffer.
        if self.flax_name is None and self.torch_default is None:
            raise ValueError(
                f"Rule({self.torch_name!r}, None) drops a torch-only buffer on load and writes torch_default back "
                f"on save, but has no torch_default: give one (num_batches_tracked's is 0); for a weight tied "
                f"to another (lm_head.weight = embed.weight) pass tied={{{self.torch_name!r}: 'the key it is tied to'}} "
                f"to parity.torch_to_flax and parity.flax_to_torch instead")

    @property
    def op_names(self):
        """'copy', 'transpose', 'chunk 0/3, transpose, unflatten' ... for tables and errors."""
        names = [f"chunk {self.part[0]}/{self.part[1]}"] if self.part else []
        names += [type(op).__name__.lower() for op in self.ops]
        return ", ".join(names) or ("dropped (torch-only buffer)" if self.flax_name is None else "copy")


_LINEAR_RULES = (Rule("weight", "kernel", TRANSPOSE), Rule("bias", "bias"))
_CONV_RULES = (Rule("weight", "kernel", (ChannelsLast(),)), Rule("bias", "bias"))
_NORM_RULES = (Rule("weight", "scale"), Rule("bias", "bias"))


def _attention_rules():
    # nn.MultiheadAttention stores q, k, v as one (3*D, D) in_proj_weight (torch's Linear
    # layout, out x in); nnx.MultiHeadAttention has a LinearGeneral each, kernel (D, H, K).
    # Keys and values of another width (kdim, vdim; Flax's in_kv_features) have their own
    # q_proj_weight, k_proj_weight, v_proj_weight; the bias stays one in_proj_bias.
    rules = []
    for i, name in enumerate(("query", "key", "value")):
        rules.append(Rule("in_proj_weight", f"{name}/kernel", (Transpose(), Unflatten(1, 2)), part=(i, 3),
                          unfused_name=f"{name[0]}_proj_weight"))
        rules.append(Rule("in_proj_bias", f"{name}/bias", (Unflatten(0, 2),), part=(i, 3)))
    # out_proj: torch (D, H*K) -> Flax (H, K, D).
    rules.append(Rule("out_proj.weight", "out/kernel", (Transpose(), Unflatten(0, 2))))
    rules.append(Rule("out_proj.bias", "out/bias"))
    return tuple(rules)


RULES = {
    nnx.Linear: _LINEAR_RULES,
    # flaxformer_mini's Linear: the same parameters, computed over flattened leading axes.
    primitives.Linear: _LINEAR_RULES,
    nnx.Embed: (Rule("weight", "embedding"),),
    nnx.LayerNorm: _NORM_RULES,
    # flaxformer_mini's LayerNorm: the same parameters, with a backward pass of its own.
    primitives.LayerNorm: _NORM_RULES,
    nnx.Conv: _CONV_RULES,
    nnx.GroupNorm: _NORM_RULES,
    nnx.RMSNorm: (Rule("weight", "scale"),),
    # torch's running statistics are buffers; nnx.BatchNorm keeps them as nnx.BatchStat.
    nnx.BatchNorm: (*_NORM_RULES, Rule("running_mean", "mean"), Rule("running_var", "var"),
                    Rule("num_batches_tracked", None, torch_default=0)),
    nnx.MultiHeadAttention: _attention_rules(),
    # torch's nn.PReLU() holds its slope as a (1,) weight, nnx.PReLU as a scalar. A per-channel
    # nn.PReLU(num_parameters=C) has no nnx.PReLU counterpart and is refused by its shape.
    nnx.PReLU: (Rule("weight", "negative_slope", (Reshape((1,)),)),),
    # A tied head (flaxformer_mini's tie_embeddings): its bias alone is its own; its torch
    # weight is a copy of an embedding's (TIES, below).
    primitives.TiedLinear: (Rule("bias", "bias"),),
}


# The third table: layers whose torch weight is another layer's, held once in Flax (a tied
# head computed from the embedding table, a second side looking ids up in the first side's).
# {layer type: (the torch name of its copy, the attribute holding the layer it is tied to)};
# the copy's torch key is tied to that layer's own "weight" key (parity.tied.model_ties).
TIES = {
    primitives.TiedLinear: ("weight", "embed"),
    primitives.SharedEmbedding: ("weight", "embed"),
}


# {container type: attribute names of its layer lists that may be stacked}: both lists of the
# seq2seq Transformer, stacked by Encoder/Decoder(scan_layers=True).
STACKS = {
    model.Encoder: ("transformer_layers",),
    model.Decoder: ("decoder_layers",),
}


def check_table(rules):
    """Refuse, with a TypeError naming the problem, a ``rules=`` that is no rule table: a dict
    {Flax layer type: tuple of Rule}, as ``dict(RULES)`` extended by ``register_rule(...,
    table=)`` is (a list, or one Rule where a tuple belongs, failed deep inside the plan)."""
    if not isinstance(rules, Mapping):
        raise TypeError(f"rules is a table {{Flax layer type: (parity.Rule, ...)}}, such as dict(parity.RULES) "
                        f"extended by parity.register_rule(..., table=it), got a {type(rules).__name__}")
    bad = [f"{getattr(k, '__name__', repr(k))}: {v!r}" for k, v in rules.items()
           if not isinstance(k, type) or not isinstance(v, (tuple, list)) or not all(isinstance(r, Rule) for r in v)]
    if bad:
        raise TypeError(f"rules maps each Flax layer type (a class) to a tuple of parity.Rule; these entries do not: "
                        f"{'; '.join(bad[:3])}" + (f" ({len(bad)} in all)" if len(bad) > 3 else ""))


def register_stack(container_type, *names, table=None):
    """Teach the converter that ``container_type``'s attributes ``names`` may each be one
    stacked block (leading layer axis) standing for torch's list ``{name}.0``, ``{name}.1``, ...
    Replaces any names the type had."""
    if not isinstance(container_type, type):
        raise TypeError(f"register_stack needs a Flax module type (a class), got {container_type!r}")
    if not names or not all(isinstance(n, str) and n and "." not in n and "/" not in n for n in names):
        raise TypeError(f"register_stack({container_type.__name__}, ...) needs attribute names, got {names!r}")
    (STACKS if table is None else table)[container_type] = tuple(names)
    return container_type


def register_rule(layer_type, *rules, table=None):
    """Teach the converter a Flax layer type: ``register_rule(MyLayer, Rule("w", "kernel", TRANSPOSE))``.

    Replaces any rules the type had. The layer's own variables must all be covered, or the
    plan refuses the model naming the ones left over.
    """
    if not isinstance(layer_type, type):
        raise TypeError(f"register_rule needs a Flax layer type (a class), got {layer_type!r}")
    if not rules or not all(isinstance(r, Rule) for r in rules):
        raise TypeError(f"register_rule({layer_type.__name__}, ...) needs one or more parity.Rule, got {rules!r}")
    (RULES if table is None else table)[layer_type] = tuple(rules)
    return layer_type
