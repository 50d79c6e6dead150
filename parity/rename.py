"""Rename maps: a declarative table of key patterns, for models whose torch names differ.

    {"layers.{}.attn.wq.weight": "blocks.{}.attention.query.weight",      # one key -> one key
     "layers.{}.attn.in_proj_weight": ("blocks.{}.q.weight",               # one key -> chunks
                                       "blocks.{}.k.weight", "blocks.{}.v.weight")}

Left: the user's torch keys. Right: the keys the conversion plan expects (the Flax module path
in dots, then the torch parameter name; ``parity.torch_key_shapes(model)`` lists them). ``{}``
stands for one dotted segment (a layer index), filled in order. A tuple on the right splits
the tensor in equal chunks along axis 0 (and concatenates them back in the other direction).
Keys no pattern matches pass through unchanged. Applied both ways, as gpt-fast's weight map;
every pattern that matches nothing, key matched twice, or two keys onto one name is reported
at once. Needs no torch: it moves values it does not look inside (except to chunk them).
"""

import re

import numpy as np

from parity.engine import ConversionError, did_you_mean
from parity.wrapper_prefix import WRAPPERS, strip_advice


def _compile(pattern):
    if not isinstance(pattern, str) or not pattern:
        raise ConversionError(f"rename pattern {pattern!r} is not a non-empty string")
    return re.compile("^" + re.escape(pattern).replace(r"\{\}", r"([^./]+)") + "$")


def _fill(pattern, groups):
    parts = pattern.split("{}")
    if len(parts) - 1 != len(groups):
        raise ConversionError(f"rename target {pattern!r} has {len(parts) - 1} '{{}}', its source {len(groups)}")
    return "".join(p + g for p, g in zip(parts, (*groups, ""))) if groups else pattern


class Rename:
    """A compiled rename table; ``forward`` renames a torch state dict, ``backward`` undoes it."""

    def __init__(self, table):
        if isinstance(table, Rename):
            table = table.table
        if not isinstance(table, dict):
            raise ConversionError(f"a rename map is a dict of pattern -> pattern, got {type(table).__name__}")
        self.table = dict(table)
        self._forward = [(src, _compile(src), tgt if isinstance(tgt, tuple) else (tgt,)) for src, tgt in table.items()]
        self._backward = [(src, tgts, [_compile(t) for t in tgts]) for src, _, tgts in self._forward]
        self._modules, self._ambiguous = _module_pairs(self._forward)

    @staticmethod
    def _report(direction, unused, twice, collide, wrapped=None):
        """``unused``: [(the pattern the user wrote, the side of it that matched no key, a
        did-you-mean or "")]; ``wrapped``: the prefix a wrapper put before every key, or None."""
        lines = [f"rename map does not fit the {direction} keys:"]
        if wrapped is not None:  # the did-you-means would fit the map to the wrapper: say it first
            lines.append(f"  every key of the state dict starts with {wrapped!r} ({WRAPPERS[wrapped]}): "
                         f"{strip_advice(wrapped)}")
            unused = [(src, side, "") for src, side, _ in unused]
        lines += [f"  pattern {src!r} matches no key{hint}" if side == src else
                  f"  pattern {src!r}: its target {side!r} matches no key{hint}" for src, side, hint in unused]
        lines += [f"  key {k!r} matches {len(ps)} patterns: {', '.join(map(repr, ps))}" for k, ps in twice.items()]
        lines += [f"  keys {', '.join(map(repr, ks))} all rename to {t!r}" for t, ks in collide.items()]
        raise ConversionError("\n".join(lines), unexpected=list(twice), mismatched={})

    def forward(self, state_dict, split=None):
        """{user key: value} -> {plan key: value}. ``split(value, n)``: n chunks along axis 0."""
        split = split or (lambda v, n: np.split(np.asarray(v), n, axis=0))
        used, twice, out, sources = set(), {}, {}, {}
        for key, value in state_dict.items():
            hits = [(src, m, tgts) for src, rx, tgts in self._forward if (m := rx.match(str(key)))]
            if len(hits) > 1:
                twice[key] = [h[0] for h in hits]
                continue
            if not hits:
                targets, values = (key,), (value,)
            else:
                src, m, tgts = hits[0]
                used.add(src)
                targets = tuple(_fill(t, m.groups()) for t in tgts)
                values = (value,) if len(tgts) == 1 else tuple(split(value, len(tgts)))
            for target, v in zip(targets, values):
                sources.setdefault(target, []).append(key)
                out[target] = v
        unused = [(src, src, _closest_pattern(src, state_dict)) for src in self.table if src not in used]
        collide = {t: ks for t, ks in sources.items() if len(ks) > 1}
        if unused or twice or collide:
            wrapped = [p for p in WRAPPERS if state_dict and all(str(k).startswith(p) for k in state_dict)
                       and not any(src.startswith(p) for src, _, _ in unused)]
            self._report("torch", unused, twice, collide, max(wrapped, key=len, default=None))
        return out

    def backward(self, state_dict, concat=None):
        """{plan key: value} -> {user key: value}, chunks concatenated back along axis 0."""
        concat = concat or (lambda vs: np.concatenate([np.asarray(v) for v in vs], axis=0))
        used, twice, out, sources, pending = set(), {}, {}, {}, {}
        for key, value in state_dict.items():
            hits = [(src, i, m, tgts) for src, tgts, rxs in self._backward
                    for i, rx in enumerate(rxs) if (m := rx.match(str(key)))]
            if len(hits) > 1:
                twice[key] = [h[0] for h in hits]
                continue
            if not hits:
                sources.setdefault(key, []).append(key)
                out[key] = value
                continue
            src, i, m, tgts = hits[0]
            used.add(src)
            name = _fill(src, m.groups())
            if len(tgts) == 1:
                sources.setdefault(name, []).append(key)
                out[name] = value
            else:
                pending.setdefault(name, {})[i] = value
                if len(pending[name]) == len(tgts):
                    sources.setdefault(name, []).append(key)
                    out[name] = concat([pending[name][j] for j in range(len(tgts))])
        # Here the targets are what met the keys: a pattern unused is a target misspelt (or a
        # source the model has no layer for), so the message names the target.
        unused = [(src, ", ".join(tgts), _closest_pattern(tgts[0], state_dict)) for src, tgts, _ in self._backward
                  if src not in used]
        collide = {t: ks for t, ks in sources.items() if len(ks) > 1}
        if unused or twice or collide:
            self._report("Flax model's", unused, twice, collide)
        return out

    def user_name(self, key):
        """What the plan's ``key`` is called in the user's state dict (itself if no pattern renames it)."""
        for src, tgts, rxs in self._backward:
            for i, rx in enumerate(rxs):
                m = rx.match(key)
                if m:
                    name = _fill(src, m.groups())
                    return name if len(tgts) == 1 else f"{name} (chunk {i} of {len(tgts)})"
        return key

    def module_path(self, torch_path):
        """A torch module path renamed as its parameters are (for matching intermediates), or
        itself: a pattern's module part ("layers.{}.wq") or its part up to a ``{}``
        ("layers.{}" -> "blocks.{}", for a block that holds no parameter of its own). A path
        no pattern names whole is renamed by its longest prefix that one names: a child without
        parameters ("layers.0.act") lives where its renamed parent does. Below a prefix the
        table sends to two places, nothing is renamed: no one parent holds it."""
        segments = torch_path.split(".")
        for k in range(len(segments), 0, -1):
            prefix, rest = ".".join(segments[:k]), segments[k:]
            if any(rx.match(prefix) for rx in self._ambiguous):
                return torch_path
            for head, target in self._modules:
                m = head.match(prefix)
                if m:
                    return ".".join([_fill(target, m.groups()), *rest])
        return torch_path


