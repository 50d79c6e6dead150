"""The one conversion engine: a plan from the Flax model and the rules, applied by numpy.

``plan(model, rules)`` walks the Flax model (live, or abstract from ``nnx.eval_shape``), looks
each layer's type up in the rules and yields one ``Link`` per Flax variable that stands for
state a torch state dict holds (``STATE``: parameters, batch statistics, and a port's own
``nnx.Variable`` types for torch buffers): its Flax path, the torch key it comes from and that
key's torch shape. Keys are never guessed from names or shapes. A variable no rule covers is
refused, naming the variable, its layer type and its variable type.

A stacked block (scanned layers: one module whose variables carry a leading layer axis L,
declared in ``parity.rules.STACKS``) yields L Links per variable, one per layer: Link i names
torch's ``….{i}.…`` key and slice i of the Flax variable (``layer=i``, ``flax_shape`` the
slice's shape). The plan lists them layer by layer, in the unscanned model's order.

``to_flax(plan, arrays)`` / ``to_torch(plan, arrays)`` move numpy arrays between the two
layouts (every dtype bit for bit: no JAX, which would narrow float64), for arrays in memory and
files alike; ``check_torch`` is the one strict checker of a torch-keyed mapping. No torch here.
"""

import dataclasses
import difflib
import re
from collections import defaultdict

import ml_dtypes
import numpy as np
from flax import nnx

from parity import rules as _rules
from parity.wrapper_prefix import prefix_hint


class ConversionError(ValueError):
    """A state dict does not fit a model. Lists every offending key at once.

    Attributes: ``missing`` (expected keys absent from the state dict), ``unexpected`` (keys
    the model has no place for), ``mismatched`` ({key: (got_shape, expected_shape)}) and
    ``invalid`` ({key: why}) for values of the wrong dtype kind (a non-float value for a float
    variable, a float for an integer buffer) or tied copies that differ from their source.
    """

    def __init__(self, message, *, missing=(), unexpected=(), mismatched=None, invalid=None):
        super().__init__(message)
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.mismatched = dict(mismatched or {})
        self.invalid = dict(invalid or {})


# Variable types that are never in a torch state dict: nnx.Rngs' keys and counts (torch keeps
# its generator outside the module), decoding caches (nnx.MultiHeadAttention(decode=True)'s
# cached keys and values; torch's caches are call arguments), values sown or captured during a
# call (nnx.Intermediate, nnx.Perturbation), and an optimizer's or a metric's state. Every other
# nnx.Variable is model state: nnx.Param (torch's parameters), nnx.BatchStat (BatchNorm's
# running statistics) and a port's own non-trainable types, the natural port of torch's
# register_buffer (``class Buffer(nnx.Variable)``: not an nnx.Param, so no gradient and no
# optimizer update, as a torch buffer gets none).
_NOT_STATE = (nnx.RngState, nnx.Cache, nnx.Intermediate, nnx.OptState, nnx.metrics.MetricState)
STATE = nnx.Not(nnx.Any(*_NOT_STATE))  # an nnx filter: the variables a conversion moves


@dataclasses.dataclass(frozen=True)
class Link:
    """One Flax variable and the torch tensor (or chunk of one) it comes from."""

    torch_key: str  # 'encoder.transformer_layers.0.attention.W_q.weight'
    flax_path: str | None  # 'encoder/transformer_layers/0/attention/W_q/kernel'; None: torch-only buffer
    rule: _rules.Rule
    layer_type: type
    flax_shape: tuple  # of this Link's slice, for a stacked variable
    flax_dtype: object
    layer: int | None = None  # a stacked variable's slice along axis 0; None: the whole variable
    depth: int | None = None  # a stacked variable's number of layers L

    @property
    def variable_shape(self):
        """The Flax variable's shape: the stacked (L, *flax_shape) for a layer's slice."""
        return self.flax_shape if self.layer is None else (self.depth, *self.flax_shape)

    @property
    def torch_shape(self):
        """This variable's shape in torch's layout (a chunk's, for a ``part``)."""
        if self.flax_path is None:  # a torch-only buffer: its rule's torch_default is what torch holds
            return tuple(np.shape(self.rule.torch_default))
        shape = self.flax_shape
        for op in reversed(self.rule.ops):
            shape = _inverse_shape(op, shape)
        return shape


