"""Multi-device training with ``jax.sharding``: data parallelism, FSDP and tensor parallelism.

A device mesh with the axis ``'data'`` (``make_mesh``, ``--devices N``), or the axes
``('data', 'model')`` (``make_mesh_2d``, ``--mesh data=D,model=M``):

- every batch array is split along its batch axis B over ``'data'`` (``P('data')``): each
  data-parallel group runs the step on B / D rows (replicated over ``'model'``), and the
  gradient is summed across groups by the collectives XLA inserts;
- each parameter is laid out from the logical names of its axes, which the model gives it
  where it is created, through one rules table (``partitioning.LOGICAL_AXIS_RULES``):
  ``'replicated'`` (every device holds all parameters and optimizer moments) or ``'fsdp'``
  (each parameter, and its Adam moments, split along the width D over ``'data'``; XLA
  gathers a parameter where the computation needs it whole), plus, on a mesh with a
  ``'model'`` axis, Megatron-style tensor parallelism (attention heads and feed-forward
  hidden units split over ``'model'``).

``jax.jit`` follows the shardings of its inputs ("computation follows data"), so the
compiled ``train_step`` (``Trainer.train_step``) runs sharded as it is once its
arguments are placed::

    mesh = make_mesh_2d(data=2, model=4)                # or make_mesh() for data parallelism
    state = shard_state(trainer.init_state(), mesh, "fsdp")
    for step in range(n):
        batch = task.batch(seed, step, batch_size)      # numpy
        check_batch(batch, trainer.model_config)        # on the host, before sharding
        state, metrics = trainer.train_step(state, shard_batch(batch, mesh))

Multi-process (several hosts, or several processes on one machine): ``distributed.py``
starts JAX's runtime and ``flaxformer-mini train --coordinator ...`` runs it
(``docs/scale-out.md``; tested with real processes in ``tests/test_multiprocess.py``).

- ``make_mesh(n)`` takes ``n`` devices of every process (``--devices`` counts per process).
- Each process draws the same global batch from ``(seed, step)``, checks it on the host, and
  feeds its own rows: ``shard_batch(process_local_rows(batch, mesh), mesh)`` assembles the
  global array with ``jax.make_array_from_process_local_data``.
- ``shard_state`` places host values across processes (``jax.device_put`` refuses arrays
  committed to one local device there); ``to_local`` brings a state back to this process's
  device for work each process does alone (evaluation, decoding).
"""

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from flaxformer_mini.data import pad_rows
from flaxformer_mini.scale import distributed
from flaxformer_mini.scale.partitioning import (
    DATA_AXIS,
    MESH_AXES,
    MODEL_AXIS,
    STRATEGIES,
    check_divisible,
    format_mesh,
    named_shardings,
)
from flaxformer_mini.train.state import is_abstract


def _per_process_devices(num_devices):
    """The first ``num_devices`` local devices of every process (all when None), in process
    order: a mesh must give every process the same share, or some would feed no rows.

    Every process sees every process's devices (``distributed.devices_by_process``), so each
    one refuses the same mismatch with the same message, without a collective: hosts with
    different device counts and no ``--devices``, or a ``--devices`` some host lacks."""
    by_process = distributed.devices_by_process()
    counts = {p: len(ds) for p, ds in by_process.items()}
    fewest = min(counts.values())
    if num_devices is None and fewest != max(counts.values()):
        raise ValueError(f"the processes have different numbers of devices "
                         f"({distributed.describe_device_counts(by_process)}); a mesh takes as many of "
                         f"each: --devices N (N <= {fewest}) uses N devices of every process")
    n = fewest if num_devices is None else num_devices
    short = [p for p, c in counts.items() if c < n]
    if short:  # this process's own shortfall first, where it has one
        p = jax.process_index() if jax.process_index() in short else short[0]
        raise ValueError(
            f"asked for {n} devices per process but process {p} has only {counts[p]} "
            f"({jax.local_devices()[0].platform}); on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N "
            "simulates N devices"
        )
    return [d for p in counts for d in by_process[p][:n]]


