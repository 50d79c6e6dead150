"""Scanned layers (``scan_layers=True``) and rematerialisation (``remat=True``).

Properties checked:
- a scanned model's parameters are the per-layer ones stacked along a leading axis L, under the
  list's path without the index, and ``parity`` reads and writes them under torch's per-layer
  keys: torch -> scanned Flax -> torch is bit-exact, and a missing or extra layer key is named;
- with the same weights, a scanned model computes the unscanned model's logits and gradients,
  and torch_ref's, within the parity policy's 1e-5; remat changes neither;
- training steps (dropout 0) give the unscanned model's losses; with dropout, each layer draws
  its own masks;
- cached greedy and beam decoding give the unscanned model's tokens;
- the train state (stacked parameters) saves and restores through orbax;
- ``flaxformer-mini train --scan-layers --remat`` records both in the run, ``evaluate`` and
  ``generate`` load it, and resuming with another layout is refused (exit 2).

Sizes: the tiny preset with 3 layers (odd and distinct from every other axis: D=30, H=5,
vocabularies 23/19), so a stacked axis in the wrong place changes a shape.
"""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.train import checkpoint
from flaxformer_mini.decode import search as decoding
from flaxformer_mini.data import EOS, SyntheticTask
from flaxformer_mini.runs.config import DataConfig, RunConfig, TrainOptions, train_config_for
from flaxformer_mini.train.loss import token_cross_entropy
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer
from parity import ConversionError, flax_to_torch, sample_batch, torch_key_shapes, torch_to_flax, transformer_pair
from parity.gradients import gradient_rows

from conftest import ATOL, assert_close
from helpers import TINY_RUN, assert_exported_state_dict_computes_the_runs_logits, cli

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

CONFIG = fm.get_preset("tiny").replace(num_layers=3, dropout=0.0)
L = CONFIG.num_layers


def scanned_model(config=CONFIG, seed=5, **kwargs):
    return fm.Transformer.from_config(config, scan_layers=True, rngs=nnx.Rngs(seed), **kwargs)


@pytest.fixture(scope="module")
def pair():
    """(torch_ref model, unscanned Flax twin, scanned Flax twin): the same weights, eval mode."""
    torch_model, flat = transformer_pair(CONFIG, seed=2)
    stacked = scanned_model()
    torch_to_flax(torch_model.state_dict(), stacked)
    stacked.eval()
    return torch_model, flat, stacked


def _logits(model, source, target):
    graphdef, state = nnx.split(model)
    return jax.jit(lambda s, a, b: nnx.merge(graphdef, s)(a, b))(state, source, target)


# --- layout and conversion --------------------------------------------------------------


def test_scanned_parameters_are_the_layers_stacked_under_the_list_path():
    params = nnx.to_flat_state(nnx.state(scanned_model(), nnx.Param))
    shapes = {"/".join(map(str, path)): tuple(v.get_value().shape) for path, v in params}
    D, F = CONFIG.embed_size, CONFIG.feed_forward_width
    assert shapes["encoder/transformer_layers/attention/W_q/kernel"] == (L, D, D)
    assert shapes["encoder/transformer_layers/fc/0/kernel"] == (L, D, F)
    assert shapes["decoder/decoder_layers/transformer_block/norm2/scale"] == (L, D)
    assert shapes["decoder/fc/kernel"] == (D, CONFIG.target_vocab_size)  # outside the stack: unchanged
    assert not any("/0/" in p and "fc/0" not in p for p in shapes), "a layer index left in a stacked path"


def test_default_model_keeps_its_per_layer_paths_and_initial_values():
    # The options default to off: the same paths (torch's indices) and the same RNG draws.
    a = fm.Transformer.from_config(CONFIG, rngs=nnx.Rngs(0))
    b = fm.Transformer.from_config(CONFIG, scan_layers=False, remat=False, rngs=nnx.Rngs(0))
    chex.assert_trees_all_equal(nnx.state(a, nnx.Param), nnx.state(b, nnx.Param))
    assert nnx.state(a, nnx.Param)["encoder"]["transformer_layers"][2]["norm1"]["scale"].get_value().shape == (30,)


def test_each_layer_of_a_scanned_model_starts_from_its_own_values():
    kernel = nnx.state(scanned_model(), nnx.Param)["encoder"]["transformer_layers"]["attention"]["W_q"]["kernel"]
    k = np.asarray(kernel.get_value())
    assert not np.array_equal(k[0], k[1]) and not np.array_equal(k[1], k[2])


