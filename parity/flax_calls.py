"""Every NNX module's ``__call__`` output of one run of a model, by the module's path: the
Flax side of ``parity.compare`` (torch's is a forward hook on each module).

Written here rather than taken from ``nnx.capture(model, method_outputs=...)``, which records
the same outputs for the methods a class defines itself: a port inheriting ``__call__`` from a
base class lost its rows there (the whole model's output included), and the ``__captures__``
state it adds to every module made ``nnx.scan`` over a module holding an ``nnx.List`` fail.
"""

import functools

import jax
from flax import nnx

_ABSENT = object()  # a class without a __call__ of its own: its wrapper is deleted, not replaced


def _calls_module(cls):
    """Whether instances of ``cls`` are callable by a ``__call__`` of its own or inherited
    (``cls.__call__`` alone would find ``type.__call__`` on the metaclass for any class)."""
    return any("__call__" in vars(k) for k in cls.__mro__ if k is not object)


def _is_traced(value):
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value))


def record_flax_calls(model, *inputs):
    """Run ``model(*inputs)``; return (output, [(path, output)] in completion order, [paths of
    the modules run only under a JAX transform]).

    Each module class in the tree gets a ``__call__`` wrapper for the run, installed on the
    class itself (Python looks ``__call__`` up on the type) around the ``__call__`` its
    instances resolve, inherited or not: ``nnx.capture(..., method_outputs=)`` wraps only the
    methods a class defines itself, so a port inheriting ``__call__`` from a base class lost
    its row, the whole model's output included. A module records only its outermost call, so a
    ``__call__`` that calls ``super().__call__()`` records once.

    Inside ``nnx.scan``, ``nnx.vmap``, ``nnx.jit`` ... (``nnx.RNN`` scans its cell) a module's
    outputs are tracers, not values, and the module is the transform's copy, not the tree's:
    nothing is recorded, and the modules of its class inside the innermost module then running
    are noted as run under a transform. (Recording into the modules' state there, as
    ``nnx.capture`` does, changed the scan's carry and made JAX refuse the model.)

    The wrappers sit on the classes while the model runs: a call of another model of those
    classes in another thread meanwhile would run them too (and record nothing: its modules
    are not this tree's)."""
    modules = list(nnx.iter_modules(model))
    paths = {}
    for path, module in modules:
        paths.setdefault(id(module), ".".join(map(str, path)))  # a shared module: its first path
    classes = {type(m) for _, m in modules if _calls_module(type(m))}
    # Resolved before any wrapper is installed: a subclass must not resolve to its base's wrapper.
    resolved = {cls: cls.__call__ for cls in classes}
    own = {cls: vars(cls).get("__call__", _ABSENT) for cls in classes}
    records, traced, copies, running = [], {}, set(), []  # running: [(id, path)] of the calls under way

    def wrapped(call):
        def __call__(self, *args, **kwargs):
            name = paths.get(id(self))
            if name is None or any(id(self) == i for i, _ in running):  # not the tree's, or a super().__call__
                out = call(self, *args, **kwargs)
                if name is None and running and _is_traced(out):  # a transform's copy of a module
                    copies.add((running[-1][1], type(self)))
                return out
            running.append((id(self), name))
            try:
                out = call(self, *args, **kwargs)
            finally:
                running.pop()
            if _is_traced(out):  # the tree's own module traced (a jitted function closing over it)
                traced.setdefault(name)
            else:
                records.append((name, out))
            return out

        return functools.wraps(call)(__call__)

    for cls in classes:
        cls.__call__ = wrapped(resolved[cls])
    try:
        # Called as it is, without an ``nnx.capture`` context: its ``__captures__`` attribute on
        # every module changes what a transform traces (an nnx.List's int keys beside a str one
        # made ``nnx.scan`` over stacked layers fail to sort them).
        output = model(*inputs)
    finally:
        for cls in classes:
            if own[cls] is _ABSENT:
                delattr(cls, "__call__")
            else:
                cls.__call__ = own[cls]
    recorded = {name for name, _ in records}
    for path, module in modules:
        name = ".".join(map(str, path))
        if any(type(module) is cls and within(name, outer) for outer, cls in copies):
            traced.setdefault(name)
    return output, records, [name for name in traced if name not in recorded]


def within(name, outer):
    """Whether the module path ``name`` lies strictly inside ``outer`` ("" is the whole model)."""
    return name != outer and (outer == "" or name.startswith(outer + "."))
