"""Sharding from the model's logical axis names, and tensor parallelism on a 2-D mesh.

The 8-device checks run in one subprocess (this file as a script with ``--worker``; on CPU
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set before JAX starts, and
would change the device count of the whole pytest run, as in tests/test_sharding.py). The
worker prints one JSON line of measurements, the tests assert on it:

- the layout of the placed state on ``data=2,model=4`` (replicated over data) and
  ``data=4,model=2`` (FSDP over data): Megatron's column-parallel Q/K/V and first
  feed-forward layer, row-parallel attention output and second feed-forward layer, the Adam
  moments split like their parameter, the step and RNG keys replicated;
- the losses of STEPS steps on both meshes against one device;
- a checkpoint saved tensor-parallel, restored on one device and replicated over 8 devices,
  continued for STEPS more steps, against continuing on the mesh it was saved from;
- ``flaxformer-mini train --mesh data=2,model=4`` end to end, the mesh named in its output.

Numbers, for the record (float32, highest matmul precision): see the comments at the tests.
"""

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from simulated_devices import worker_env
from flax import nnx
from jax.sharding import PartitionSpec as P

import flaxformer_mini as fm
from flaxformer_mini.model import primitives
from flaxformer_mini.model.axes import EMBED, HEADS, KV, LENGTH, MLP, VOCAB
from flaxformer_mini.scale.partitioning import LOGICAL_AXIS_RULES, axis_rules, logical_axes, logical_spec, parse_mesh, state_specs

NUM_DEVICES = 8
STEPS = 4
BATCH_SIZE = 8
ATOL = 1e-5  # DESIGN.md's parity tolerance
ADAM_EPS = 1e-4  # not 1e-9: Adam would amplify the round-off of zero gradients (tests/test_sharding.py)
LEARNING_RATE = 1e-2
WORKER_TIMEOUT_S = 400
LAYOUTS = {
    # name: (data, model, --sharding over data)
    "data=2,model=4": (2, 4, "replicated"),
    "data=4,model=2": (4, 2, "fsdp"),
}
ATTENTION = "encoder/transformer_layers/0/attention"
FFN = "decoder/decoder_layers/0/transformer_block/fc"
# The parameters whose layout the tests check, with the spec each should get (trailing Nones
# dropped) on each mesh.
EXPECTED_SPECS = {
    "data=2,model=4": {
        f"{ATTENTION}/W_q/kernel": [None, "model"],  # column-parallel: each device its own heads
        f"{ATTENTION}/W_k/kernel": [None, "model"],
        f"{ATTENTION}/W_v/kernel": [None, "model"],
        f"{ATTENTION}/W_q/bias": ["model"],
        f"{ATTENTION}/fc/kernel": ["model"],  # row-parallel: partial sums, one all-reduce
        f"{ATTENTION}/fc/bias": [],
        f"{FFN}/0/kernel": [None, "model"],
        f"{FFN}/0/bias": ["model"],
        f"{FFN}/2/kernel": ["model"],
        f"{FFN}/2/bias": [],
        "encoder/embedding_layer/embedding": [],
        "decoder/fc/kernel": [],
        "encoder/transformer_layers/0/norm1/scale": [],
    },
    "data=4,model=2": {  # the same, and the width D split over 'data' (FSDP)
        f"{ATTENTION}/W_q/kernel": ["data", "model"],
        f"{ATTENTION}/W_q/bias": ["model"],
        f"{ATTENTION}/fc/kernel": ["model", "data"],
        f"{ATTENTION}/fc/bias": ["data"],
        f"{FFN}/0/kernel": ["data", "model"],
        f"{FFN}/2/kernel": ["model", "data"],
        "encoder/embedding_layer/embedding": [None, "data"],
        "decoder/fc/kernel": ["data"],
        "encoder/transformer_layers/0/norm1/scale": ["data"],
    },
}


def _config(dropout=0.0):
    # tiny's odd sizes, with heads 4 (K = 10) and width 40, so that model=4 and model=2 split
    # whole heads, and data=4 divides the width; F = D = 40. One layer on each side: the layout
    # is by parameter name, whatever the depth, and a second layer doubles each compilation
    # (tests/helpers.py's TINY_RUN).
    return fm.get_preset("tiny").replace(embed_size=40, heads=4, dropout=dropout, num_layers=1)


# ----------------------------------------------------------------------------- the worker