def _mesh(shape, names, devices):
    # jax.make_mesh orders the devices for the hardware's topology (a plain reshape on CPU).
    # Auto axes, not its default Explicit ones: "computation follows data" (XLA's sharding
    # propagation) is what runs the model unchanged on any layout; Explicit axes would make
    # every op whose output layout is ambiguous name one (out_sharding=...).
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names), devices=devices)


def _check_count(num_devices):
    if isinstance(num_devices, bool) or not isinstance(num_devices, (int, np.integer)):
        raise TypeError(f"num_devices must be an integer, got {num_devices!r}")
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")


def make_mesh(num_devices=None, axis_name=DATA_AXIS):
    """A 1-D mesh over the first ``num_devices`` of ``jax.devices()`` (all by default).
    In a multi-process run ``num_devices`` counts each process's devices, and the mesh holds
    that many of every process's, process 0's first."""
    devices = jax.devices()
    if num_devices is not None:
        _check_count(num_devices)
    if jax.process_count() > 1:
        devices = _per_process_devices(num_devices)
        return _mesh((len(devices),), (axis_name,), devices)
    if num_devices is None:
        num_devices = len(devices)
    if num_devices > len(devices):
        raise ValueError(
            f"asked for {num_devices} devices but only {len(devices)} are available "
            f"({devices[0].platform}); on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N "
            "simulates N devices"
        )
    return _mesh((num_devices,), (axis_name,), devices[:num_devices])


def make_mesh_2d(data, model):
    """A ``data`` x ``model`` mesh with the axes ``('data', 'model')`` over every device of
    every process (``data * model`` must be all of them). A row of the mesh (one data-parallel
    group) is ``model`` consecutive devices, so with ``model`` dividing each process's device
    count the tensor-parallel collectives stay inside a process (a host)."""
    for size in (data, model):
        _check_count(size)
    devices = _per_process_devices(None)
    if data * model != len(devices):
        raise ValueError(
            f"--mesh {format_mesh({DATA_AXIS: data, MODEL_AXIS: model})} needs {data * model} devices but "
            f"{len(devices)} are available ({devices[0].platform}); on CPU, "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N simulates N devices"
        )
    return _mesh((data, model), MESH_AXES, devices)


def training_mesh(num_devices, strategy, batch_size, *, mesh_shape=None, model_sizes=None):
    """The mesh a training run uses, or None for one device in one process: checks the
    options before anything is written: the strategy, the device count, the batch size's
    divisibility by the data-parallel groups (None: the batches' rows follow their lengths,
    ``--max-tokens``, and ``pad_to_data_groups`` fills them up), and (``model_sizes``: {'embed': D, 'heads': H,
    'mlp': F}) the model's split axes against the mesh. ``num_devices`` (per process, None:
    every device) builds a 1-D 'data' mesh as ``--devices`` does; ``mesh_shape``
    ({'data': D, 'model': M}, ``partitioning.parse_mesh``) a 2-D one as ``--mesh`` does."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown --sharding {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if mesh_shape is not None:
        if num_devices is not None:
            raise ValueError("--mesh and --devices exclude each other: --mesh data=D,model=M uses D x M devices")
        option = f"--mesh {format_mesh(mesh_shape)}"
        if model_sizes is not None:  # a size problem is the user's first problem, whatever the machine
            check_divisible(model_sizes, strategy, mesh_shape, option)
        if jax.process_count() == 1 and jax.device_count() == 1 and mesh_shape[DATA_AXIS] * mesh_shape[MODEL_AXIS] == 1:
            return None
        mesh = make_mesh_2d(mesh_shape[DATA_AXIS], mesh_shape[MODEL_AXIS])
    else:
        if jax.process_count() == 1 and (num_devices == 1 or (num_devices is None and jax.device_count() == 1)):
            return None
        mesh = make_mesh(num_devices)
        if model_sizes is not None:
            option = f"--devices {num_devices}" if num_devices is not None else f"--devices (all {mesh.size})"
            check_divisible(model_sizes, strategy, dict(mesh.shape), option)
    if batch_size is not None:
        _check_divisible(batch_size, _data_size(mesh), "--batch-size", mesh)
    return mesh


def _data_size(mesh):
    """How many data-parallel groups split a batch: the size of the mesh's 'data' axis."""
    if DATA_AXIS not in mesh.axis_names:
        raise ValueError(f"expected a mesh with a {DATA_AXIS!r} axis (make_mesh, make_mesh_2d), got axes {mesh.axis_names}")
    return mesh.shape[DATA_AXIS]