def _perm(op, ndim):
    if isinstance(op, _rules.ChannelsLast):
        return (*range(2, ndim), 1, 0)  # (O, I, *spatial) -> (*spatial, I, O)
    return tuple(reversed(range(ndim))) if op.axes is None else tuple(op.axes)


def _inverse_shape(op, shape):
    if isinstance(op, (_rules.Transpose, _rules.ChannelsLast)):
        inv = np.argsort(_perm(op, len(shape)))
        return tuple(shape[i] for i in inv)
    if isinstance(op, _rules.Unflatten):
        a = op.axis
        return (*shape[:a], int(np.prod(shape[a:a + op.n])), *shape[a + op.n:])
    if isinstance(op, _rules.Reshape):
        if int(np.prod(op.torch_shape)) != int(np.prod(shape)):
            raise ConversionError(f"Reshape({op.torch_shape}) cannot stand for a Flax variable of shape {tuple(shape)}: "
                                  f"they hold {int(np.prod(op.torch_shape))} and {int(np.prod(shape))} values")
        return op.torch_shape
    raise TypeError(f"unknown layout operation {op!r}")


def _forward(op, array, flax_shape_after):
    """One op, torch -> Flax. ``flax_shape_after``: the shape this op produces."""
    if isinstance(op, (_rules.Transpose, _rules.ChannelsLast)):
        return np.transpose(array, _perm(op, array.ndim))
    return array.reshape(flax_shape_after)


def _backward(op, array, shape_before):
    if isinstance(op, (_rules.Transpose, _rules.ChannelsLast)):
        return np.transpose(array, np.argsort(_perm(op, array.ndim)))
    return array.reshape(shape_before)


def _shapes(link):
    """Shapes along the op chain, torch side first, Flax side last."""
    shapes = [link.flax_shape]
    for op in reversed(link.rule.ops):
        shapes.append(_inverse_shape(op, shapes[-1]))
    return shapes[::-1]


def array_to_flax(link, array):
    shapes = _shapes(link)
    for op, after in zip(link.rule.ops, shapes[1:]):
        array = _forward(op, array, after)
    return np.array(array, copy=True)  # contiguous, and never a view of the caller's buffer


def array_to_torch(link, array):
    shapes = _shapes(link)
    array = np.asarray(array)
    for op, before in zip(reversed(link.rule.ops), reversed(shapes[:-1])):
        array = _backward(op, array, before)
    return np.array(array, copy=True)


class Plan(dict):
    """{torch key: [Link, ...]} (several Links for a tensor split in chunks), in model order."""

    @property
    def links(self):
        return [link for links in self.values() for link in links]

    def torch_shape(self, key):
        links = self[key]
        if links[0].rule.part is None:
            return links[0].torch_shape
        first = links[0].torch_shape
        return (sum(link.torch_shape[0] for link in links), *first[1:])


def _value(var):
    return var.get_value() if hasattr(var, "get_value") else var.value


