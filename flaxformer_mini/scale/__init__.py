"""Scale-out: JAX's multi-process runtime (``distributed.py``), the guards a process takes on its
host before joining one (``host_guards.py``) and its errors (``errors.py``); where the model's
logical axes go on a mesh (``partitioning.py``); meshes and the placement of batches and train
states on them (``sharding.py``). It imports ``model``, ``train`` and ``data``.
"""