# ----------------------------------------------------------------------------- batches


def batch_sharding(mesh):
    """Every batch array is split along its batch axis B over 'data' (and replicated over
    'model': the devices of one tensor-parallel group see the same rows): ``P('data')``.
    ``--accumulate`` feeds each micro-batch as one batch (``Trainer.accumulate``)."""
    _data_size(mesh)  # the mesh has a 'data' axis
    return NamedSharding(mesh, P(DATA_AXIS))


def pad_to_data_groups(batch, mesh):
    """``batch`` with PAD rows appended up to a multiple of the mesh's data-parallel groups
    (unchanged when it has as many). For ``--max-tokens`` batches, whose row count follows
    their length (``max_tokens // max(S, T)``): the batches stay the ones a single device
    trains on, whatever the mesh, with at most D - 1 rows of PAD more. A PAD row carries no
    labels, so the loss and gradient sums are those of the batch without it."""
    groups = _data_size(mesh)
    return pad_rows(batch, -(-len(batch.source) // groups) * groups)


def _check_divisible(batch_size, num_devices, what="batch size", mesh=None):
    # num_devices: the data-parallel groups (the 'data' axis); on a 1-D mesh, its devices. On a
    # mesh with a 'model' axis the groups are fewer than the devices, and named as such.
    if batch_size % num_devices:
        if mesh is not None and mesh.size != num_devices:
            groups = f"the mesh's {DATA_AXIS} axis ({num_devices} data-parallel groups of {mesh.size // num_devices} devices)"
        else:
            groups = f"{num_devices} devices"
        raise ValueError(f"{what} {batch_size} is not divisible by {groups}; use --batch-size a multiple of {num_devices}")


def local_row_range(mesh, global_batch_size):
    """``(start, stop)``: the rows of a global batch that live on this process's devices.

    Read from the sharding itself (``addressable_devices_indices_map``), so it holds
    whatever order the mesh puts the hosts' devices in. In a single process: ``(0, B)``.
    """
    _check_divisible(global_batch_size, _data_size(mesh), "global batch size", mesh)
    index_map = batch_sharding(mesh).addressable_devices_indices_map((global_batch_size,))
    # A set: on a 2-D mesh the devices of one 'model' group hold the same rows.
    ranges = sorted({index[0].indices(global_batch_size)[:2] for index in index_map.values()})
    start, stop = ranges[0][0], ranges[-1][1]
    if sum(b - a for a, b in ranges) != stop - start:  # never on a mesh from make_mesh / make_mesh_2d
        raise ValueError(f"this process's rows of the batch are not contiguous: {ranges}")
    return start, stop


def process_local_rows(global_batch, mesh):
    """The rows of a global batch that this process feeds to ``shard_batch`` (multi-host).

    Every host can draw the same global batch (the data are functions of (seed, step)) and
    keep its own rows. In a single process this is the whole batch.
    """
    if jax.process_count() == 1:
        return global_batch
    start, stop = local_row_range(mesh, np.shape(jax.tree.leaves(global_batch)[0])[0])
    return jax.tree.map(lambda a: np.asarray(a)[start:stop], global_batch)


def shard_batch(batch, mesh):
    """Put a ``Batch`` (or any pytree of arrays whose first axis is the batch) on the mesh.

    Single process: ``batch`` is the whole batch, placed with ``jax.device_put``. Multi-host:
    ``batch`` is this host's slice (``process_local_rows``) and the result is the global
    array, assembled with ``jax.make_array_from_process_local_data``.
    """
    sharding = batch_sharding(mesh)
    leaves = jax.tree.leaves(batch)
    sizes = {np.shape(a)[0] if np.ndim(a) else None for a in leaves}
    if None in sizes:
        raise ValueError("every batch array needs a batch axis (its first); got a scalar")
    if len(sizes) != 1:
        raise ValueError(f"batch arrays disagree on the batch size: {sorted(sizes)}")
    (size,) = sizes
    if jax.process_count() == 1:
        _check_divisible(size, _data_size(mesh), mesh=mesh)
        return jax.device_put(batch, sharding)
    # Multi-host: this host holds size rows for the data-parallel groups its devices are in.
    _check_divisible(size, _local_data_groups(mesh), "per-host batch size")
    return jax.tree.map(lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)), batch)