def plan(model, rules=None, stacks=None):
    """The conversion plan of the Flax ``model`` under ``rules`` (default: ``parity.RULES``)
    and ``stacks`` (default: ``parity.rules.STACKS``)."""
    rules = _rules.RULES if rules is None else rules
    _rules.check_table(rules)
    modules = {tuple(path): module for path, module in nnx.iter_modules(model)}
    depths = _stacked_depths(modules, _rules.STACKS if stacks is None else stacks)
    entries, covered = [], set()  # entries: (order, torch key, Link)
    absent = {}  # {layer type: (a rule naming an attribute its module lacks, that name, the module)}
    # A rule naming a sublayer's variable ("query/kernel") covers that sublayer: it is not
    # looked up on its own (MultiHeadAttention's LinearGenerals).
    owners = [path for path, module in modules.items()
              if any(r.flax_name and "/" in r.flax_name for r in rules.get(type(module), ()))]
    index = {path: i for i, path in enumerate(modules)}
    for path, module in modules.items():
        if any(len(path) > len(o) and path[:len(o)] == o for o in owners):
            continue
        layer_rules = rules.get(type(module))
        if layer_rules is None:
            continue
        root = next((r for r in depths if path[:len(r)] == r), None)
        for r, rule in enumerate(layer_rules):
            if rule.flax_name is None:
                if root is not None:
                    raise ConversionError(f"{'/'.join(map(str, path))}: a torch-only buffer ({rule.torch_name!r}) "
                                          f"inside a stacked block is not supported")
                key = ".".join(map(str, (*path, rule.torch_name)))
                entries.append(((index[path], 0, index[path], r), key, Link(key, None, rule, type(module), (), None)))
                continue
            var = module
            for name in rule.flax_name.split("/"):
                if var is not None and not hasattr(var, name):  # no such attribute: a misspelt rule?
                    absent.setdefault(type(module), (rule, name, module))
                var = getattr(var, name, None)
            if var is None:  # e.g. a Linear built with use_bias=False: no bias, no key
                continue
            value = _value(var)
            flax_path = "/".join(map(str, (*path, rule.flax_name)))
            covered.add(flax_path)
            if root is None:
                key = ".".join(map(str, (*path, rule.torch_name)))
                link = Link(key, flax_path, rule, type(module), tuple(value.shape), value.dtype)
                entries.append(((index[path], 0, index[path], r), key, link))
                continue
            # Layer i of a stacked block: torch's index goes right after the list's name, and
            # the entries sort layer by layer (all of layer 0, then layer 1, ...), as the
            # unscanned model's do.
            L, inner = depths[root], path[len(root):]
            for i in range(L):
                key = ".".join(map(str, (*root, i, *inner, rule.torch_name)))
                link = Link(key, flax_path, rule, type(module), tuple(value.shape[1:]), value.dtype, layer=i, depth=L)
                entries.append(((index[root], i, index[path], r), key, link))
    out = Plan()
    for _, key, link in sorted(entries, key=lambda e: e[0]):
        out.setdefault(key, []).append(link)
    for links in out.values():
        links.sort(key=lambda link: link.rule.part or (0, 1))
    out = _unfuse(out)
    uncovered = []
    by_kind = defaultdict(list)  # {variable type name: [Flax path]}, of the uncovered ones
    for path, var in nnx.to_flat_state(nnx.state(model, STATE)):
        text = "/".join(map(str, path))
        if text not in covered:
            layer = modules.get(tuple(path[:-1]), model)
            uncovered.append(f"{text} (a {type(layer).__name__})")
            by_kind[type(var).__name__].append(text)
    if uncovered:
        # The variable types, so a buffer ported as its own nnx.Variable type is seen as one.
        kinds = ", ".join(f"{kind} ({', '.join(paths)})" for kind, paths in by_kind.items())
        # A table of one's own (register_rule(..., table=T)) reaches only the calls given rules=T:
        # forgetting one of them reads as a rule never registered, so the message says so.
        where = ("parity.register_rule adds a layer type to parity.RULES, the default; one registered with "
                 "table=T is used only by calls given rules=T" if rules is _rules.RULES else
                 "parity.register_rule(..., table=rules) adds a layer type to this table")
        raise ConversionError(
            f"no conversion rule covers these variables of {type(model).__name__}: {', '.join(uncovered)}; "
            f"the rules handle {', '.join(_type_names(rules))} ({where}); "
            f"their variable types: {kinds}{_buffer_hint(by_kind)}{_absent_hint(absent)}"
        )
    return out


def _absent_hint(absent):
    """The rules that name an attribute their layer does not have (a misspelt flax_name reads
    as a variable no rule covers), each with the layer's nearest variable name."""
    lines = []
    for layer_type, (rule, name, module) in absent.items():
        names = [str(path[-1]) for path, _ in nnx.to_flat_state(nnx.state(module, STATE))]
        lines.append(f"{layer_type.__name__}'s Rule({rule.torch_name!r}, {rule.flax_name!r}) names {name!r}, which "
                     f"it does not have{did_you_mean(name, names)}")
    return "; " + "; ".join(lines) if lines else ""


