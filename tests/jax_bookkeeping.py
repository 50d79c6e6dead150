"""Cheaper JAX bookkeeping in the pytest processes (tests/conftest.py imports this module): two
of JAX's internal steps that cost the suite CPU and change no program and no number.

- Lowering. JAX makes a new MLIR context for every program it lowers (``mlir.make_ir_context``)
  and loads every dialect it uses into it, about 5 ms, and a pytest worker lowers thousands of
  programs: every eager operation of a new shape, every ``jit`` of a new configuration, and
  every program read from the persistent compilation cache, whose key is computed from the
  lowered module. A context holds what the modules made in it share (types, attributes, source
  locations), not the modules themselves, so a module lowered into a reused context is the
  module a new one would hold. Here each thread reuses one context for ``RENEW_EVERY``
  lowerings; renewing it bounds what it keeps (constants embedded in programs among it).
- A tracer's ``sharding``. Asked of a tracer, the attribute raises an AttributeError whose
  message names where the tracer came from, which JAX finds by walking every equation traced so
  far. The message is never seen: Python answers a property's AttributeError by calling
  ``Tracer.__getattr__``, whose own error is the one raised. Flax asks for it at every RNG
  stream's counter it increments: under ``nnx.eval_shape`` (``Transformer.abstract``) each
  parameter's init paid that walk, so the cost grew with the square of the number of
  parameters. Here the message is built when it is shown, not when the error is raised.

Measured: docs/testing.md, "Where the time goes". Each replacement applies only where JAX's
function has the form it expects, so that another JAX release runs the tests unchanged, with
JAX's own bookkeeping.
"""

import inspect
import threading

from jax._src import core
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


class TracerAttributeError(AttributeError):
    """JAX's AttributeError for a tracer's ``sharding``, its message built when it is shown."""

    def __init__(self, tracer):
        super().__init__()
        self.tracer = tracer

    def __str__(self):
        return (f"The 'sharding' attribute is not available on {self.tracer._error_repr()}."
                f"{self.tracer._origin_msg()}")


def _sharding(self):
    raise TracerAttributeError(self)


if (callable(_new_context) and not inspect.signature(_new_context).parameters
        and _new_context.__module__ != __name__):
    mlir.make_ir_context = make_ir_context
_jax_sharding = inspect.getattr_static(core.Tracer, "sharding", None)
if (isinstance(_jax_sharding, property) and _jax_sharding.fget.__module__ == core.__name__
        and "_origin_msg" in _jax_sharding.fget.__code__.co_names):
    core.Tracer.sharding = property(_sharding)