def test_torch_to_scanned_flax_to_torch_is_bit_exact_with_torchs_own_keys():
    torch.manual_seed(4)
    torch_model = fm_torch(CONFIG)
    state_dict = torch_model.state_dict()
    model = torch_to_flax(state_dict, scanned_model())
    back = flax_to_torch(model)
    flat = flax_to_torch(torch_to_flax(state_dict, fm.Transformer.from_config(CONFIG, rngs=nnx.Rngs(0))))
    assert list(back) == list(flat)  # torch's keys, in the unscanned model's order (layer by layer)
    assert set(back) == set(state_dict)
    for key, tensor in state_dict.items():
        assert torch.equal(back[key], tensor), key
    fm_torch(CONFIG).load_state_dict(back, strict=True)
    # The plan of an abstract scanned model (nnx.eval_shape, no arrays) asks for torch's shapes.
    abstract = nnx.eval_shape(lambda: scanned_model())
    assert torch_key_shapes(abstract) == {k: tuple(v.shape) for k, v in state_dict.items()}


def fm_torch(config):
    import torch_ref

    return torch_ref.Transformer(**config.to_dict())


def test_missing_and_extra_layer_keys_are_named_and_nothing_is_loaded():
    state_dict = dict(fm_torch(CONFIG).state_dict())
    missing = "encoder.transformer_layers.1.norm1.weight"
    extra = f"decoder.decoder_layers.{L}.norm.bias"
    del state_dict[missing]
    state_dict[extra] = torch.zeros(CONFIG.embed_size)
    model = scanned_model()
    before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    with pytest.raises(ConversionError) as e:
        torch_to_flax(state_dict, model)
    assert e.value.missing == [missing] and e.value.unexpected == [extra]
    assert missing in str(e.value) and extra in str(e.value)
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, nnx.state(model, nnx.Param)), before)


def test_a_state_dict_of_another_depth_is_refused_naming_the_depths():
    state_dict = fm_torch(CONFIG.replace(num_layers=L + 1)).state_dict()
    with pytest.raises(ConversionError, match=f"encoder.transformer_layers has {L + 1} layers in the checkpoint, {L}"):
        torch_to_flax(state_dict, scanned_model())


def test_stacking_keeps_sharding_names_and_leaves_the_layer_axis_unsharded():
    # Parameters may carry logical axis names (nnx.with_partitioning); the stack prepends None
    # (the layer axis is not sharded) and the scan body sees the per-layer names again.
    from flaxformer_mini.model import scanned

    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"))
    with nnx.use_eager_sharding(False):  # names only: no mesh here to place the arrays on
        stacked = scanned.stack(lambda rngs: nnx.Linear(3, 5, kernel_init=init, rngs=rngs), L, nnx.Rngs(0))
    assert stacked.kernel.get_value().shape == (L, 3, 5)
    assert stacked.kernel.get_metadata()["out_sharding"] == (None, "embed", "mlp")
    seen = []

    def call(layer, x):
        seen.append(layer.kernel.get_metadata()["out_sharding"])
        return x @ layer.kernel[...][:, :3]

    out = scanned.apply(stacked, jnp.ones((2, 3)), call, scan=True, remat=False)
    assert out.shape == (2, 3) and seen == [("embed", "mlp")]


def test_a_scanned_models_parameters_shard_as_the_unscanned_ones_with_the_layer_axis_whole():
    # partitioning's rules table, on a data=2 x model=5 mesh (sizes only: no devices needed):
    # each stacked parameter's spec is its per-layer spec with None (not split) in front.
    from flaxformer_mini.scale.partitioning import axis_rules, state_specs

    mesh = {"data": 2, "model": 5}
    rules = axis_rules("fsdp", tuple(mesh))

    def specs(model):
        flat = nnx.to_flat_state(state_specs(nnx.state(model, nnx.Param), rules, mesh))
        return {tuple(map(str, path)): v.get_value() for path, v in flat}

    stacked = specs(scanned_model())
    per_layer = specs(fm.Transformer.from_config(CONFIG, rngs=nnx.Rngs(0)))
    assert stacked[("encoder", "transformer_layers", "attention", "W_q", "kernel")] == jax.sharding.PartitionSpec(
        None, "data", "model")
    for path, spec in per_layer.items():
        if path[1] in ("transformer_layers", "decoder_layers"):
            assert stacked[path[:2] + path[3:]] == jax.sharding.PartitionSpec(None, *spec), path
        else:
            assert stacked[path] == spec, path


# --- forward and gradients --------------------------------------------------------------


