"""A package's names imported on first use (PEP 562), for flaxformer_mini's and parity's
``__init__``: their command lines' ``--help`` and option errors answer without importing JAX,
Flax or torch (seconds), while ``from package import Name`` works as usual."""

import importlib


def lazy_exports(package, exports, namespace, subpackages=()):
    """``(__getattr__, __dir__)`` for the package ``package`` whose globals are ``namespace``:
    ``exports`` maps each exported name to the module that defines it; ``subpackages`` are
    imported on first use too, so ``package.sub`` works without ``import package.sub`` (a REPL's
    ``help(fm.train)``)."""

    def __getattr__(name):
        if name in subpackages:
            return importlib.import_module(f"{package}.{name}")  # the import binds it in namespace
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__():
        return sorted(set(namespace) | set(exports) | set(subpackages))

    return __getattr__, __dir__