def _flat(tree):
    import jax

    from flaxformer_mini.model.paths import path_name

    return {path_name(path): x for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _spec(x):
    spec = list(x.sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return spec


def _max_diff(a, b):
    fa, fb = _flat(a), _flat(b)
    return max(float(np.abs(np.asarray(fa[k], np.float64) - np.asarray(fb[k], np.float64)).max()) for k in fa)


def _steps(trainer, state, batches, mesh):
    from flaxformer_mini.scale.sharding import shard_batch
    from flaxformer_mini.train.step import check_batch

    losses = []
    for batch in batches:
        check_batch(batch, trainer.model_config)
        state, metrics = trainer.train_step(state, batch if mesh is None else shard_batch(batch, mesh))
        losses.append(float(metrics["loss"]))
    return state, losses


def _layout_report(state, name):
    import jax

    params, mu = _flat(state.params), _flat(state.opt_state[1][0].mu)
    keys = [x for x in jax.tree.leaves(state.other) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]
    W_q = params[f"{ATTENTION}/W_q/kernel"]
    return {
        "specs": {path: _spec(params[path]) for path in EXPECTED_SPECS[name]},
        "mu_like_param": all(mu[k].sharding.is_equivalent_to(p.sharding, p.ndim) for k, p in params.items()),
        "step_replicated": state.step.sharding.is_fully_replicated,
        "keys_replicated": bool(keys) and all(k.sharding.is_fully_replicated for k in keys),
        "W_q_shard_shape": list(W_q.addressable_shards[0].data.shape),
    }


def _worker(tmp):
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    jax.config.update("jax_numpy_rank_promotion", "raise")
    assert jax.device_count() == NUM_DEVICES, f"expected {NUM_DEVICES} simulated devices, got {jax.device_count()}"

    from flaxformer_mini.train import checkpoint
    from flaxformer_mini.data import SyntheticTask
    from flaxformer_mini.scale.sharding import make_mesh, make_mesh_2d, shard_state
    from flaxformer_mini.train.optimizer import TrainConfig
    from flaxformer_mini.train.trainer import Trainer

    config = _config()
    task = SyntheticTask("reverse", config.target_vocab_size, 1, config.max_len - 1)
    batches = [task.batch(0, i, BATCH_SIZE) for i in range(2 * STEPS)]
    first, then = batches[:STEPS], batches[STEPS:]
    trainer = Trainer(fm.Transformer.from_config(config, rngs=nnx.Rngs(0)),
                      TrainConfig(schedule="constant", learning_rate=LEARNING_RATE, eps=ADAM_EPS))
    out = {"device_count": jax.device_count()}

    initial = jax.device_get(trainer.init_state().params)
    ref_state, ref_losses = _steps(trainer, trainer.init_state(), first, None)
    out["reference"] = {"losses": ref_losses, "params_moved": _max_diff(ref_state.params, initial)}

    saved = None
    for name, (data, model, strategy) in LAYOUTS.items():
        mesh = make_mesh_2d(data, model)
        state, losses = _steps(trainer, shard_state(trainer.init_state(), mesh, strategy), first, mesh)
        out[name] = {"losses": losses, "loss_diff": float(np.abs(np.subtract(losses, ref_losses)).max()),
                     "param_diff": _max_diff(state.params, ref_state.params), **_layout_report(state, name)}
        if saved is None:  # the first layout's checkpoint, continued below on other meshes
            manager = checkpoint.open_manager(Path(tmp) / "checkpoints")
            checkpoint.save(manager, state)
            saved, saved_params = (name, mesh, strategy), state.params

    # Checkpoints across meshes: the tensor-parallel checkpoint continued where it was saved,
    # replicated over 8 devices, and on one device.
    name, tp_mesh, tp_strategy = saved
    continued = {}
    for where, (mesh, strategy) in {"own mesh": (tp_mesh, tp_strategy), "replicated, 8 devices": (make_mesh(8), "replicated"),
                                    "1 device": (None, None)}.items():
        template = trainer.init_state()
        if mesh is not None:
            template = shard_state(template, mesh, strategy)
        state = checkpoint.restore(manager, template)
        assert int(state.step) == STEPS
        layout = "unsharded" if mesh is None else str(_spec(_flat(state.params)[f"{ATTENTION}/W_q/kernel"]))
        restored_diff = _max_diff(state.params, saved_params)  # the saved values, not the template's
        state, losses = _steps(trainer, state, then, mesh)
        continued[where] = {"losses": losses, "W_q_layout": layout, "params": state.params, "restored_diff": restored_diff}
    own = continued["own mesh"]
    out["continued"] = {
        where: {"losses": c["losses"], "W_q_layout": c["W_q_layout"],
                "loss_diff": float(np.abs(np.subtract(c["losses"], own["losses"])).max()),
                "exact": c["losses"] == own["losses"], "param_diff": _max_diff(c["params"], own["params"]),
                "restored_diff": c["restored_diff"]}
        for where, c in continued.items()
    }

    # The command line, end to end, on the 2-D mesh.
    from flaxformer_mini.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["train", "--task", "copy", "--preset", "tiny", "--layers", "1", "--embed-size", "40", "--heads", "4",
                     "--vocab-size", "11", "--max-len", "5", "--batch-size", "8", "--steps", "2", "--eval-sequences", "8",
                     "--no-progress", "--no-plot", "--mesh", "data=2,model=4", "--sharding", "fsdp",
                     "--out", str(Path(tmp) / "cli")])
    out["cli"] = {"code": code, "stderr": err.getvalue()[-3000:]}
    print(json.dumps(out))


# ----------------------------------------------------------------------------- the 8-device tests


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = Path(__file__).resolve().parents[1]
    env = worker_env(NUM_DEVICES)
    tmp = tmp_path_factory.mktemp("tensor_parallel")
    proc = subprocess.run([sys.executable, __file__, "--worker", str(tmp)], env=env, cwd=root, capture_output=True,
                          text=True, timeout=WORKER_TIMEOUT_S)
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_worker_sees_eight_devices_and_training_moves_the_parameters(runs):
    assert runs["device_count"] == NUM_DEVICES
    assert runs["reference"]["params_moved"] > 100 * ATOL  # or "equal within 1e-5" says nothing


@pytest.mark.parametrize("mesh", list(LAYOUTS))
def test_tensor_parallel_layout_is_megatron_column_then_row(runs, mesh):
    r = runs[mesh]
    assert r["specs"] == EXPECTED_SPECS[mesh]
    data, model, _ = LAYOUTS[mesh]
    assert r["W_q_shard_shape"] == [40 // (data if mesh == "data=4,model=2" else 1), 40 // model]
    assert r["mu_like_param"], "an Adam moment is not split like its parameter"
    assert r["step_replicated"] and r["keys_replicated"]


@pytest.mark.parametrize("mesh", list(LAYOUTS))
def test_tensor_parallel_losses_equal_one_device(runs, mesh):
    # Not bit-exact: a row-parallel product is summed across devices by an all-reduce, in
    # another order than one device's dot product, so float32 round-off differs (~1e-7).
    r = runs[mesh]
    assert len(r["losses"]) == STEPS
    assert r["loss_diff"] <= ATOL, f"{mesh}: losses differ by {r['loss_diff']:.2e}"
    assert r["param_diff"] <= ATOL, f"{mesh}: parameters differ by {r['param_diff']:.2e}"


@pytest.mark.parametrize("where", ["replicated, 8 devices", "1 device"])
def test_a_tensor_parallel_checkpoint_continues_on_another_mesh_as_on_its_own(runs, where):
    c = runs["continued"]
    assert c["own mesh"]["restored_diff"] == c[where]["restored_diff"] == 0.0  # the checkpoint's values, read back
    assert c["own mesh"]["W_q_layout"] == "[None, 'model']"  # it really was restored tensor parallel
    assert c[where]["W_q_layout"] != c["own mesh"]["W_q_layout"]
    assert len(c[where]["losses"]) == STEPS
    assert c[where]["loss_diff"] <= ATOL, f"{where}: continued losses differ by {c[where]['loss_diff']:.2e}"
    assert c[where]["param_diff"] <= ATOL, f"{where}: parameters differ by {c[where]['param_diff']:.2e}"


def test_train_cli_runs_on_a_2d_mesh_and_says_so(runs):
    cli = runs["cli"]
    assert cli["code"] == 0, cli["stderr"]
    assert "on 8 cpu device(s), mesh data=2,model=4, fsdp sharding" in cli["stderr"]


# ----------------------------------------------------------------------------- in this process (1 device)


def test_every_transformer_parameter_names_its_axes():
    model = fm.Transformer.from_config(_config().replace(num_layers=2), rngs=nnx.Rngs(0))  # the preset's depth
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    assert len(flat) > 50
    for path, var in flat:
        names = logical_axes(var)
        assert names is not None, f"{'/'.join(map(str, path))} has no logical axis names"
        assert len(names) == var.get_value().ndim, (path, names)
        assert set(names) <= {VOCAB, EMBED, HEADS, KV, MLP, LENGTH}, (path, names)


@pytest.mark.parametrize("make", [
    lambda: fm.Transformer.from_config(fm.get_preset("tiny").replace(ffn_dim=14), rngs=nnx.Rngs(3)),
    lambda: fm.PerHeadSelfAttention(12, 3, rngs=nnx.Rngs(0)),
    lambda: fm.MultiHeadSelfAttention(rngs=nnx.Rngs(0)),
    lambda: fm.FeedForward(rngs=nnx.Rngs(0)),
    lambda: fm.LearnedPositionalEncoding(6, 9, rngs=nnx.Rngs(0)),
], ids=["Transformer", "PerHeadSelfAttention", "MultiHeadSelfAttention", "FeedForward", "LearnedPositionalEncoding"])
def test_axis_names_change_no_parameter_value(make, monkeypatch):
    # The same seed gives bit-identical parameters with and without the metadata: the names
    # ride along, the initializers and their RNG draws are untouched.
    annotated = nnx.to_flat_state(nnx.state(make(), nnx.Param))
    monkeypatch.setattr(primitives, "_partitioned", lambda axes: {})
    plain = nnx.to_flat_state(nnx.state(make(), nnx.Param))
    assert [p for p, _ in annotated] == [p for p, _ in plain]
    assert all(logical_axes(v) is None for _, v in plain)
    for (path, a), (_, b) in zip(annotated, plain):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(path))


MESH_2x4 = {"data": 2, "model": 4}


@pytest.mark.parametrize("names, shape, strategy, mesh, expected", [
    ((EMBED, HEADS), (40, 40), "replicated", MESH_2x4, P(None, "model")),
    ((HEADS, EMBED), (40, 40), "replicated", MESH_2x4, P("model")),
    ((EMBED, MLP), (40, 24), "fsdp", MESH_2x4, P("data", "model")),
    ((VOCAB, EMBED), (23, 40), "fsdp", MESH_2x4, P(None, "data")),
    ((LENGTH, EMBED), (17, 40), "replicated", MESH_2x4, P()),
    (("layers", EMBED, HEADS), (3, 40, 40), "fsdp", MESH_2x4, P(None, "data", "model")),  # a scan's axis: whole
    ((None, EMBED), (3, 40), "fsdp", MESH_2x4, P(None, "data")),
    ((EMBED, HEADS), (40, 40), "fsdp", {"data": 8}, P("data")),  # no 'model' axis: no tensor rules
    ((EMBED, HEADS), (40, 40), "fsdp", {"data": 1, "model": 1}, P()),  # size-1 axes split nothing
    (None, (40, 40), "fsdp", MESH_2x4, P()),  # unannotated
])
def test_logical_spec_follows_the_rules_table(names, shape, strategy, mesh, expected):
    assert logical_spec(names, shape, axis_rules(strategy, tuple(mesh)), mesh) == expected


def test_an_axis_the_mesh_does_not_divide_is_refused_naming_the_parameter():
    with pytest.raises(ValueError, match=r"encoder/x/kernel: its axis 1 \('heads', size 30\) is not divisible by the "
                                         r"mesh axis 'model' of size 4"):
        logical_spec((EMBED, HEADS), (40, 30), axis_rules("replicated", ("data", "model")), MESH_2x4, "encoder/x/kernel")


def test_the_rules_table_holds_the_three_layouts():
    assert LOGICAL_AXIS_RULES == {
        "replicated": (),
        "fsdp": (("embed", "data"),),
        "tensor": (("heads", "model"), ("mlp", "model")),
    }


def test_state_specs_give_adam_moments_their_parameters_spec():
    from flaxformer_mini.train.optimizer import TrainConfig
    from flaxformer_mini.train.trainer import Trainer

    state = Trainer(fm.Transformer.from_config(_config(), rngs=nnx.Rngs(0)), TrainConfig()).init_state()
    specs = state_specs(state, axis_rules("fsdp", ("data", "model")), MESH_2x4)
    params = nnx.to_flat_state(specs.params)
    mu = nnx.to_flat_state(specs.opt_state[1][0].mu)
    assert [(p, v.get_value()) for p, v in params] == [(p, v.get_value()) for p, v in mu]
    assert dict(params)[("decoder", "fc", "kernel")].get_value() == P("data")
    assert specs.step == P()


@pytest.mark.parametrize("text, expected", [
    ("data=2,model=4", {"data": 2, "model": 4}),
    ("model=2, data=4", {"data": 4, "model": 2}),
    ("data=8", {"data": 8, "model": 1}),
])
def test_parse_mesh(text, expected):
    assert parse_mesh(text) == expected


@pytest.mark.parametrize("size", ["2_0", "\u0662", "2.0"])
def test_a_mesh_size_is_plain_decimal_digits(size):
    # int() alone reads '2_0' as 20 and the Arabic-Indic digit two as 2.
    with pytest.raises(ValueError, match=rf"--mesh 'data={size}': the size of 'data' must be an integer, got '{size}'"):
        parse_mesh(f"data={size}")


def test_a_batch_the_data_axis_does_not_divide_names_the_axis_not_the_devices():
    from types import SimpleNamespace

    from flaxformer_mini.scale.sharding import _check_divisible

    with pytest.raises(ValueError, match=r"^--batch-size 3 is not divisible by the mesh's data axis \(2 data-parallel "
                       r"groups of 2 devices\); use --batch-size a multiple of 2$"):
        _check_divisible(3, 2, "--batch-size", SimpleNamespace(size=4))  # a data=2,model=2 mesh
    with pytest.raises(ValueError, match=r"^--batch-size 3 is not divisible by 2 devices; use"):
        _check_divisible(3, 2, "--batch-size", SimpleNamespace(size=2))  # data=2: its devices are its groups


# Bad --mesh options (in-process CLI on this one device): exit 2, a message naming the
# option, no traceback, nothing written. The size checks come before the device count, so a
# model=2 mesh is judged here even though this process has one device.
MESH_CASES = [
    ("unknown_axis", ["--mesh", "data=2,tensor=4"], r"--mesh 'data=2,tensor=4': unknown axis 'tensor'"),
    ("size_zero", ["--mesh", "data=0,model=1"], r"--mesh 'data=0,model=1': the size of 'data' must be >= 1, got 0"),
    ("not_a_size", ["--mesh", "data=two"], r"--mesh 'data=two': the size of 'data' must be an integer"),
    ("no_equals", ["--mesh", "data"], r"--mesh 'data': expected axis=size pairs"),
    ("axis_twice", ["--mesh", "data=1,data=1"], r"the axis 'data' is given twice"),
    ("more_devices_than_exist", ["--mesh", "data=2,model=1"], r"--mesh data=2,model=1 needs 2 devices but 1 are available"),
    ("heads_not_divisible", ["--mesh", "data=1,model=2"],  # tiny: 5 heads
     r"--mesh data=1,model=2 with tensor parallelism splits 'heads' over model=2, but --heads is 5, not divisible by 2"),
    ("ffn_not_divisible", ["--embed-size", "40", "--heads", "4", "--ffn-dim", "30", "--mesh", "data=1,model=4"],
     r"splits 'mlp' over model=4, but the feed-forward width F \(--ffn-dim\) is 30, not divisible by 4"),
    ("fsdp_width_not_divisible", ["--mesh", "data=4,model=1", "--sharding", "fsdp"],  # tiny: D = 30
     r"--mesh data=4,model=1 with --sharding fsdp splits 'embed' over data=4, but the width D \(--embed-size\) is 30"),
    ("mesh_and_devices", ["--mesh", "data=1,model=1", "--devices", "1"], r"argument --devices: not allowed with argument --mesh"),
]


@pytest.mark.parametrize("name, options, message", MESH_CASES, ids=[c[0] for c in MESH_CASES])
def test_bad_mesh_option_exits_2_naming_it_and_writes_nothing(name, options, message, tmp_path):
    import re

    from helpers import TINY_RUN, cli

    proc = cli("train", *TINY_RUN, "--steps", "2", "--out", str(tmp_path / "out"), *options)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert re.search(message, output), output
    assert "Traceback" not in output
    assert not (tmp_path / "out").exists()


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    from flaxformer_mini.collector import collecting_rarely

    with collecting_rarely():  # as a command runs: flaxformer_mini/collector.py
        _worker(sys.argv[2])
