"""Sharded training (data parallel and FSDP) computes what single-device training computes.

The multi-device runs need 8 devices, which on CPU means
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before JAX starts. That flag would
change the device count of the whole pytest run, so the runs happen in a subprocess
(this file, run as a script with ``--worker``), which prints one JSON line of measurements;
the tests below assert on it. The worker also asserts that it sees 8 devices and that FSDP
really splits parameters, so nothing here can pass on one device by accident.

Why a subprocess rather than ``jax.config.update("jax_num_cpu_devices", 8)`` (JAX's own
switch, the idiomatic one): it is refused once the CPU backend has started (jax validates
"backend not initialized"), and under pytest-xdist earlier tests in the same worker have
started it; and where it could still be set, it is process-wide, so every later test in that
worker would see 8 devices and the CLI's ``--devices`` default (all of them) would change
under them. So the worker keeps its subprocess and its XLA flag (other tests reuse this
file's worker machinery).

Numbers, for the record (float32, highest matmul precision): losses agree to ~1e-6 and
parameters after 5 Adam steps to ~5e-7, with and without dropout.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from simulated_devices import worker_env

from flaxformer_mini.scale.sharding import _per_process_devices, local_row_range, make_mesh, pad_to_data_groups, process_local_rows, state_shardings, training_mesh

NUM_DEVICES = 8
STEPS = 5
BATCH_SIZE = 8  # one row per device, as tests/test_tensor_parallel.py's runs (below)
ATOL = 1e-5  # DESIGN.md's parity tolerance
DROPOUT = 0.1
WORKER_TIMEOUT_S = 300

# Adam's epsilon for these runs, and why it is not the paper's 1e-9 (TrainConfig's default).
# The key bias of every attention layer has an exactly zero gradient (softmax over keys is
# invariant to adding q.b to every score of a row), so what it gets is float round-off,
# ~1e-10, whose sign depends on the order of the sums. Adam divides by sqrt(v) + eps: with
# eps = 1e-9 that round-off becomes a step of ~lr in a random direction, and sharded and
# single-device runs end up 6e-3 apart in those biases after 5 steps while the losses agree
# to 1e-6. That is Adam amplifying noise (any change of summation order does it, a
# different device too), not a sharding error. eps = 1e-4 damps round-off below 1e-7 and
# leaves the real updates (gradients ~1e-4..1e-2) of Adam's normalised size.
ADAM_EPS = 1e-4
LEARNING_RATE = 1e-2  # constant: the rsqrt warm-up would move parameters by ~1e-6, below ATOL


# ----------------------------------------------------------------------------- the worker


def _tiny_config(dropout):
    import flaxformer_mini as fm

    # tiny's sizes (30 wide, vocabularies 23 and 19, max_len 17) have no dimension divisible
    # by 8, so FSDP would replicate everything. Width 40 gives the kernels, embeddings and
    # LayerNorm vectors an axis to split; the odd sizes stay odd. One layer on each side:
    # placement is by parameter name, whatever the depth, and a second layer doubles each
    # compilation (tests/helpers.py's TINY_RUN). 4 heads, the batch size, the optimizer and the
    # data of tests/test_tensor_parallel.py's runs: its unsharded and 8-device replicated train
    # steps are these runs' without dropout, so the worker that comes second reads them from
    # the suite's compilation cache (tests/conftest.py).
    return fm.get_preset("tiny").replace(embed_size=40, heads=4, dropout=dropout, num_layers=1)


def _max_diff(a, b):
    import jax

    worst, where = 0.0, None
    flat_b = dict(jax.tree_util.tree_flatten_with_path(b)[0])
    for path, x in jax.tree_util.tree_flatten_with_path(a)[0]:
        d = float(np.abs(np.asarray(x, np.float64) - np.asarray(flat_b[path], np.float64)).max())
        if d >= worst:
            worst, where = d, jax.tree_util.keystr(path)
    return worst, where


def _train(model_config, batches, mesh=None, strategy=None):
    """STEPS train steps from the same initial model; returns state, losses, initial params
    and the shardings the state was put with (None unsharded)."""
    import jax
    from flax import nnx

    import flaxformer_mini as fm
    from flaxformer_mini.scale.sharding import shard_batch, state_shardings
    from flaxformer_mini.train.optimizer import TrainConfig
    from flaxformer_mini.train.step import check_batch
    from flaxformer_mini.train.trainer import Trainer

    model = fm.Transformer.from_config(model_config, rngs=nnx.Rngs(0))
    trainer = Trainer(model, TrainConfig(schedule="constant", learning_rate=LEARNING_RATE, eps=ADAM_EPS))
    state = trainer.init_state()
    initial = jax.device_get(state.params)  # host copies: the step donates the state's buffers
    shardings, step, put = None, trainer.train_step, lambda b: b
    if strategy is not None:
        shardings = state_shardings(state, mesh, strategy)
        state = jax.device_put(state, shardings)
        put = lambda b: shard_batch(b, mesh)  # noqa: E731
    losses = []
    for batch in batches:
        check_batch(batch, trainer.model_config)  # on the numpy batch, before it is sharded
        state, metrics = step(state, put(batch))
        losses.append(float(metrics["loss"]))
    return state, losses, initial, shardings


def _sharding_report(state, shardings):
    """Which leaves of the output state lost the sharding they were put with, and what FSDP
    did to the parameters."""
    import jax

    expected = dict(jax.tree_util.tree_flatten_with_path(shardings)[0])
    lost = [
        jax.tree_util.keystr(path)
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
        if not leaf.sharding.is_equivalent_to(expected[path], leaf.ndim)
    ]
    mu = dict(jax.tree_util.tree_flatten_with_path(state.opt_state[1][0].mu)[0])
    split, example = [], None
    for path, p in jax.tree_util.tree_flatten_with_path(state.params)[0]:
        if p.sharding.is_fully_replicated:
            continue
        shard_shape = p.addressable_shards[0].data.shape
        split.append(jax.tree_util.keystr(path))
        assert int(np.prod(shard_shape)) * NUM_DEVICES == p.size, (path, shard_shape, p.shape)
        assert mu[path].sharding.is_equivalent_to(p.sharding, p.ndim), f"Adam's mu of {path} is not split like it"
        if example is None or p.size > example["size"]:
            example = {"path": jax.tree_util.keystr(path), "spec": str(p.sharding.spec), "size": p.size,
                       "global_shape": list(p.shape), "shard_shape": list(shard_shape)}
    keys = [x for x in jax.tree.leaves(state.other) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]
    return {
        "lost": lost,
        "num_params": len(jax.tree.leaves(state.params)),
        "split_params": split,
        "example": example,
        "num_keys": len(keys),
        "keys_replicated": all(k.sharding.is_fully_replicated for k in keys),
    }


def _worker():
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    jax.config.update("jax_numpy_rank_promotion", "raise")
    assert jax.device_count() == NUM_DEVICES, f"expected {NUM_DEVICES} simulated devices, got {jax.device_count()}"

    from flaxformer_mini.data import SyntheticTask
    from flaxformer_mini.scale.sharding import local_row_range, make_mesh, shard_batch

    mesh = make_mesh(NUM_DEVICES)
    config = _tiny_config(0.0)
    task = SyntheticTask("reverse", config.target_vocab_size, 1, config.max_len - 1)
    batches = [task.batch(0, i, BATCH_SIZE) for i in range(STEPS)]
    out = {"device_count": jax.device_count(), "threefry_partitionable": bool(jax.config.jax_threefry_partitionable)}

    runs = {
        # name: (dropout, strategy); each is compared with its unsharded twin. FSDP is run with
        # dropout alone: its masks are the one thing dropout adds to the sharded step, and a
        # dropout-free FSDP run would compile an 8-device step more to show a subset of it.
        "replicated": (0.0, "replicated"),
        "fsdp_dropout": (DROPOUT, "fsdp"),
    }
    references = {}
    for dropout in (0.0, DROPOUT):
        state, losses, initial, _ = _train(_tiny_config(dropout), batches)
        moved, _ = _max_diff(state.params, initial)
        references[dropout] = (state, losses)
        out[f"reference_{dropout}"] = {"losses": losses, "params_moved": moved}
    for name, (dropout, strategy) in runs.items():
        state, losses, _, shardings = _train(_tiny_config(dropout), batches, mesh, strategy)
        ref_state, ref_losses = references[dropout]
        param_diff, param_where = _max_diff(state.params, ref_state.params)
        out[name] = {
            "losses": losses,
            "loss_diff": float(np.abs(np.subtract(losses, ref_losses)).max()),
            "param_diff": param_diff,
            "param_diff_at": param_where,
            **_sharding_report(state, shardings),
        }

    out["local_row_range"] = list(local_row_range(mesh, BATCH_SIZE))
    try:
        shard_batch(task.batch(0, 0, 30), mesh)
        out["indivisible_batch_error"] = None
    except ValueError as e:
        out["indivisible_batch_error"] = str(e)
    print(json.dumps(out))


# ----------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def runs():
    root = Path(__file__).resolve().parents[1]
    env = worker_env(NUM_DEVICES)
    proc = subprocess.run(
        [sys.executable, __file__, "--worker"], env=env, cwd=root, capture_output=True, text=True,
        timeout=WORKER_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_worker_sees_eight_devices(runs):
    assert runs["device_count"] == NUM_DEVICES


def test_training_moves_the_parameters_well_beyond_the_tolerance(runs):
    # Otherwise "parameters agree within 1e-5" would say nothing.
    for dropout in (0.0, DROPOUT):
        assert runs[f"reference_{dropout}"]["params_moved"] > 100 * ATOL


@pytest.mark.parametrize("name", ["replicated", "fsdp_dropout"])
def test_sharded_training_matches_single_device(runs, name):
    r = runs[name]
    assert len(r["losses"]) == STEPS
    assert r["loss_diff"] <= ATOL, f"{name}: losses differ by {r['loss_diff']:.2e}"
    assert r["param_diff"] <= ATOL, f"{name}: parameters differ by {r['param_diff']:.2e} at {r['param_diff_at']}"


def test_dropout_draws_the_same_masks_sharded_and_unsharded(runs):
    # The dropout run really drops (its losses are not the dropout-free ones), and its sharded
    # losses match the unsharded ones (test above): jax.random's values do not depend on how
    # an array is sharded, so the masks are the same, not just statistically alike.
    with_dropout, without = runs[f"reference_{DROPOUT}"]["losses"], runs["reference_0.0"]["losses"]
    assert np.abs(np.subtract(with_dropout, without)).max() > 1e-3
    assert runs["fsdp_dropout"]["loss_diff"] <= ATOL


@pytest.mark.parametrize("name", ["replicated", "fsdp_dropout"])
def test_train_step_keeps_the_state_sharding(runs, name):
    # Trainer.train_step as it is: jit follows the input shardings, and the output keeps them.
    assert runs[name]["lost"] == []
    assert runs[name]["num_keys"] > 0 and runs[name]["keys_replicated"]


def test_fsdp_splits_parameters_across_devices(runs):
    r = runs["fsdp_dropout"]
    assert len(r["split_params"]) >= r["num_params"] // 2, r["split_params"]
    ex = r["example"]
    assert ex["shard_shape"] != ex["global_shape"]
    assert np.prod(ex["shard_shape"]) * NUM_DEVICES == np.prod(ex["global_shape"])


def test_replicated_strategy_splits_nothing(runs):
    assert runs["replicated"]["split_params"] == []


def test_shard_batch_rejects_a_batch_size_not_divisible_by_the_devices(runs):
    message = runs["indivisible_batch_error"]
    assert message is not None, "shard_batch accepted 30 rows on 8 devices"
    assert "batch size 30 is not divisible by 8 devices" in message
    assert "multiple of 8" in message


def test_one_process_owns_every_row_of_the_batch(runs):
    assert runs["local_row_range"] == [0, BATCH_SIZE]


# In-process checks (this pytest process's single device).


def test_process_local_rows_in_one_process_is_the_whole_batch():
    batch = (np.arange(6).reshape(3, 2), np.arange(3).reshape(3, 1))
    assert local_row_range(make_mesh(1), 3) == (0, 3)
    assert process_local_rows(batch, make_mesh(1)) is batch


@pytest.mark.parametrize("rows, groups, expected", [(7, 4, 8), (8, 4, 8), (3, 2, 4), (5, 1, 5)])
def test_a_batch_is_filled_with_pad_rows_up_to_a_multiple_of_the_data_groups(rows, groups, expected):
    # A --max-tokens batch has max_tokens // max(S, T) rows, whatever the mesh; the 'data' axis
    # (not the 'model' one) must divide them.
    from jax.sharding import AbstractMesh

    from flaxformer_mini.data import PAD, Batch

    rng = np.random.default_rng(0)
    batch = Batch(*(rng.integers(4, 20, size=(rows, n)) for n in (5, 6, 6)))
    padded = pad_to_data_groups(batch, AbstractMesh((groups, 2), ("data", "model")))
    for before, after in zip(batch, padded):
        assert after.shape == (expected, before.shape[1])
        np.testing.assert_array_equal(after[:rows], before)
        assert (after[rows:] == PAD).all()


class _HostDevice(NamedTuple):  # what _per_process_devices reads of a jax.Device
    process_index: int
    id: int
    platform: str = "cpu"


def hosts_with(monkeypatch, counts, me):
    """This process is process ``me`` of len(counts) whose device counts are ``counts``; every
    process sees every device, as in a multi-process jax runtime."""
    import jax

    devices = [_HostDevice(p, 100 * p + i) for p, n in enumerate(counts) for i in range(n)]
    monkeypatch.setattr(jax, "devices", lambda: devices)
    monkeypatch.setattr(jax, "process_index", lambda: me)
    monkeypatch.setattr(jax, "process_count", lambda: len(counts))
    monkeypatch.setattr(jax, "local_devices", lambda: [d for d in devices if d.process_index == me])


@pytest.mark.parametrize("me", [0, 1])
def test_hosts_with_different_device_counts_are_refused_naming_the_counts_on_every_process(monkeypatch, me):
    # Unchecked, each process builds its mesh from its own count, and the mismatch surfaces as a
    # reshape error.
    hosts_with(monkeypatch, [2, 1], me)
    for build in (make_mesh, lambda: training_mesh(None, "replicated", 8, mesh_shape={"data": 3, "model": 1})):
        with pytest.raises(ValueError, match=r"different numbers of devices \(process 0: 2, process 1: 1\).*"
                                             r"--devices N \(N <= 1\)"):
            build()
    with pytest.raises(ValueError, match="asked for 2 devices per process but process 1 has only 1 "):
        make_mesh(2)


def test_a_mesh_takes_the_same_devices_of_every_process_in_process_order(monkeypatch):
    hosts_with(monkeypatch, [3, 3], me=1)
    assert [d.id for d in _per_process_devices(None)] == [0, 1, 2, 100, 101, 102]
    assert [d.id for d in _per_process_devices(2)] == [0, 1, 100, 101]
    # More than two processes (tests/test_multiprocess.py launches two): process order still,
    # whichever process asks.
    for me in (0, 2, 3):
        hosts_with(monkeypatch, [2, 2, 2, 2], me=me)
        assert [d.id for d in _per_process_devices(1)] == [0, 100, 200, 300]
        assert [d.id for d in _per_process_devices(None)] == [0, 1, 100, 101, 200, 201, 300, 301]


def test_make_mesh_rejects_more_devices_than_exist():
    import jax

    with pytest.raises(ValueError, match=f"asked for {jax.device_count() + 1} devices but only {jax.device_count()}"):
        make_mesh(jax.device_count() + 1)


def test_state_shardings_rejects_an_unknown_strategy():
    with pytest.raises(ValueError, match="unknown sharding strategy 'zero3'"):
        state_shardings({"w": np.zeros(3)}, make_mesh(1), "zero3")


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    from flaxformer_mini.collector import collecting_rarely

    with collecting_rarely():  # as a command runs: flaxformer_mini/collector.py
        _worker()
