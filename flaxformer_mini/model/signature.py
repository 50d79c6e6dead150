"""``ConstructorSignature``: the signature ``help()`` and ``inspect`` show for a model class."""

import inspect


class ConstructorSignature:
    """A module class's ``__signature__``: its ``__init__``'s parameters, ``self`` left out.

    flax's module metaclass defines ``__call__(cls, *args, **kwargs)``, and ``inspect.signature``
    reads a class's signature from its metaclass's ``__call__`` first: ``help(Transformer)`` would say
    ``Transformer(*args, **kwargs)`` where PyTorch's says its constructor's arguments. Read on an
    instance it is absent, so a module's signature stays its ``__call__``'s."""

    def __get__(self, instance, owner):
        if instance is not None:
            raise AttributeError("__signature__")
        signature = inspect.signature(owner.__init__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])
