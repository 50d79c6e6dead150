"""A parameter's name from its pytree path: what sharding, checkpoint and multi-process
messages call it (``'encoder/embedding_layer/embedding'``)."""


def path_name(path):
    """``'encoder/embedding_layer/embedding'``: a parameter's pytree path (jax key entries of
    an ``nnx.State``, a TrainState or orbax's stored metadata), without NNX's ``value`` leaf
    names."""
    return "/".join(n for n in map(_key_name, path) if n != "value")


def _key_name(entry):
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)