def _module_pairs(forward):
    """[(compiled torch module pattern, its Flax module pattern)] for ``Rename.module_path``:
    each pattern's module part and its parts up to a ``{}`` (``_prefix_pairs``), then the
    shorter prefixes of module parts of as many segments, ``{}`` in the same places, segment
    for segment ("layers.{}.attn.wq" -> "blocks.{}.attention.query" gives "layers.{}.attn" ->
    "blocks.{}.attention": a module that holds no parameter of its own). A prefix the table
    maps to two targets is no module's name: returned apart, as the second list."""
    pairs = [(head, target) for src, _, tgts in forward if len(tgts) == 1 for head, target in _prefix_pairs(src, tgts[0])]
    aligned = {}
    for src, _, tgts in forward:
        if len(tgts) != 1:
            continue
        s_parts, t_parts = src.split(".")[:-1], tgts[0].split(".")[:-1]
        if len(s_parts) != len(t_parts) or [p == "{}" for p in s_parts] != [p == "{}" for p in t_parts]:
            continue
        for k in range(1, len(s_parts)):
            aligned.setdefault(".".join(s_parts[:k]), set()).add(".".join(t_parts[:k]))
    heads = {head for head, _ in pairs}
    pairs += [(head, targets.pop()) for head, targets in aligned.items() if len(targets) == 1 and head not in heads]
    ambiguous = [_compile(head) for head, targets in aligned.items() if len(targets) > 1 and head not in heads]
    return [(_compile(head), target) for head, target in pairs], ambiguous


def _closest_pattern(pattern, keys):
    """' (did you mean ...?)' with the key nearest ``pattern`` written as a pattern (its
    segments where ``pattern`` has ``{}`` put back as ``{}``), or "". Only for patterns whose
    ``{}`` are whole dotted segments, as the map's layer indices are."""
    segments = pattern.split(".")
    if any("{}" in s and s != "{}" for s in segments):
        return ""
    shapes = {".".join("{}" if s == "{}" else k for s, k in zip(segments, parts))
              for parts in (str(key).split(".") for key in keys) if len(parts) == len(segments)}
    return did_you_mean(pattern, sorted(shapes - {pattern}))


def _prefix_pairs(src, tgt):
    pairs = [(src.rpartition(".")[0], tgt.rpartition(".")[0])]
    s_parts, t_parts = src.split("{}"), tgt.split("{}")
    for i in range(1, min(len(s_parts), len(t_parts))):
        pairs.append(("{}".join(s_parts[:i]) + "{}", "{}".join(t_parts[:i]) + "{}"))
    return [(a, b) for a, b in pairs if a and b]