def _buffer_hint(by_kind):
    """For variables that are not parameters (a port's buffers, or arrays held as plain
    attributes, which NNX keeps as state too): what a rule for one looks like, and what to do
    for a torch buffer registered with persistent=False, which no state dict holds."""
    others = [path for kind, paths in by_kind.items() if kind != "Param" for path in paths]
    if not others:
        return ""
    name = others[0].rpartition("/")[2]
    return (f"; a torch buffer (register_buffer) needs a rule on the module that holds it "
            f"(parity.Rule({name!r}, {name!r})), and one registered with persistent=False is in no state dict: "
            f"compute it in __call__ rather than hold it as an array")


def _unfuse(the_plan):
    """``the_plan`` with each tensor split in chunks whose torch shapes differ past axis 0 (no
    one tensor holds them) planned as one key per chunk, the rule's ``unfused_name``: torch's
    own choice for such layers (``nn.MultiheadAttention``'s kdim/vdim). A chunk without one
    leaves the plan unloadable: refused here, naming the key and the shapes."""
    out = Plan()
    for key, links in the_plan.items():
        if links[0].rule.part is None or len({link.torch_shape[1:] for link in links}) == 1:
            out[key] = links
            continue
        shapes = ", ".join(f"{link.flax_path} {link.torch_shape}" for link in links)
        if any(link.rule.unfused_name is None for link in links):
            raise ConversionError(f"{key!r}: its {len(links)} chunks have torch shapes that differ past axis 0 "
                                  f"({shapes}), so no one tensor holds them; give each chunk's Rule the name it "
                                  f"has on its own (Rule(..., unfused_name=...))")
        for link in links:
            name = link.rule.unfused_name
            own = key.removesuffix(link.rule.torch_name) + name
            rule = dataclasses.replace(link.rule, torch_name=name, part=None)
            out[own] = [dataclasses.replace(link, torch_key=own, rule=rule)]
    return out


def _stacked_depths(modules, stacks):
    """{path of a stacked block: its number of layers L}, for each layer list that ``stacks``
    declares and the model holds as one module rather than an ``nnx.List``. L is the leading
    axis every variable of the block shares; a block whose variables disagree is refused."""
    depths = {}
    for path, module in modules.items():
        for name in stacks.get(type(module), ()):
            block = getattr(module, name, None)
            if not isinstance(block, nnx.Module) or isinstance(block, nnx.List):
                continue
            shapes = [tuple(_value(var).shape) for _, var in nnx.to_flat_state(nnx.state(block, STATE))]
            leading = {shape[0] if shape else None for shape in shapes}  # works on abstract (eval_shape) models
            root = (*path, name)
            if len(leading) != 1 or None in leading:
                raise ConversionError(
                    f"{'/'.join(map(str, root))} should be a stacked block (layer axis first on every variable), "
                    f"but its variables' leading axes are {sorted(leading, key=str)}")
            depths[root] = leading.pop()
    return depths


def _type_names(types):
    names = [t.__name__ for t in types]
    return [f"{t.__module__}.{t.__name__}" if names.count(t.__name__) > 1 else t.__name__ for t in types]


def to_flax(the_plan, arrays):
    """{Flax path: numpy array, Flax layout} from checked {torch key: numpy array}; a stacked
    variable's layers are stacked along axis 0."""
    out, layers = {}, defaultdict(dict)
    for key, links in the_plan.items():
        if links[0].flax_path is None:
            continue  # a torch-only buffer, dropped by its rule
        chunks = _split(arrays[key], links)
        for link, chunk in zip(links, chunks):
            if link.flax_path is None:
                continue
            if link.layer is None:
                out[link.flax_path] = array_to_flax(link, chunk)
            else:
                layers[link.flax_path][link.layer] = array_to_flax(link, chunk)
    for path, by_layer in layers.items():
        out[path] = np.stack([by_layer[i] for i in range(len(by_layer))])
    return out


