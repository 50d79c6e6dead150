"""Tied weights: one tensor under two torch keys, one variable in Flax.

A torch model that ties its output projection to its embedding (``self.lm_head.weight =
self.embed.weight``) lists both keys in its ``state_dict()``, holding the same tensor; the
Flax port has one variable and computes the head from it (``self.embed.attend(x)``). A tie
table says which keys are copies and which key each one is a copy of, in the user's torch names
(the names before a rename map, as the torch model's state dict spells them):

    tied = {"lm_head.weight": "embed.weight"}   # copy -> the key it is tied to

On load (``forward``) each copy is checked to equal its source bit for bit, then left out: a
checkpoint whose "tied" weights differ was not trained tied, and loading it would silently
drop one of them. A checkpoint that holds only one of the two names loads from that one
(safetensors' ``save_model`` keeps one name of tensors that share memory). On save
(``backward``) the copy is written back under its own key, so the torch model loads the state
dict with ``strict=True``. Needs no torch: ``read`` turns a value into a numpy array.

A model may declare its own ties: a layer of a type in ``parity.rules.TIES`` (flaxformer_mini's
``TiedLinear`` and ``SharedEmbedding``, which a Transformer built with ``tie_embeddings`` holds)
stands for a torch weight that is another layer's. ``model_ties(model)`` reads them off the
model, and the conversion functions use them when no ``tied`` is given.
"""

import numpy as np
from flax import nnx

from parity import rules as _rules
from parity.engine import ConversionError, did_you_mean


def model_ties(model, ties=None):
    """{copy key: the key it is tied to} that ``model``'s own layers declare (``ties``: a table
    like ``parity.rules.TIES``, the default), in the model's torch names (the plan's keys), in
    the model's order; empty for a model without any."""
    ties = _rules.TIES if ties is None else ties
    modules = list(nnx.iter_modules(model))
    path_of = {}
    for path, module in modules:
        path_of.setdefault(id(module), path)  # a layer reachable by two paths: the one the state keeps
    table = {}
    for path, module in modules:
        if type(module) not in ties:
            continue
        copy_name, attribute = ties[type(module)]
        source = getattr(module, attribute)
        if id(source) not in path_of:
            raise ConversionError(f"{'.'.join(map(str, path))}: tied to a layer outside the model")
        table[".".join(map(str, (*path, copy_name)))] = ".".join(map(str, (*path_of[id(source)], "weight")))
    return table


def own_ties(model):
    """``Tied`` of ``model``'s own ties (``model_ties``), or None for a model without any."""
    table = model_ties(model)
    return Tied(table) if table else None


class Tied:
    """A checked tie table {copy key: the key it is tied to}."""

    def __init__(self, table):
        if isinstance(table, Tied):
            table = table.table
        if not isinstance(table, dict):
            raise ConversionError(f"tied is a dict of copy key -> the key it is tied to, got {type(table).__name__}")
        problems = []
        for copy, source in table.items():
            if not (isinstance(copy, str) and copy and isinstance(source, str) and source):
                problems.append(f"  {copy!r}: {source!r} is not a pair of torch keys (non-empty strings)")
            elif copy == source:
                problems.append(f"  {copy!r} is tied to itself")
            elif source in table:
                # One level only: the kept key is the one the Flax model has a variable for.
                problems.append(f"  {copy!r} is tied to {source!r}, itself a copy tied to {table[source]!r}: "
                                f"tie each copy to the key the model keeps")
        if problems:
            raise ConversionError("\n".join(["tied keys are not a table of copy -> source:", *problems]))
        self.table = dict(table)
        self._copies = {}  # {source: [its copies]}
        for copy, source in self.table.items():
            self._copies.setdefault(source, []).append(copy)

    def check_keys(self, model_keys, what):
        """Refuse a tie whose source is not one of the model's torch keys ``model_keys`` (in the
        user's names), or whose copy is one (a key with a variable of its own is no copy)."""
        model_keys = list(model_keys)
        lines = []
        for copy, source in self.table.items():
            if source not in model_keys:
                lines.append(f"  {copy!r} is tied to {source!r}, which is not a key of {what}"
                             f"{did_you_mean(source, model_keys)}")
            if copy in model_keys:
                lines.append(f"  {copy!r} is a key of {what} (it has a Flax variable of its own), not a tied copy")
        if lines:
            raise ConversionError("\n".join([f"tied keys do not fit {what}:", *lines]))

    def forward(self, state_dict, read=np.asarray):
        """({user key: value} without the copies, {copy key: why} for each copy that is not its
        source bit for bit): the strict checker reports those with every other offending key."""
        if not hasattr(state_dict, "keys"):
            return state_dict, {}  # the strict checker names what it is
        out, invalid = dict(state_dict), {}
        for copy, source in self.table.items():
            if copy not in out:
                continue
            if source not in out:
                out[source] = out.pop(copy)  # the checkpoint kept the copy's name only
                continue
            try:
                why = _difference(read(out.pop(copy)), read(out[source]))
            except Exception as e:  # noqa: BLE001 - reported with the key
                why = f"cannot read as an array ({e})"
            if why:
                invalid[copy] = f"tied to {source!r}, but {why}: a checkpoint whose tied weights differ is not tied"
        return out, invalid

    def backward(self, state_dict):
        """{user key: value} with each copy written back right after its source (the same
        value; ``parity.convert`` makes each key its own tensor)."""
        out = {}
        for key, value in state_dict.items():
            out[key] = value
            for copy in self._copies.get(key, ()):
                out[copy] = value
        return out


def _difference(copy, source):
    """How ``copy`` differs from ``source`` bit for bit, or None when it does not."""
    copy, source = np.asarray(copy), np.asarray(source)
    if copy.shape != source.shape:
        return f"its shape {copy.shape} differs from {source.shape}"
    if copy.dtype != source.dtype:
        return f"its dtype {copy.dtype} differs from {source.dtype}"
    copy, source, width = np.ascontiguousarray(copy), np.ascontiguousarray(source), copy.dtype.itemsize
    differ = np.any(copy.view(np.uint8).reshape(-1, width) != source.view(np.uint8).reshape(-1, width), axis=1)
    if not differ.any():
        return None
    # float64 holds every float and int32 exactly; the bits differ even where this is 0 (-0.0, NaN payloads).
    gap = np.max(np.abs(copy.astype(np.float64) - source.astype(np.float64)))
    return f"{int(differ.sum())} of {copy.size} values differ (max abs difference {gap:.3e})"
