"""Importing this module makes JAX lower programs into a reused MLIR context (one per thread,
renewed every ``RENEW_EVERY`` lowerings): tests/conftest.py imports it in the pytest processes.

JAX makes a new MLIR context for every program it lowers (``mlir.make_ir_context``) and loads
every dialect it uses into it, about 5 ms, and a pytest worker lowers thousands of programs:
every eager operation of a new shape, every ``jit`` of a new configuration, and every program
read from the persistent compilation cache, whose key is computed from the lowered module. A
context holds what the modules made in it share (types, attributes, source locations), not the
modules themselves, so a module lowered into a reused context is the module a new one would
hold: the programs compiled, and every number they compute, are the same. Renewing the context
bounds what it keeps (constants embedded in programs among it); one per thread keeps threads
from sharing one. Measured: docs/testing.md, "Where the time goes".
"""

import inspect
import threading

from jax._src.interpreters import mlir

RENEW_EVERY = 100

_new_context = mlir.make_ir_context
_local = threading.local()


def make_ir_context():
    """This thread's context, a new one every RENEW_EVERY calls."""
    if getattr(_local, "uses", RENEW_EVERY) >= RENEW_EVERY:
        _local.context, _local.uses = _new_context(), 0
    _local.uses += 1
    return _local.context


# JAX's internal function: replaced only where it takes no parameters, as this one expects, so
# that another JAX release runs the tests unchanged, each lowering in a context of its own.
if callable(_new_context) and not inspect.signature(_new_context).parameters and _new_context.__module__ != __name__:
    mlir.make_ir_context = make_ir_context

