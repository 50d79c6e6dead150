"""Run a torch twin and a Flax twin side by side and compare every named intermediate.

Both sides record the output of every submodule, named by its path:

- torch: a forward hook on each of ``model.named_modules()``;
- Flax: a wrapper around each module class's ``__call__`` for the run
  (``parity/flax_calls.py``), which records each submodule's output under the same path,
  outside JAX transforms.

Rows come in the order torch finished computing them, so the first row beyond tolerance is
where the two implementations first diverge: the place to look for the bug.
"""

import itertools
import re
import sys
import types
import warnings
from collections import defaultdict
from collections.abc import Mapping

import jax
import numpy as np
import torch
from flax import nnx

from parity import in_float64
from parity.convert import tensor_to_numpy
from parity.engine import ConversionError, plan
from parity.flax_calls import record_flax_calls, within
from parity.model_kinds import check_pair
from parity.policy import DEFAULT_ATOL, FLOAT64_ATOL, check_tolerance
from parity.rename import Rename
from parity.report import (  # noqa: F401 - names parity.compare has always given
    ALIASES,
    GRAD_PREFIX,
    LOSS_ROW,
    Report,
    Row,
    compared_row,
    diff,
    nonfinite_note,
)
from parity.row_selection import channels_last_rows, listed, missing_rows_left_out, row_base
from parity.rules import RULES, check_table


def _leaves(name, value):
    """Flatten a module output (an array, or tuples, lists and dicts of them) into (name,
    array) pairs: ``name[0]``, ``name['logits']``. Both sides flatten alike, so a port that
    returns the same structure gets the same names; dict items go in key order, not insertion
    order, since a torch ``dict`` and an ``nnx.Dict`` need not keep the same."""
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _leaves(f"{name}[{i}]", v)
    elif isinstance(value, Mapping):
        for k in sorted(value, key=str):
            yield from _leaves(f"{name}[{k!r}]", value[k])
    elif value is not None:
        yield name, value


def _number_calls(records):
    """[(name, value)] in call order -> {name or name#i: value}, numbering repeated calls."""
    counts = defaultdict(int)
    for name, _ in records:
        counts[name] += 1
    seen, out = defaultdict(int), {}
    for name, value in records:
        key = name if counts[name] == 1 else f"{name}#{seen[name]}"
        seen[name] += 1
        out.update(_leaves(key, value))
    return out


def on_device_of(model, tensors):
    """``tensors`` on the device of ``model``'s first parameter or buffer (inputs made from
    numpy are on the CPU; a twin on a GPU needs them there). Non-tensors pass unchanged."""
    held = next(itertools.chain(model.parameters(), model.buffers()), None)
    if held is None:
        return tuple(tensors)
    return tuple(t.to(held.device) if isinstance(t, torch.Tensor) else t for t in tensors)


def _copied(output):
    """``output`` with its tensors cloned (tuples and lists too, as some modules return)."""
    if isinstance(output, torch.Tensor):
        return output.detach().clone()
    if isinstance(output, (tuple, list)):
        return type(output)(_copied(o) for o in output)
    return output


def torch_intermediates(model, *inputs, sequential=False):
    """Run ``model(*inputs)`` without grad; return (output, {name: numpy array}) in completion order.

    An ``nn.Sequential``'s output is its last child's, and is left out unless ``sequential``:
    a port may apply an ``nnx.List`` of the same children by hand (no output of its own), or
    call an ``nnx.Sequential`` (which records one). ``compare`` records them and keeps the
    rows the Flax side has too (``_drop_unmatched_sequential``)."""
    records, handles = [], []
    # torch.nn.utils.parametrize (weight_norm, orthogonal, ...) keeps its parametrizations as
    # modules under "<layer>.parametrizations": they run when the weight is read, and their
    # outputs are weights, not activations, which no port computes as modules of its own.
    weights = tuple(f"{name}.parametrizations".lstrip(".") for name, module in model.named_modules()
                    if torch.nn.utils.parametrize.is_parametrized(module))
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Sequential) and not sequential:
            continue
        if any(name == w or name.startswith(w + ".") for w in weights):
            continue

        def hook(_module, _args, output, name=name):
            # Copied now: a later in-place op (nn.ReLU(inplace=True), x.add_()) would
            # otherwise change the stored output before it is read.
            records.append((name, _copied(output)))

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            output = model(*on_device_of(model, inputs))
    finally:
        for h in handles:
            h.remove()
    named = _number_calls(records)
    return output, {k: tensor_to_numpy(v) for k, v in named.items()}


