"""The error a training run stops with when its loss stops being a number. Imports nothing, so
the command line can tell it apart without starting JAX."""


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the run stopped and kept its last good checkpoint."""