def to_torch(the_plan, arrays):
    """{torch key: numpy array, torch layout} from {Flax path: array}, in the plan's order."""
    out = {}
    for key, links in the_plan.items():
        if links[0].flax_path is None:
            default = links[0].rule.torch_default
            if isinstance(default, np.ndarray):  # a constant the port recomputes: as the rule holds it
                out[key] = np.array(default, copy=True)
                continue
            # torch's own dtypes for a Python number: int64 (num_batches_tracked), else float32.
            out[key] = np.array(default, dtype=np.int64 if isinstance(default, (int, np.integer)) else np.float32)
            continue
        parts = [array_to_torch(link, _slice(link, arrays[link.flax_path])) for link in links]
        out[key] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return out


def _slice(link, array):
    return array if link.layer is None else np.asarray(array)[link.layer]


def _split(array, links):
    if links[0].rule.part is None:
        return [array]
    sizes = np.cumsum([link.torch_shape[0] for link in links])[:-1]
    return np.split(array, sizes, axis=0)


# ----------------------------------------------------------------------------- the strict checker

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
    have, want = layer_depths(got), layer_depths(expected)
    return [
        f"{prefix} has {have[prefix]} layers in the checkpoint, {want[prefix]} in the model"
        for prefix in sorted(want)
        if prefix in have and have[prefix] != want[prefix]
    ]