def _flax_calls(model, *inputs):
    """(output, {name: numpy array}, [paths of the modules run only under a JAX transform])."""
    output, records, traced = record_flax_calls(model, *inputs)
    named = _number_calls(records)
    return output, {k: np.asarray(jax.device_get(v)) for k, v in named.items()}, traced


def flax_intermediates(model, *inputs):
    """Run ``model(*inputs)``; return (output, {name: numpy array}) for every submodule call
    (the whole model's output under ""). Modules called only inside a JAX transform
    (``nnx.scan``, ``nnx.RNN``'s cell, ``nnx.vmap``) have no values there and no entry."""
    output, named, _ = _flax_calls(model, *inputs)
    return output, named


def match_tuple_outputs(torch_named, flax_named):
    """``flax_named`` with a module's single output renamed ``NAME[0]`` where torch's module of
    that name returned a tuple and Flax's one array: nn.MultiheadAttention returns (output,
    weights or None), nnx.MultiHeadAttention the output alone. Torch's ``NAME[1]`` (the weights,
    when asked for) stays unmatched, as it is."""
    renamed = {}
    for name, value in flax_named.items():
        tuple_name = f"{name}[0]"
        renamed[tuple_name if tuple_name in torch_named and tuple_name not in flax_named else name] = value
    return renamed


def compare_intermediates(torch_named, flax_named, atol):
    """Match both sides' intermediates by name, in torch's order, into a Report."""
    rows = []
    flax_named = match_tuple_outputs(torch_named, flax_named)
    for name, t in torch_named.items():
        if name not in flax_named:
            rows.append(Row(name, tuple(t.shape), float("inf"), float("inf"), False, "missing on the Flax side"))
            continue
        f = flax_named[name]
        if tuple(f.shape) != tuple(t.shape):
            rows.append(Row(name, tuple(t.shape), float("inf"), float("inf"), False,
                            f"shape differs: Flax {tuple(f.shape)}"))
            continue
        rows.append(compared_row(name, t.shape, f, t, atol))
    for name, f in flax_named.items():
        if name not in torch_named:
            rows.append(Row(name, tuple(f.shape), float("inf"), float("inf"), False, "missing on the torch side"))
    return Report(rows, atol)


def _sequential_paths(torch_model):
    return {name for name, module in torch_model.named_modules() if isinstance(module, torch.nn.Sequential)}


def _drop_unmatched_sequential(torch_named, flax_named, sequential):
    """``torch_named`` without the rows of ``nn.Sequential`` modules (paths ``sequential``) that
    the Flax side has no row for: an ``nnx.List`` applied by hand records nothing, and the
    Sequential's output is its last child's, compared there. An ``nnx.Sequential`` port keeps
    them, and its own row (Flax records it) is matched instead of reported missing."""
    return {name: v for name, v in torch_named.items() if name in flax_named or row_base(name) not in sequential}


def model_intermediates(torch_model, flax_model, torch_inputs, flax_inputs):
    """({name: torch array}, {name: Flax array}): both twins' intermediates on the same inputs,
    as ``compare_models`` compares them (``nn.Sequential`` rows the Flax side lacks left out)."""
    _, t = torch_intermediates(torch_model, *torch_inputs, sequential=True)
    _, f = flax_intermediates(flax_model, *flax_inputs)
    return _drop_unmatched_sequential(t, f, _sequential_paths(torch_model)), f