def _local_data_groups(mesh):
    """How many positions along 'data' this process's devices occupy."""
    axis = mesh.axis_names.index(DATA_AXIS)
    here = jax.process_index()
    return len({index[axis] for index, d in np.ndenumerate(mesh.devices) if d.process_index == here})


# ----------------------------------------------------------------------------- training state


def state_shardings(state, mesh, strategy="replicated"):
    """A pytree of ``NamedSharding`` matching ``state`` (a ``TrainState`` or any pytree).

    Each parameter by the logical names of its axes under ``strategy``'s row of
    ``partitioning.LOGICAL_AXIS_RULES`` ('replicated' or 'fsdp', over 'data'), plus the
    'tensor' row on a mesh with a 'model' axis. Adam's moments hold the same variables as the
    parameters (metadata included), so each is split like its parameter; scalars (the step,
    optimizer counts, RNG counters), PRNG keys and unannotated arrays are replicated. A split
    axis that its mesh axis does not divide is a ValueError naming the parameter.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown sharding strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    return named_shardings(state, mesh, strategy)


def _is_key_array(x):
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _host_value(leaf):
    """A state leaf as a host array: a PRNG key array as its raw key data."""
    return np.asarray(jax.random.key_data(leaf) if _is_key_array(leaf) else leaf)


def _from_host(leaf, value, sharding):
    """The global array of ``sharding`` holding host ``value``: each process fills its own
    devices' shards (``make_array_from_callback``), no collective. A key array is rebuilt from
    its key data, laid out as the key array would be (a trailing key axis, not split)."""
    array = jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
    return jax.random.wrap_key_data(array, impl=jax.random.key_impl(leaf)) if _is_key_array(leaf) else array


def shard_state(state, mesh, strategy="replicated"):
    """``state`` laid out by ``state_shardings(state, mesh, strategy)``, in one process or many;
    an abstract ``state`` (``jax.ShapeDtypeStruct``s) becomes the same shapes with those
    shardings, the template orbax restores each process's shards into.

    Across processes the values come from the host: every process holds the same state (same
    seed), checked once with one digest per leaf (``distributed.agree_on_values``), and places
    its own shards. ``jax.device_put`` would refuse arrays committed to a local device there, and
    for host values it runs a cross-process equality check per leaf: a collective for each of a
    state's hundreds of arrays and a compilation per shape (docs/scale-out.md has the counts)."""
    shardings = state_shardings(state, mesh, strategy)
    if is_abstract(state):  # shapes (a template to restore into): the same shapes, laid out
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
    if jax.process_count() == 1:
        return jax.device_put(state, shardings)
    host = jax.tree.map(_host_value, state)
    distributed.agree_on_values(host, "the initial training state")
    return jax.tree.map(_from_host, state, host, shardings)


def _identity(tree):
    return tree


def to_local(tree):
    """The same values on this process's own device(s), for work every process does alone
    (evaluation, decoding): a replicated leaf is read from a local copy, the split ones gathered
    across processes all at once (one compiled identity with replicated outputs, as
    ``multihost_utils.process_allgather`` does leaf by leaf with a compilation per shape; the
    whole array on every host, fine at the sizes this project trains). In one process: ``tree``
    itself."""
    if jax.process_count() == 1:
        return tree
    leaves, treedef = jax.tree.flatten(tree)
    split = [i for i, x in enumerate(leaves)
             if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated]
    if split:  # NamedShardings: shard_state lays the state out so, and the jitted step keeps them
        replicated = [NamedSharding(leaves[i].sharding.mesh, P()) for i in split]
        gathered = jax.jit(_identity, out_shardings=replicated)([leaves[i] for i in split])
        for i, x in zip(split, gathered):
            leaves[i] = x
    leaves = [x.addressable_data(0) if isinstance(x, jax.Array) and not x.is_fully_addressable else x for x in leaves]
    return jax.tree.unflatten(treedef, leaves)