def did_you_mean(key, candidates, shape=None, shapes=None):
    """A "did you mean" among ``candidates`` whose shape (``shapes``: {candidate: shape}) is
    ``key``'s ``shape``, where both are known: a name alone pairs an LSTM's weight_hh with a
    kernel of another size as readily as with the right one."""
    if shape is not None and shapes is not None:
        candidates = [c for c in candidates if shapes.get(c) in (None, shape)]
    # A pickle may hold int keys beside str ones; difflib compares strings only.
    candidates = [c for c in candidates if isinstance(c, str)]
    match = difflib.get_close_matches(str(key), candidates, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _shape_of(value):
    """A value's shape without reading it (torch, numpy, jax and lazy arrays have one), or None."""
    shape = getattr(value, "shape", None)
    try:
        return None if shape is None else tuple(int(n) for n in shape)
    except TypeError:
        return None


def _tie_hint(key, arrays, read, loaded, user_name):
    """An unexpected key equal, bit for bit, to a key that loaded: a weight tied in torch
    (``lm_head.weight = embed.weight`` writes both keys) that the call was not told of. Named
    as ``tied=`` takes them, in the user's names (``user_name``: before a rename map)."""
    try:
        value = np.asarray(read(arrays[key]))
    except Exception:  # noqa: BLE001 - only a hint: the key is reported unexpected either way
        return ""
    if value.size == 0 or np.all(value == value.flat[0]):
        # One repeated value (a fresh LayerNorm's ones, a bias's zeros) equals every other such
        # tensor of its shape by chance: a port that left out a layer is no tied weight.
        return ""
    for source, array in loaded.items():
        if array.shape == value.shape and array.dtype == value.dtype and np.array_equal(array, value, equal_nan=True):
            copy, kept = user_name(key), user_name(source)
            return f" (equal to {kept!r} bit for bit: a tied weight? pass tied={{{copy!r}: {kept!r}}})"
    return ""


def _is_float_dtype(dtype):
    return np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16


def _kind(dtype):
    """'floating-point', 'integer', 'boolean', 'complex' or another kind's letter: what may load into what."""
    if _is_float_dtype(dtype):
        return "floating-point"
    dtype = np.dtype(dtype)
    return {"i": "integer", "u": "integer", "b": "boolean", "c": "complex"}.get(dtype.kind, dtype.kind)


def dtype_refusal(array, want):
    """Why ``array`` cannot load into a Flax variable of dtype ``want``, or None.

    A float variable takes any float value, cast as torch's load_state_dict casts (and never an
    integer: torch would silently cast an int64 weight to float). A variable of another kind (a
    torch int64 ``position_ids`` buffer ported as int32: JAX's default integer without x64)
    takes a value of the same kind whose values fit its dtype, so the cast changes no value.
    """
    got = _dtype_of(array)
    if want is None or _is_float_dtype(want):
        return None if _is_float_dtype(got) else f"dtype {got} is not a floating-point dtype"
    if _kind(got) != _kind(want):
        article = "an" if _kind(want)[0] in "aeiou" else "a"
        return f"dtype {got} is not {article} {_kind(want)} dtype (the model's variable is {np.dtype(want)})"
    if _kind(want) == "integer" and np.size(array):
        values, bounds = np.asarray(array), np.iinfo(want)
        low, high = values.min(), values.max()
        if low < bounds.min or high > bounds.max:
            return f"values {low}..{high} do not fit the model's {np.dtype(want)} variable"
    return None


def check_torch(the_plan, arrays, what, read=np.asarray, invalid=None, user_name=None):
    """Raise one ConversionError naming everything wrong with {torch key: value} for the plan,
    or return {torch key: numpy array}. ``read`` turns a value into a numpy array; ``invalid``:
    {key: why} found before (a tied copy that differs from its source), reported with the rest;
    ``user_name``: a key's name in the user's state dict (under a rename map), for hints."""
    if not hasattr(arrays, "keys"):
        raise ConversionError(f"expected a mapping of torch key -> tensor, got {type(arrays).__name__}")
    given = list(arrays.keys())
    missing = [k for k in the_plan if k not in arrays and the_plan[k][0].flax_path is not None]
    unexpected = [k for k in given if k not in the_plan]
    mismatched, invalid, out = {}, dict(invalid or {}), {}
    for key in given:
        if key not in the_plan:
            continue
        try:
            value = read(arrays[key])
        except Exception as e:  # noqa: BLE001 - reported with the key, below
            invalid[key] = f"cannot read as an array ({e})"
            continue
        if the_plan[key][0].flax_path is None:
            # A torch-only buffer: read, and dropped by its rule. Under a scalar torch_default (a
            # counter: num_batches_tracked) only a scalar: a tensor dropped so would be lost
            # without a word (and saved back as a scalar torch refuses to load). Under an array
            # (a constant the port recomputes) only that constant.
            rule = the_plan[key][0].rule
            if isinstance(rule.torch_default, np.ndarray):
                why = _constant_refusal(value, rule.torch_default)
                if why:
                    invalid[key] = f"{why} the constant its rule Rule({rule.torch_name!r}, None, torch_default=...) holds"
            elif np.shape(value) != ():
                invalid[key] = (f"a tensor of shape {tuple(np.shape(value))}, but its rule Rule({rule.torch_name!r}, None, "
                                f"torch_default={rule.torch_default!r}) drops a torch-only scalar buffer and would lose "
                                f"these values: give the tensor a variable in the Flax layer and the rule its name "
                                f"(or, for a constant the port recomputes, the rule that constant as torch_default)")
            continue
        why = dtype_refusal(value, the_plan[key][0].flax_dtype)
        if why:
            invalid[key] = why
            continue
        want = the_plan.torch_shape(key)
        if tuple(value.shape) != want:
            mismatched[key] = (tuple(value.shape), want)
            continue
        out[key] = value
    if missing or unexpected or mismatched or invalid:
        lines = [f"state dict does not fit {what}:"]
        lines += _depth_hints(list(the_plan), given)
        prefixed, said = prefix_hint(missing, unexpected)
        lines += prefixed
        given_shapes = {k: _shape_of(arrays[k]) for k in unexpected}
        wanted_shapes = {k: the_plan.torch_shape(k) for k in missing}
        for key in missing:
            if key in said:
                continue
            lines.append(f"  missing key {key!r}{did_you_mean(key, unexpected, wanted_shapes[key], given_shapes)}")
        for key in unexpected:
            if key in said:
                continue
            # Suggest only keys that are missing: a key the checkpoint already supplies is never
            # what an extra key was meant to be (an extra layer would "mean" the layer before it).
            hint = (did_you_mean(key, missing, given_shapes[key], wanted_shapes)
                    or _tie_hint(key, arrays, read, out, user_name or str))
            lines.append(f"  unexpected key {key!r}{hint}")
        for key, (got, want) in mismatched.items():
            lines.append(f"  shape mismatch for {key!r}: checkpoint {got}, model expects {want}"
                         f"{_layout_hint(the_plan[key][0], got, want)}")
        for key, why in invalid.items():
            lines.append(f"  invalid value for {key!r}: {why}")
        raise ConversionError(
            "\n".join(lines), missing=missing, unexpected=unexpected, mismatched=mismatched, invalid=invalid
        )
    return out


def _constant_refusal(value, constant):
    """Why a checkpoint's buffer is not the constant a port recomputes in its place, or None."""
    if np.shape(value) != constant.shape:
        return f"shape {tuple(np.shape(value))}, not the shape {constant.shape} of"
    if _kind(_dtype_of(value)) != _kind(constant.dtype):
        return f"dtype {_dtype_of(value)}, not the {_kind(constant.dtype)} dtype of"
    differ = int(np.sum(np.asarray(value) != constant))
    return f"{differ} of {constant.size} values differ from" if differ else None


def _layout_hint(link, got, want):
    """Shapes that match only after a transpose the rule did not ask for are called so."""
    if sorted(got) != sorted(want) or len(got) < 2:
        return ""
    layer = link.layer_type.__name__
    if link.rule.ops == _rules.TRANSPOSE and got == want[::-1]:
        return " (looks transposed: torch Linear weights are (out_features, in_features))"
    if any(isinstance(op, _rules.ChannelsLast) for op in link.rule.ops):
        return f" (looks like a kernel in another layout: torch {layer} kernels are (out, in, *spatial))"
    return f" (the same sizes in another order: a transposed or Flax-layout array given for the {layer}'s {link.rule.torch_name!r}?)"


def check_flax(the_plan, params, what):
    """Raise one ConversionError naming every missing, unexpected, misshapen or wrong-kind
    (``dtype_refusal``) Flax path: the same refusals as ``check_torch``, so neither direction lets an integer weight
    through (torch's load_state_dict would silently cast it to float)."""
    links = [link for link in the_plan.links if link.flax_path is not None]
    expected = {link.flax_path: link for link in links}
    missing = [p for p in expected if p not in params]
    unexpected = [p for p in params if p not in expected]
    mismatched = {p: (tuple(np.shape(params[p])), link.variable_shape) for p, link in expected.items()
                  if p in params and tuple(np.shape(params[p])) != link.variable_shape}
    invalid = {}
    for p, link in expected.items():
        if p in params and p not in mismatched:
            why = dtype_refusal(params[p], link.flax_dtype)
            if why:
                invalid[p] = why
    if missing or unexpected or mismatched or invalid:
        lines = [f"Flax parameters do not fit {what}:"]
        lines += [f"  missing parameter {p!r}" for p in missing]
        lines += [f"  unexpected parameter {p!r}" for p in unexpected]
        lines += [f"  shape mismatch for {p!r}: file {got}, model expects {want}" for p, (got, want) in mismatched.items()]
        lines += [f"  invalid value for {p!r}: {why}" for p, why in invalid.items()]
        raise ConversionError("\n".join(lines), missing=missing, unexpected=unexpected, mismatched=mismatched,
                              invalid=invalid)


def _dtype_of(value):
    """A value's dtype without copying it to the host (a jax array has one, as numpy's do)."""
    dtype = getattr(value, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.asarray(value).dtype


def flax_variables(model):
    """{Flax path: nnx.Variable} of a model's state (``STATE``: parameters, batch statistics,
    buffers; not RNG state, caches or sown values)."""
    return {"/".join(map(str, path)): var for path, var in nnx.to_flat_state(nnx.state(model, STATE))}


def flax_arrays(model):
    """{Flax path: numpy array} of a live model's state (``flax_variables``)."""
    return {path: np.asarray(_value(var)) for path, var in flax_variables(model).items()}