def compare_models(torch_model, flax_model, torch_inputs, flax_inputs, atol=DEFAULT_ATOL, named=None):
    """Run both twins (in eval mode) on the same inputs and compare every intermediate; the
    seed Transformer's landmark rows carry their ``ALIASES`` (``logits``, ``encoder.embeddings``).
    ``named``: ``model_intermediates``' result for these inputs, when the caller has it already."""
    check_tolerance(atol, "compare_models")
    t, f = named if named is not None else model_intermediates(torch_model, flax_model, torch_inputs, flax_inputs)
    report = compare_intermediates(t, f, atol)
    for row in report.rows:
        row.alias = ALIASES.get(row.name.partition("#")[0], "")
    return report


def check_inputs(torch_inputs, flax_inputs, channels_last=False, who="compare"):
    """Both sides must get the same inputs: same count, shapes and dtype kinds (``channels_last``
    True: Flax's rank >= 3 inputs are torch's with the channel axis moved last; a selection of
    rows: each rank >= 3 input may be in either layout, since a model mixing both may take
    either). ``who``: the function the error message names."""
    for side, given in (("torch_inputs", torch_inputs), ("flax_inputs", flax_inputs)):
        if hasattr(given, "shape"):  # an array iterates over its first axis: say it, not a count
            raise TypeError(f"{who}: {side} is a tuple of the model's positional inputs, got one array of shape "
                            f"{tuple(given.shape)}: pass (x,)")
        if not isinstance(given, (tuple, list)):  # a generator would be used up here, and reach the model empty
            raise TypeError(f"{who}: {side} is a tuple (or list) of the model's positional inputs, got a "
                            f"{type(given).__name__}: pass tuple(...) of it")
    torch_inputs, flax_inputs = tuple(torch_inputs), tuple(flax_inputs)
    if len(torch_inputs) != len(flax_inputs):
        raise ValueError(f"{who}: {len(torch_inputs)} torch inputs but {len(flax_inputs)} Flax inputs")
    either = channels_last is not True and channels_last not in (False, None)
    problems = []
    for i, (t, f) in enumerate(zip(torch_inputs, flax_inputs)):
        t, f = tensor_to_numpy(t), np.asarray(jax.device_get(f))
        given = f.shape
        if f.ndim >= 3 and (channels_last is True or (either and t.shape != f.shape)):
            f = np.moveaxis(f, -1, 1)
        if t.shape != f.shape:
            how = " (nor with its last axis moved to 1)" if either and f.ndim >= 3 else ""
            how = " (its last axis moved to 1: channels_last)" if channels_last is True and f.ndim >= 3 else how
            if not channels_last and t.ndim >= 3 and np.moveaxis(t, 1, -1).shape == given:
                # The usual cause: a channels-last port (nnx.Conv) given its input as it should
                # be, and the comparison not told so.
                how = (" (torch's with its channel axis 1 moved last: pass channels_last=True if the Flax model "
                       "is channels-last" + (", or channels_last=[module-path prefixes] if only those layers are"
                                            if who == "compare" else "") + ")")
            problems.append(f"input {i}: torch shape {t.shape}, Flax shape {given if either else f.shape}{how}")
        # int64 (torch's default) against int32 (JAX's without x64) is the same integers;
        # float32 against float64 or bfloat16 is not the same input.
        elif t.dtype.kind != f.dtype.kind or (t.dtype.kind == "f" and t.dtype != f.dtype):
            problems.append(f"input {i}: torch dtype {t.dtype}, Flax dtype {f.dtype}")
    if problems:
        raise ValueError(f"{who}: the two sides get different inputs: " + "; ".join(problems))