def test_scanned_logits_equal_unscanned_and_torch_within_the_parity_tolerance(pair):
    torch_model, flat, stacked = pair
    source, target = sample_batch(CONFIG, batch=4, seed=3)
    want = np.asarray(_logits(flat, source, target))
    got = np.asarray(_logits(stacked, source, target))
    # Not bit-exact: XLA fuses the scan's body differently from the unrolled layers
    # (measured: max |difference| ~5e-7 in the logits of this config, ~3e-8 in the gradients;
    # 0 and ~4e-9 on the small preset at 6 layers).
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    with torch.no_grad():
        assert_close(got, torch_model(torch.as_tensor(source), torch.as_tensor(target)))


@pytest.mark.parametrize("remat", [False, True], ids=["scan", "scan+remat"])
def test_scanned_gradients_equal_torch_refs_parameter_by_parameter(pair, remat):
    torch_model, _, stacked = pair
    model = stacked
    if remat:
        model = scanned_model(remat=True)
        torch_to_flax(torch_model.state_dict(), model)
        model.eval()
    source, target = sample_batch(CONFIG, batch=3, seed=4)
    rows = gradient_rows(torch_model, model, source, target, ATOL)
    assert len(rows) == 1 + len(torch_model.state_dict())  # the loss, then every parameter
    bad = [(r.name, r.max_abs) for r in rows if not r.ok]
    assert not bad, bad


def test_remat_gives_the_same_gradients_as_keeping_activations():
    # Unscanned (nnx.remat around each block), on one layer to keep the two compilations short.
    config = CONFIG.replace(num_layers=1)
    source, target = sample_batch(config, batch=3, seed=5)
    labels = jnp.asarray(np.roll(target, -1, axis=1))

    def grads(remat):
        model = fm.Transformer.from_config(config, remat=remat, rngs=nnx.Rngs(0))
        model.eval()
        loss = lambda m: token_cross_entropy(m(source, target), labels)[0]  # noqa: E731
        return nnx.jit(nnx.grad(loss))(model)

    # The recomputed forward is the same XLA code as the kept one: equal to rounding at most.
    chex.assert_trees_all_close(grads(True), grads(False), atol=1e-7, rtol=0)


# --- training -----------------------------------------------------------------------------


# The command-line test's run below (TINY_RUN at two layers, --dropout 0, --scan-layers --remat):
# its model, optimizer and batch shape, so that its scanned train step is the program the
# training test compiles (the suite's compilation cache), not a second one.
RUN_ARGS = [*TINY_RUN, "--layers", "2", "--dropout", "0", "--save-every", "4"]
RUN_CONFIG = fm.get_preset("tiny").replace(num_layers=2, max_len=6, source_vocab_size=11, target_vocab_size=11,
                                           dropout=0.0)


def test_train_steps_give_the_unscanned_models_losses():
    torch.manual_seed(6)
    state_dict = fm_torch(RUN_CONFIG).state_dict()
    train = train_config_for(TrainOptions(preset="tiny", warmup=5), RUN_CONFIG.embed_size)
    batch = SyntheticTask("copy", vocab_size=11, min_len=1, max_len=5).batch(0, 0, 8)
    losses = {}
    # Scanned with remat, as the run's: the scan and the train step are what is compared.
    for scan in (False, True):
        model = fm.Transformer.from_config(RUN_CONFIG, scan_layers=scan, remat=scan, rngs=nnx.Rngs(1))
        trainer = Trainer(torch_to_flax(state_dict, model), train)
        state, losses[scan] = trainer.init_state(), []
        for _ in range(3):  # one batch three times: the loss must fall
            state, metrics = trainer.step(state, batch)
            losses[scan].append(float(metrics["loss"]))
    np.testing.assert_allclose(losses[True], losses[False], rtol=0, atol=ATOL)
    assert losses[True][2] < losses[True][0]


def test_every_layer_of_a_scanned_model_draws_its_own_dropout_masks():
    # The train step reseeds dropout from (seed, step); a stacked stream gets one key per layer.
    from flaxformer_mini.train.step import reseed_dropout

    model = scanned_model(CONFIG.replace(dropout=0.3))
    reseed_dropout(model, jax.random.key(0))
    stacks = model.encoder.transformer_layers, model.decoder.decoder_layers.transformer_block
    for stream in (stack.dropout.rngs for stack in stacks):
        keys = np.asarray(jax.random.key_data(stream.key.get_value()))
        assert keys.shape[0] == L and len({k.tobytes() for k in keys}) == L
    # The embeddings' dropout, outside the stack, keeps one scalar key, as in the unscanned model.
    assert model.encoder.dropout.rngs.key.get_value().shape == ()


# --- decoding and checkpoints ---------------------------------------------------------------


