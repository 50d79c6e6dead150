"""Which rows of a ``compare`` report an option names: ``channels_last`` and ``ignore_missing``
given as module-path prefixes (``{}`` for one dotted segment, as in rename maps) or as a
predicate on row names. Row names are the report's: the Flax model's module paths, torch's
after the rename map, with ``#i`` for a module's repeated call and ``[i]`` for a tuple output.
"""

import re
from collections.abc import Iterable


def row_base(name):
    """A row's module path: without a repeated call's ``#i`` or a tuple output's ``[i]``."""
    return re.match(r"^([^#\[]*)", name).group(1)


def channels_last_rows(channels_last, flax_names):
    """``compare``'s ``channels_last`` as a predicate on row names, or None (nothing moved)."""
    if channels_last is False or channels_last is None:
        return None
    if channels_last is True:
        return lambda name: True
    bases = sorted({row_base(name) for name in flax_names})
    return row_selector(channels_last, bases, "channels_last", "no row of the Flax model (its module paths: "
                         + ", ".join(map(repr, bases[:12])) + ")")


def row_selector(option, names, what, where):
    """``option`` (a predicate on row names, one module-path prefix, or a collection of them)
    as a predicate. A prefix matches its module and everything inside it; ``{}`` stands for one
    dotted segment (a layer index), as in rename maps. A prefix that matches none of ``names``
    is a typo (or a path before renaming): an error naming it and ``where`` the names are."""
    if callable(option):
        return lambda name: bool(option(name))
    prefixes = (option,) if isinstance(option, str) else tuple(option) if isinstance(option, Iterable) else (option,)
    if not all(isinstance(p, str) for p in prefixes):
        raise TypeError(f"compare: {what} is True, False, a predicate on row names or module-path "
                        f"prefixes (str), got {option!r}")
    patterns = [re.compile("" if p == "" else "^" + re.escape(p).replace(r"\{\}", r"[^.]+") + r"(\.|$)")
                for p in prefixes]

    def selected(name):
        return any(rx.match(row_base(name)) for rx in patterns)

    unused = [p for p, rx in zip(prefixes, patterns) if not any(rx.match(row_base(name)) for name in names)]
    if unused:
        raise ValueError(f"compare: {what} prefix{'es' if len(unused) > 1 else ''} {', '.join(map(repr, unused))} "
                         f"match{'' if len(unused) > 1 else 'es'} {where}")
    return selected


def missing_rows_left_out(ignore_missing, missing):
    """``compare``'s ``ignore_missing`` as a predicate on the rows only one side has (``missing``)."""
    if ignore_missing is True:
        return lambda name: True
    if ignore_missing is False or ignore_missing is None:
        return lambda name: False
    return row_selector(ignore_missing, missing, "ignore_missing",
                         "no row only one side has (" + ("those rows: " + listed(missing, shown=8) if missing
                                                         else "every row is on both sides") + ")")


def listed(paths, shown=4):
    paths = [p or "the whole model" for p in paths]
    return ", ".join(paths[:shown]) + (f", ... ({len(paths)} in all)" if len(paths) > shown else "")