def _wrapper(torch_model):
    """(what wraps ``torch_model``, the attribute holding the model it wraps), or None."""
    if isinstance(torch_model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
        return f"{type(torch_model).__name__} wrapper", "module"
    # torch.compile's wrapper; its class lives in torch._dynamo, which is not imported for it.
    if type(torch_model).__name__ == "OptimizedModule" and isinstance(getattr(torch_model, "_orig_mod", None),
                                                                      torch.nn.Module):
        return "torch.compile wrapper", "_orig_mod"
    return None


def check_unwrapped(torch_model, who="compare"):
    """Refuse a torch model held by a wrapper (``DataParallel``, ``DistributedDataParallel``,
    ``torch.compile``): its rows and parameters carry the wrapper's prefix (``module.``,
    ``_orig_mod.``) before every path, so none would meet the port's, and the table would fail
    every row as missing on both sides instead of naming the cause."""
    wrapped = _wrapper(torch_model)
    if wrapped is not None:
        what, attribute = wrapped
        raise TypeError(f"{who}: the torch model is a {what}, whose paths all start with '{attribute}.': pass "
                        f"torch_model.{attribute}, the model it wraps, which the port mirrors")


def _channels_first(named, selected=lambda name: True):
    """Flax convolutions are channels-last (N, *spatial, C); torch's are (N, C, *spatial)."""
    return {k: (np.moveaxis(v, -1, 1) if v.ndim >= 3 and selected(k) else v) for k, v in named.items()}


def _one_call_layers(flax_model, rules):
    """{module path: type name} of the Flax layers whose conversion rule reaches into their
    sublayers (``nnx.MultiHeadAttention``: ``query/kernel`` ...): torch computes such a layer in
    one call (``nn.MultiheadAttention``'s fused projections), so its sublayers' outputs have no
    torch counterpart."""
    rules = RULES if rules is None else rules
    return {".".join(map(str, path)): type(module).__name__ for path, module in nnx.iter_modules(flax_model)
            if any(r.flax_name and "/" in r.flax_name for r in rules.get(type(module), ()))}


def _inside(name, layers):
    """The layer of ``layers`` (paths) strictly inside which the row ``name`` lies, or None."""
    base = row_base(name)
    return next((p for p in layers if within(base, p)), None)


def random_layer_notes(torch_model, flax_model):
    """[(note, certain)] for a Report where a side's dropout may be active: each side draws its
    own random masks, which no port can reproduce, so the rows differ from the first dropout
    on and the first divergence names a dropout, not a porting error. Said, not refused: a
    porter may mean it (a dropout-free model compares as well in training mode, BatchNorm on
    batch statistics). ``certain``: a dropout module is active, not only a torch model in
    training mode that might call ``F.dropout`` itself."""
    consequence = ("each side draws its own random masks, so the rows differ from the first dropout on whatever "
                   "the port; put both models in eval mode (torch_model.eval(), flax_model.eval()) to compare them")
    notes = []
    dropouts = [name for name, m in torch_model.named_modules()
                if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training and m.p > 0]
    if dropouts:
        notes.append((f"the torch model is in training mode, with dropout active in {listed(dropouts)}: "
                      f"{consequence}", True))
    elif any(m.training for m in torch_model.modules()):
        notes.append(("the torch model is in training mode (model.train(), a torch module's default): if it calls "
                      f"dropout as a function (F.dropout(x, p, self.training)), {consequence}", False))
    active = [".".join(map(str, path)) for path, m in nnx.iter_modules(flax_model)
              if isinstance(m, nnx.Dropout) and m.rate > 0 and not m.deterministic]
    if active:
        notes.append((f"nnx.Dropout is active (deterministic=False) in the Flax model at {listed(active)}: "
                      f"{consequence}", True))
    return notes


def say_notes(report, notes):
    """``notes`` ([(note, certain)]) in ``report`` (its table and JSON), and the certain ones
    as a warning too, for a caller who only reads ``report.ok`` or ``first_divergence`` (a
    hedged one would warn every deliberate train-mode comparison)."""
    report.notes += [note for note, _ in notes]
    for note, certain in notes:
        if certain:
            warnings.warn(f"parity: {note}", stacklevel=3)
    return report


def compare(torch_model, flax_model, torch_inputs, flax_inputs, atol=None, rename=None, channels_last=False,
            ignore_missing=False, rules=None, float64=False):
    """Run any torch module and any NNX module on the same inputs and compare every submodule's
    output, matched by path (torch paths renamed by the ``rename`` map's module prefixes), in
    torch's execution order; ``Report.first_divergence`` is the first row beyond ``atol``.

    Torch inputs are moved to the torch model's device (``on_device_of``), so a twin on a GPU
    takes the same CPU tensors. Put both models in eval mode first (dropout off; BatchNorm on
    running statistics): in train mode each side draws its own dropout masks, which no port
    reproduces, so the rows differ from the first dropout on. A torch model in training mode
    or an active ``nnx.Dropout`` (rate > 0, not deterministic) is said in ``Report.notes`` (the
    table's ``note:`` lines) and as a warning; it is not refused, since a model without dropout
    compares as well in train mode (BatchNorm on batch statistics on both sides).
    ``channels_last``: the Flax model computes (N, *spatial, C) where torch
    computes (N, C, *spatial), as ported CNNs do:

    - ``True``: everywhere; its rank >= 3 inputs and outputs are moved to compare;
    - a collection of module-path prefixes (``["encoder.conv"]``; one str is one prefix), or a
      predicate on row names: only in those rows, for models that mix convolutions with
      sequence layers after a transpose (torch's ``Conv1d`` then ``.transpose(1, 2)``, the
      port's ``nnx.Conv`` then the same layers on (N, L, C)). Names are the report's (the Flax
      model's paths; torch's after ``rename``); a prefix matches its module and everything
      inside it, and one that matches no row is an error. Each rank >= 3 input may then be
      given to the Flax model in either layout (checked against torch's as it is, or with its
      channel axis moved).

    ``atol``: the largest absolute difference a row may have (None: the parity policy's 1e-5,
    or ``FLOAT64_ATOL``, 1e-10, with ``float64``). ``float64``: run copies of both models in
    float64 (torch's ``.double()``, the Flax model's variables cast under
    ``jax.enable_x64(True)``; float inputs cast, token ids kept), where neither side's rounding
    hides a slip smaller than float32's tolerance: a wrong LayerNorm epsilon (1e-6 for 1e-5)
    passes at 1e-5 in float32 and fails here (parity/in_float64.py).

    ``ignore_missing``: leave out rows only one side has (torch's ``nn.ReLU`` modules, where
    the port calls ``nnx.relu``) instead of failing them: ``True`` every such row; module-path
    prefixes (one str or a collection; ``{}`` stands for one dotted segment, as in rename maps:
    ``"blocks.{}.act"``) or a predicate on row names only those, so that any other row missing
    still fails. Whatever is left out is listed in ``Report.left_out`` and the table, with the
    reason. A ``rename`` map is checked against both models as ``torch_to_flax`` checks it (a
    pattern or target that matches no key is an error), since a typo there would leave rows
    unmatched, and ignore_missing would leave them out: give ``rules`` the conversion's rule
    table when it was not the default, since the targets are the keys of its plan.

    The outputs of the sublayers of a layer that torch computes in one call (the ``query``,
    ``key``, ``value`` and ``out`` of an ``nnx.MultiHeadAttention``, whose ``rules`` entry,
    default ``parity.RULES``, reaches into them) are always left out that way: the layer's own
    output is compared.

    Every NNX module's ``__call__`` output is recorded, inherited or its own. A module run
    inside a JAX transform (``nnx.scan``, ``nnx.vmap``, ``nnx.jit``; ``nnx.RNN`` scans its
    cell) has traced outputs, not values: it is listed in ``Report.left_out`` with torch's rows
    at or inside it, while the modules around it and the model's output are compared as usual.
    """
    if atol is not None:
        check_tolerance(atol, "compare", float64=float64)
    check_pair(torch_model, flax_model, "compare", "torch_model, flax_model, torch_inputs, flax_inputs, ...")
    check_unwrapped(torch_model)
    if rules is not None:
        check_table(rules)
    check_inputs(torch_inputs, flax_inputs, channels_last)
    if rename is not None:
        _check_rename(rename, torch_model, flax_model, rules)
    notes = random_layer_notes(torch_model, flax_model)
    if float64:
        atol = FLOAT64_ATOL if atol is None else atol
        model, inputs = in_float64.torch_in_float64(torch_model, torch_inputs)
        _, t = torch_intermediates(model, *inputs, sequential=True)
        with in_float64.x64():
            model, inputs = in_float64.flax_in_float64(flax_model, flax_inputs)
            _, f, traced = _flax_calls(model, *inputs)
        notes += in_float64.narrower_rows_note(f)
    else:
        _, t = torch_intermediates(torch_model, *torch_inputs, sequential=True)
        _, f, traced = _flax_calls(flax_model, *flax_inputs)
    atol = DEFAULT_ATOL if atol is None else atol
    selected = channels_last_rows(channels_last, [*f, *traced])
    own_shapes = {}  # the port's own shape of each row channels_last moved
    if selected is not None:
        own_shapes = {k: tuple(v.shape) for k, v in f.items() if v.ndim >= 3 and selected(k)}
        f = _channels_first(f, selected)
    sequential = _sequential_paths(torch_model)
    if rename is not None:
        table = Rename(rename)
        t = {_rename_row(table, name): v for name, v in t.items()}
        sequential = {table.module_path(name) for name in sequential}
    t = _drop_unmatched_sequential(t, f, sequential)
    f = match_tuple_outputs(t, f)
    left_out = []
    one_call = _one_call_layers(flax_model, rules)
    for name in [k for k in f if k not in t]:
        layer = _inside(name, one_call)
        if layer is not None:
            del f[name]
            left_out.append((name, f"inside {layer}, a {one_call[layer]} that torch computes in one call"))
    # nn.MultiheadAttention's default batch_first=False computes sequence-first (L, N, E);
    # nnx.MultiHeadAttention is batch-first (N, L, E) whatever the port's inputs. Torch's output
    # is moved to compare them, and the note says so: a correct port failed there on its shape.
    seq_first = {name for name, m in torch_model.named_modules()
                 if isinstance(m, torch.nn.MultiheadAttention) and not m.batch_first}
    if rename is not None:
        seq_first = {table.module_path(name) for name in seq_first}
    moved = sorted({row_base(k) for k, v in t.items() if k.endswith("[0]") and row_base(k) in seq_first
                    and row_base(k) in one_call and np.ndim(v) == 3})
    t = {k: (np.swapaxes(v, 0, 1) if k.endswith("[0]") and row_base(k) in moved else v) for k, v in t.items()}
    if moved:
        notes.append((f"torch's {listed(moved)} computes sequence-first (L, N, E) (nn.MultiheadAttention's "
                      f"batch_first=False, its default), the port's nnx.MultiHeadAttention batch-first (N, L, E): "
                      f"torch's output there is compared with its first two axes swapped", False))
    # nn.MultiheadAttention returns (output, attention weights) unless called with
    # need_weights=False, and the weights are on by default; nnx.MultiHeadAttention returns the
    # output alone, matched to torch's [0]. The weights are no port's output: a correct port of
    # a default call would otherwise fail on them.
    for name in [k for k in t if k not in f and k.endswith("[1]")]:
        layer = name.removesuffix("[1]")
        if layer in one_call and f"{layer}[0]" in f:
            del t[name]
            left_out.append((name, f"the attention weights torch's {layer} returns (need_weights=True, its default), "
                                   f"which the port's {one_call[layer]} does not"))
    # Modules run under a JAX transform have traced outputs, not values: the outermost of them
    # are said, and torch's rows at or inside them (a scanned layer stack's per-layer rows) are
    # left out with them rather than failed as missing.
    outermost = [p for p in traced if _inside(p, traced) is None]
    for name in [k for k in t if k not in f]:
        layer = next((p for p in outermost if row_base(name) == p or _inside(name, [p]) is not None), None)
        if layer is not None:
            del t[name]
            left_out.append((name, f"at or inside {layer or 'the whole model'}, which the Flax model runs under a JAX "
                                   f"transform (nnx.scan, nnx.vmap, ...) where outputs are traced, not recorded"))
    left_out += [(p, "run under a JAX transform inside the Flax model (nnx.scan, nnx.RNN's cell, nnx.vmap, ...): "
                     "outputs there are traced, not recorded; to compare them, compare a version of the model that "
                     "calls them in a Python loop") for p in outermost]
    # After renaming and matching: a row is missing only if no name matches it.
    only_torch, only_flax = [k for k in t if k not in f], [k for k in f if k not in t]
    leave = missing_rows_left_out(ignore_missing, only_torch + only_flax)
    left = {k for k in [*only_torch, *only_flax] if leave(k)}  # the user's predicate, once a row
    left_out += [(k, "only torch has them, by ignore_missing") for k in only_torch if k in left]
    left_out += [(k, "only Flax has them, by ignore_missing") for k in only_flax if k in left]
    t, f = {k: v for k, v in t.items() if k not in left}, {k: v for k, v in f.items() if k not in left}
    still = [k for k in [*only_torch, *only_flax] if k not in left]
    if still:  # the usual cause is no porting error: say how to leave them out, and what that costs
        renaming = ("a port whose module paths differ from torch's (blocks.* for layers.*) gives compare the "
                    "rename map it gives torch_to_flax; " if rename is None else "")
        notes.append((f"{len(still)} row(s) only one side has ({listed(still)}): {renaming}a port that calls a "
                      f"function where torch has a module (nnx.gelu for nn.GELU()) or computes a tied head with Embed.attend has no "
                      f"row there; ignore_missing=[module-path prefixes] leaves those rows out by name ({{}} for a "
                      f"layer index: 'blocks.{{}}.mlp.act'), ignore_missing=True every such row", False))
    report = compare_intermediates(t, f, atol)
    report.left_out = left_out
    for row in report.rows:
        # A row the port computes in torch's own layout (a sequence (B, S, D) after a
        # channels-last convolution), moved by channels_last=True all the same: its note says
        # so, rather than show a shape the port never had.
        own = own_shapes.get(row.name, own_shapes.get(row.name.removesuffix("[0]")))
        if own is not None and row.note.startswith("shape differs") and own == row.shape:
            row.note = (f"shape differs only as channels_last moved it: the port's own is torch's {own}; "
                        f"channels_last=[module-path prefixes] moves the channels-last layers' rows alone")
    return say_notes(report, notes)


def _check_rename(rename, torch_model, flax_model, rules):
    """The map must fit the torch model's keys and the Flax model's conversion plan, as
    ``torch_to_flax`` requires (``Rename`` raises a ConversionError naming each pattern or
    target that matches no key). A Flax model without a rule for every variable has no plan
    and compares all the same: its targets go unchecked."""
    table = Rename(rename)
    table.forward(dict.fromkeys(torch_model.state_dict()), split=lambda value, n: [value] * n)
    try:
        plan_keys = dict.fromkeys(plan(flax_model, rules))
    except ConversionError:
        return
    table.backward(plan_keys, concat=lambda chunks: None)


def _rename_row(table, name):
    base = re.match(r"^([^#\[]*)(.*)$", name)
    return table.module_path(base.group(1)) + base.group(2)


class _CallableModule(types.ModuleType):
    """``parity.compare`` is this module once it is imported; calling it calls ``compare``."""

    def __call__(self, *args, **kwargs):
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