def test_cached_greedy_and_beam_decoding_give_the_unscanned_models_tokens(pair):
    _, flat, stacked = pair
    source = sample_batch(CONFIG, batch=3, seed=6)[0]
    N = CONFIG.max_len
    np.testing.assert_array_equal(decoding.greedy_decode(stacked, source, N), decoding.greedy_decode(flat, source, N))
    tokens, scores = decoding.beam_search(stacked, source, N, beam_size=3)
    want_tokens, want_scores = decoding.beam_search(flat, source, N, beam_size=3)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=ATOL)
    assert not np.all(np.asarray(tokens) == EOS)


def test_a_scanned_train_state_saves_and_restores(tmp_path):
    trainer = Trainer(scanned_model(), TrainConfig(schedule="constant", learning_rate=1e-3))
    state = trainer.init_state().replace(step=jnp.asarray(1, jnp.int32))  # stacked parameters, Adam's moments
    manager = checkpoint.open_manager(tmp_path / "ckpt")
    checkpoint.save(manager, state)
    # Into shapes alone: every value compared below is then one read from the checkpoint.
    restored = checkpoint.restore(manager, trainer.state_template())
    assert int(restored.step) == 1
    chex.assert_trees_all_equal((restored.params, restored.opt_state), (state.params, state.opt_state))
    # ...and into an unscanned model's template it does not fit: named, not loaded.
    flat_trainer = Trainer(fm.Transformer.from_config(CONFIG, rngs=nnx.Rngs(0)), trainer.config)
    with pytest.raises(checkpoint.CheckpointMismatchError, match=r"holds scanned \(stacked\) layers and the model one"):
        checkpoint.restore(manager, flat_trainer.init_state())


# --- the command line -------------------------------------------------------------------------


def test_train_scan_layers_remat_is_recorded_and_evaluate_generate_and_export_load_it(tmp_path):
    out = tmp_path / "run"
    # Two layers (TINY_RUN has one): a stack for --scan-layers to scan and `parity convert` to unstack.
    args = ["train", *RUN_ARGS, "--out", str(out)]
    proc = cli(*args, "--steps", "4", "--scan-layers", "--remat")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["scan_layers"] is True and config["remat"] is True
    ev = cli("evaluate", "--checkpoint", str(out), "--json")
    assert ev.returncode == 0, ev.stderr
    assert np.isfinite(json.loads(ev.stdout)["loss"])
    gen = cli("generate", "--checkpoint", str(out), "3 4 5")
    assert gen.returncode == 0 and gen.stdout.strip(), gen.stderr
    # `parity convert` unstacks the layers into torch_ref's per-layer keys.
    assert assert_exported_state_dict_computes_the_runs_logits(out, tmp_path) == 4
    # Resuming it with the other layout would restore stacked parameters into per-layer ones.
    refused = cli(*args, "--steps", "8")
    assert refused.returncode == 2
    assert "scan_layers (--scan-layers): True in the run, False now" in refused.stderr and "remat (--remat): True in the run" in refused.stderr


def test_a_run_config_written_before_the_options_loads_with_both_off():
    config = RunConfig(model=CONFIG, train=TrainConfig(), data=DataConfig(kind="synthetic", task="copy"),
                       scan_layers=True, remat=True)
    old = {k: v for k, v in config.to_dict().items() if k not in ("scan_layers", "remat")}
    loaded = RunConfig.from_dict(json.loads(json.dumps(old)))
    assert (loaded.scan_layers, loaded.remat) == (False, False)
    with pytest.raises(ValueError, match="scan_layers must be true or false"):
        RunConfig.from_dict({**config.to_dict(), "scan_layers": "yes"})


def test_a_run_written_before_the_options_resumes_with_its_own_layout_and_says_so(tmp_path):
    import dataclasses

    from flaxformer_mini.runs.run import Run
    from flaxformer_mini.runs.config import model_config_for

    data = DataConfig(kind="synthetic", task="copy", vocab_size=11, max_len=5)
    config = RunConfig(model=model_config_for("tiny", 11, 11, data.model_max_len), train=TrainConfig(), data=data)
    out = tmp_path / "run"
    Run.create(out, config).close()
    stored = json.loads((out / "config.json").read_text())
    del stored["scan_layers"], stored["remat"], stored["checksums"]["config"]  # as a run written before them
    (out / "config.json").write_text(json.dumps(stored))
    notes = []
    run = Run.create(out, dataclasses.replace(config, scan_layers=True), echo=notes.append)
    run.close()
    # Its checkpoints hold one module per layer: it resumes so, and says --scan-layers is not used.
    assert run.config.scan_layers is False
    assert any("written before --scan-layers existed and resumes without it" in n for n in notes), notes
