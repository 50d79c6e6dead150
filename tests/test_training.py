"""Training on the Flax side: loss normalisation, reproducible steps, exact resume, NaN stop,
bfloat16, run directories and their bad input."""

import dataclasses
import json
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.train import checkpoint
from flaxformer_mini.data import PAD, SyntheticTask
from flaxformer_mini.train.errors import NonFiniteLossError
from flaxformer_mini.runs.fit import fit as fit_run
from flaxformer_mini.runs.run import Run
from flaxformer_mini.runs.config import DataConfig, RunConfig, RunConfigError
from flaxformer_mini.runs.directory import RunDir
from flaxformer_mini.train.loss import token_cross_entropy
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer


def test_loss_is_averaged_over_non_padding_tokens_only():
    # Worked by hand: uniform logits over V=4 give -log(1/4) per token; padded positions
    # (label PAD) get absurd logits that must not count.
    logits = np.zeros((1, 3, 4), np.float32)
    logits[0, 2] = [1e4, -1e4, 0, 0]
    labels = np.array([[1, 2, PAD]])
    loss, (total, count) = token_cross_entropy(jnp.asarray(logits), jnp.asarray(labels))
    assert count == 2
    np.testing.assert_allclose(loss, math.log(4), rtol=1e-6)
    np.testing.assert_allclose(total, 2 * math.log(4), rtol=1e-6)


def test_label_smoothing_matches_the_formula():
    # (1 - a) * CE + a * mean_v(-log p_v); with uniform logits both terms are log V.
    logits = jnp.zeros((1, 1, 5))
    loss, _ = token_cross_entropy(logits, jnp.array([[3]]), label_smoothing=0.1)
    np.testing.assert_allclose(loss, math.log(5), rtol=1e-6)
    p = np.array([0.1, 0.7, 0.1, 0.05, 0.05])  # label 1 (0 is PAD and never counts)
    expected = 0.9 * -math.log(0.7) + 0.1 * np.mean(-np.log(p))
    loss, _ = token_cross_entropy(jnp.log(jnp.asarray(p))[None, None], jnp.array([[1]]), label_smoothing=0.1)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_rsqrt_schedule_warms_up_then_decays_like_the_paper():
    config = TrainConfig(warmup_steps=10)
    # An abstract model (shapes, no random init): the schedule depends on the width alone.
    trainer = Trainer(nnx.eval_shape(lambda: fm.Transformer.from_config(fm.get_preset("tiny"), rngs=nnx.Rngs(0))), config)
    D = fm.get_preset("tiny").embed_size
    lrs = [float(trainer.lr_schedule(s)) for s in range(30)]
    expected = [D**-0.5 * min((s + 1) ** -0.5, (s + 1) * 10**-1.5) for s in range(30)]
    np.testing.assert_allclose(lrs, expected, rtol=1e-6)
    assert int(np.argmax(lrs)) == 9  # the peak is at step n = warmup


def small_task():
    return SyntheticTask("reverse", vocab_size=11, min_len=1, max_len=5)


def tiny_trainer(dropout=0.1, dtype=None, seed=0, train_config=None):
    task = small_task()
    config = fm.ModelConfig(0, 11, 11, task.model_max_len, 30, 5, 1, dropout)
    model = fm.Transformer.from_config(config, dtype=dtype, rngs=nnx.Rngs(seed))
    return task, Trainer(model, train_config or TrainConfig(warmup_steps=5, seed=seed))


def test_a_step_is_reproducible_from_seed_and_step_alone():
    # Dropout keys are fold_in(seed, step): the same state and batch give the same update,
    # and a different step number gives a different dropout mask. The model, optimizer and
    # batch of run_config's runs below: one compiled step for both.
    task, trainer = tiny_trainer()
    batch = task.batch(0, 0, 8)
    s0 = trainer.init_state()
    a, ma = trainer.train_step(jax.tree.map(jnp.copy, s0), batch)
    b, mb = trainer.train_step(jax.tree.map(jnp.copy, s0), batch)
    assert float(ma["loss"]) == float(mb["loss"])
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
    # Step 7 committed to the state's device as every other array of it: an uncommitted one
    # would key another compilation of the same step (Trainer.init_state's arrays are committed).
    shifted = s0.replace(step=jax.device_put(jnp.asarray(7, jnp.int32), s0.step.sharding))
    _, mc = trainer.train_step(jax.tree.map(jnp.copy, shifted), batch)
    assert float(mc["loss"]) != float(ma["loss"])


def test_training_reduces_the_loss():
    task, trainer = tiny_trainer(dropout=0.0, train_config=TrainConfig(schedule="constant", learning_rate=3e-3))
    state = trainer.init_state()
    losses = []
    for step in range(60):
        state, m = trainer.step(state, task.batch(0, step, 16))
        losses.append(float(m["loss"]))
    assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:10])


def test_bfloat16_loss_tracks_float32():
    # Same initial float32 parameters, same batches; only the compute dtype differs. bf16
    # keeps 8 mantissa bits (relative rounding 2^-8 = 0.4%), and the difference compounds as
    # the two runs' parameters drift apart step by step. Per step, the first 5 losses are
    # bounded at 1% (measured: within 0.4% on an Intel Xeon fam. 6 model 167 and an AMD EPYC
    # fam. 25). Later single steps are not: once the parameters have drifted, one batch's loss
    # swings by how the CPU's bf16 kernels round (worst of 30 steps: 6.8% on the Xeon, 13.6% at
    # step 22 on the EPYC, same code), so the property is bounded on 10-step means, at 5%
    # (measured on the EPYC: 0.2%, 1.5%, 2.8%; float32's own loss falls 21% over the 30 steps).
    task, f32 = tiny_trainer(dropout=0.0)
    _, bf16 = tiny_trainer(dropout=0.0, dtype=jnp.bfloat16)
    s32, s16 = f32.init_state(), bf16.init_state()
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(s32.params), jax.tree.leaves(s16.params)))
    assert {x.dtype for x in jax.tree.leaves(s16.params)} == {jnp.dtype("float32")}  # params stay f32
    losses = {"float32": [], "bfloat16": []}
    for step in range(30):
        batch = task.batch(0, step, 16)
        s32, m32 = f32.step(s32, batch)
        s16, m16 = bf16.step(s16, batch)
        losses["float32"].append(float(m32["loss"]))
        losses["bfloat16"].append(float(m16["loss"]))
    l32, l16 = np.array(losses["float32"]), np.array(losses["bfloat16"])
    np.testing.assert_allclose(l16[:5], l32[:5], rtol=0.01)
    np.testing.assert_allclose(l16.reshape(3, 10).mean(1), l32.reshape(3, 10).mean(1), rtol=0.05)
    # And the compute really is bf16: the logits come out in bf16. Traced for their type alone
    # (nnx.eval_shape): eager, each operation of the forward would compile a program of its own.
    model = bf16.model(s16)
    logits = nnx.eval_shape(lambda m, s, t: m(s, t), model, jnp.asarray(batch.source), jnp.asarray(batch.target_in))
    assert logits.dtype == jnp.bfloat16
    # The run's start line says both, not "bfloat16" alone, which would read as bfloat16 parameters.
    from flaxformer_mini.runs.fit import describe_model

    n = sum(x.size for x in jax.tree.leaves(s16.params))
    assert describe_model(s16.params, "bfloat16").startswith(f"model: {n:,} float32 parameters, bfloat16 compute, on 1 ")


def run_config(dropout=0.1, embed=30, lr_factor=1.0, task="copy"):
    data = DataConfig(kind="synthetic", task=task, vocab_size=11, min_len=1, max_len=5, eval_sequences=32)
    model = fm.ModelConfig(0, 11, 11, 6, embed, 5, 1, dropout)
    return RunConfig(model=model, train=TrainConfig(warmup_steps=5, lr_factor=lr_factor), data=data, batch_size=8)


def fit(config, out, steps, echo=print, plot=False, **kw):
    """Train ``config`` into ``out`` as the CLI does: create (or resume) the run, then fit (drawing
    loss.png only where a test looks at it: tests/helpers.py's PLOTTED_TINY_RUN says why)."""
    return fit_run(Run.create(out, config, echo=echo), steps, echo=echo, plot=plot, **kw)


def final_params(out):
    state = Run.open(out).latest_state()
    return int(state.step), state


def test_stopping_and_resuming_gives_the_uninterrupted_parameters_bit_for_bit(tmp_path):
    config = run_config()
    kw = dict(log_every=5, eval_every=100, save_every=7, progress=False, echo=lambda m: None)
    fit(config, tmp_path / "straight", 24, **kw)
    fit(config, tmp_path / "resumed", 10, **kw)  # stops at step 10 (saved), like an interrupted run
    fit(config, tmp_path / "resumed", 24, **kw)  # the same run, continued
    (s1, a), (s2, b) = final_params(tmp_path / "straight"), final_params(tmp_path / "resumed")
    assert s1 == s2 == 24
    chex.assert_trees_all_equal((a.params, a.opt_state), (b.params, b.opt_state))  # bit for bit
    # The resumed log has each logged step once, as the uninterrupted one does.
    steps = lambda out: [r["step"] for r in RunDir(out).read_metrics() if "loss" in r]
    assert steps(tmp_path / "resumed") == steps(tmp_path / "straight") == [5, 10, 15, 20, 24]  # the last step too


STEPS_OF_A_RUN = ("jit(train_step)", "jit(eval_step)", "jit(_token_by_token)")  # the decoding loop of fit's evaluation


def test_a_restored_state_is_laid_out_as_a_fresh_one_so_a_resume_compiles_no_step_again(tmp_path):
    # jit keys its compiled programs on each argument's sharding and on whether it is committed
    # to a device; orbax's restore commits arrays and jnp does not, so a restored state laid out
    # unlike a fresh one would compile every step twice in one process (a resume, evaluate after
    # train). A dropout rate no other test trains with: programs another test compiled in this process would hide a
    # second compile.
    config = run_config(dropout=0.25)
    kw = dict(log_every=5, eval_every=100, save_every=3, progress=False, echo=lambda m: None)
    compiled = []

    def listener(event, duration, fun_name=None, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(fun_name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        fit(config, tmp_path / "run", 3, **kw)
        assert set(STEPS_OF_A_RUN) <= set(compiled), compiled  # the listener sees compilations
        compiled.clear()
        fit(config, tmp_path / "run", 6, **kw)  # the same run, resumed at step 3
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert not set(STEPS_OF_A_RUN) & set(compiled), compiled
    layout = lambda state: jax.tree.map(lambda x: (x.sharding, x.committed), state)  # noqa: E731
    fresh = Run.create(tmp_path / "fresh", config, echo=lambda m: None).initial_state()
    assert layout(Run.open(tmp_path / "run").latest_state()) == layout(fresh)  # dropout streams included


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    # A learning rate of ~1e20 blows the weights up within a few steps.
    config = run_config(lr_factor=1e22, dropout=0.0)
    with pytest.raises(NonFiniteLossError, match=r"at step \d+.*last good checkpoint \(step \d+\)") as e:
        fit(config, tmp_path / "run", 50, log_every=1, eval_every=100, save_every=1, progress=False, echo=lambda m: None)
    assert str(e.value).endswith("Try a lower --lr.")  # a float32 run: no --dtype float32 to suggest
    bad_step = int(str(e.value).split("at step ")[1].split(";")[0])
    kept, state = final_params(tmp_path / "run")
    assert kept == bad_step - 1  # every finite step was saved; the NaN one was not
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state.params))


def test_out_directory_of_another_run_is_refused_and_left_untouched(tmp_path):
    out = tmp_path / "run"
    fit(run_config(), out, 4, save_every=2, eval_every=100, progress=False, echo=lambda m: None)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    with pytest.raises(RunConfigError, match=r"model\.embed_size \(--embed-size, or --preset\'s\): 30 in the run, 35 now"):
        fit(run_config(embed=35), out, 4, progress=False, echo=lambda m: None)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_checkpoint_from_a_different_model_size_is_refused_by_name(tmp_path):
    # A checkpoint of the wider model's initial state: its shapes are what is refused (no step needed).
    wide = Run.create(tmp_path / "wide", run_config(embed=35), echo=lambda m: None)
    checkpoint.save(checkpoint.open_manager((tmp_path / "wide" / "checkpoints").absolute()), wide.initial_state())
    wide.close()
    trainer = Run(RunDir(tmp_path / "narrow"), run_config(embed=30)).trainer
    manager = checkpoint.open_manager((tmp_path / "wide" / "checkpoints").absolute())
    with pytest.raises(checkpoint.CheckpointMismatchError, match=r"different model: .*W_k/kernel: checkpoint \(35, 35\), model \(30, 30\).*and \d+ more"):
        checkpoint.restore(manager, trainer.state_template())


def test_a_checkpoint_restored_into_shapes_alone_trains_on_bit_for_bit_as_one_restored_into_arrays(tmp_path):
    # Run reads checkpoints into Trainer.state_template() (a Trainer of an nnx.eval_shape model:
    # no random init). The dropout streams, never saved, are then made up (fresh_streams): a key
    # per stream, one per layer in a scanned model's stacked streams (the model here; the
    # per-layer one's resume is test_stopping_and_resuming_..., dropout on too). They differ
    # from the init's, and must carry nothing: with dropout on, the next step from either
    # restore is the same, bit for bit. (Both variants here took 31 s of a 2-core Zen 3.)
    task = small_task()
    config = fm.ModelConfig(0, 11, 11, task.model_max_len, 30, 5, 2, 0.3)
    build = lambda: fm.Transformer.from_config(config, scan_layers=True, rngs=nnx.Rngs(0))  # noqa: E731
    trainer = Trainer(build(), TrainConfig(warmup_steps=5))
    from_shapes_only = Trainer(nnx.eval_shape(build), trainer.config)
    with pytest.raises(ValueError, match=r"built from an abstract model \(nnx.eval_shape\).*no initial arrays"):
        from_shapes_only.init_state()
    state = trainer.init_state()
    for step in range(2):
        state, _ = trainer.step(state, task.batch(0, step, 8))
    manager = checkpoint.open_manager(tmp_path / "ckpt")
    checkpoint.save(manager, state)

    template = from_shapes_only.state_template()
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(template))
    a, b = checkpoint.restore(manager, template), checkpoint.restore(manager, trainer.init_state())
    chex.assert_trees_all_equal((a.step, a.params, a.opt_state), (b.step, b.params, b.opt_state))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), a.other) == jax.tree.map(lambda x: (x.shape, x.dtype), b.other)
    keys = lambda s: [np.asarray(jax.random.key_data(k)) for k in jax.tree.leaves(s.other)  # noqa: E731
                      if jax.dtypes.issubdtype(k.dtype, jax.dtypes.prng_key)]
    assert any(x.tobytes() != y.tobytes() for x, y in zip(keys(a), keys(b)))  # made-up streams: not the init's
    assert {x.shape[0] for x in keys(a) if x.ndim == 2} == {config.num_layers}  # one key per stacked layer
    rows = [row.tobytes() for x in keys(a) for row in x.reshape(-1, x.shape[-1])]
    assert len(set(rows)) == len(rows) > 4  # every stream (every stacked layer) a key of its own, as the init's
    (a, ma), (b, mb) = trainer.step(a, task.batch(0, 2, 8)), trainer.step(b, task.batch(0, 2, 8))
    assert float(ma["loss"]) == float(mb["loss"])
    chex.assert_trees_all_equal((a.params, a.opt_state), (b.params, b.opt_state))


def test_fresh_streams_refuses_a_variable_that_is_no_dropout_stream_by_name():
    # Zeros are right for a stream's counter only: a buffer or statistic left as shapes
    # (a model with state that no checkpoint holds) is named, not zero-filled.
    from flaxformer_mini.train.state import fresh_streams

    class Normalised(nnx.Module):
        def __init__(self, rngs):
            self.mean = nnx.BatchStat(jnp.zeros(3))
            self.dropout = nnx.Dropout(0.1, rngs=rngs)

    abstract = nnx.state(nnx.eval_shape(lambda: Normalised(nnx.Rngs(0))), nnx.Not(nnx.Param))
    with pytest.raises(ValueError, match=r"^mean: a BatchStat with shapes only: neither a dropout stream"):
        fresh_streams(abstract, 0)
    streams = fresh_streams(nnx.state(nnx.eval_shape(lambda: Normalised(nnx.Rngs(0))), nnx.RngState), 0)
    assert int(streams["dropout"]["rngs"]["count"].get_value()) == 0


def test_reading_or_resuming_a_run_makes_no_random_init(tmp_path, monkeypatch):
    # evaluate, generate and a resumed train read a checkpoint into the state's shapes: the
    # random init (eager, op by op: seconds) would be overwritten, so it is never made.
    out, quiet = tmp_path / "run", dict(eval_every=100, progress=False, echo=lambda m: None)
    fit(run_config(), out, 2, save_every=2, **quiet)
    built = Run._new_model

    def traced_only(self):  # the Trainer traces the model's construction (nnx.eval_shape) for its shapes
        model = built(self)
        if not all(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(nnx.state(model, nnx.Param))):
            pytest.fail("a random init was made to read a checkpoint")
        return model

    monkeypatch.setattr(Run, "_new_model", traced_only)
    run = Run.open(out)
    state = run.latest_state()
    assert int(state.step) == 2
    assert 0 < run.trainer.evaluate(state, run.eval_batches())["loss"] < math.log(11)  # 2 steps: below uniform
    fit(run_config(), out, 3, save_every=1, **quiet)
    assert int(Run.open(out).latest_state().step) == 3


def test_config_json_respelt_loads_and_a_changed_value_is_refused_by_its_checksum(tmp_path):
    out = tmp_path / "run"
    Run.create(out, run_config(), echo=lambda m: None).close()
    stored = json.loads((out / "config.json").read_text())
    assert stored["model"]["dropout"] == 0.1 and stored["train"]["weight_decay"] == 0.0

    def as_jq_writes(value):  # `jq .` spells 0.0 as 0; keys in another order, other spaces
        if isinstance(value, dict):
            return {k: as_jq_writes(v) for k, v in reversed(value.items())}
        return int(value) if isinstance(value, float) and value.is_integer() else value

    (out / "config.json").write_text(json.dumps(as_jq_writes(stored), indent=4))
    assert RunDir(out).load_config() == run_config()
    for section, key, value in (("model", "heads", 1), ("train", "weight_decay", 1e-4), ("data", "task", "reverse")):
        edited = json.loads(json.dumps(stored))
        edited[section][key] = value
        (out / "config.json").write_text(json.dumps(edited))
        with pytest.raises(RunConfigError, match=r"config\.json: edited since the run wrote it"):
            RunDir(out).load_config()


def test_run_config_with_an_unknown_dtype_is_refused_by_name(tmp_path):
    out = tmp_path / "run"
    fit(run_config(), out, 2, save_every=2, eval_every=100, progress=False, echo=lambda m: None)
    data = json.loads((out / "config.json").read_text())
    data["dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(data))
    with pytest.raises(RunConfigError, match=r"config.json: malformed run config: unknown dtype 'float16'"):
        RunDir(out).load_config()


def test_non_empty_directory_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunConfigError, match="is not a flaxformer-mini run"):
        fit(run_config(), tmp_path, 2, progress=False, echo=lambda m: None)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("train", [
    TrainConfig(lr_factor=2.0, warmup_steps=8),  # a CLI rsqrt run: learning_rate at its default
    TrainConfig(schedule="constant", learning_rate=3e-4),  # lr_factor and warmup_steps at theirs
    TrainConfig(lr_factor=2.0, learning_rate=5e-4),  # a library user's unused value: kept
    TrainConfig(schedule="cosine", learning_rate=2e-3, warmup_steps=8, decay_steps=100),  # lr_factor at its default
], ids=["rsqrt", "constant", "rsqrt-with-learning-rate-set", "cosine"])
def test_config_dict_leaves_out_the_other_schedules_defaults_and_round_trips(train):
    config = RunConfig(model=run_config().model, train=train, data=run_config().data)
    d = json.loads(json.dumps(config.to_dict()))
    assert RunConfig.from_dict(d) == config
    unused = {"rsqrt": {"learning_rate", "decay_steps"}, "constant": {"lr_factor", "warmup_steps", "decay_steps"},
              "cosine": {"lr_factor"}}[train.schedule]
    shown = {k for k in unused if getattr(train, k) != TrainConfig.__dataclass_fields__[k].default}
    assert set(d["train"]) & unused == shown
    if train.schedule == "rsqrt":  # the peak: factor * (width * warmup)^-0.5, width 30
        assert d["train"]["peak_learning_rate"] == pytest.approx(train.lr_factor / math.sqrt(30 * train.warmup_steps), rel=1e-11)
    else:
        assert "peak_learning_rate" not in d["train"]


@pytest.mark.parametrize("data", [
    DataConfig(kind="synthetic", task="copy", vocab_size=11, max_len=5),  # a CLI synthetic run
    DataConfig(kind="tsv", max_len=7, train_path="/d/train.tsv", eval_pairs=64, holdout=64, tokenizer="bpe",
               tokenizer_vocab_size=40),  # a CLI text run: the synthetic fields at their defaults
    DataConfig(kind="tsv", max_len=7, train_path="/d/train.tsv", vocab_size=30),  # a library user's unused value: kept
], ids=["synthetic", "text", "text-with-vocab-size-set"])
def test_config_dict_leaves_out_the_other_kinds_defaults_and_round_trips(data):
    config = RunConfig(model=run_config().model, train=run_config().train, data=data)
    d = json.loads(json.dumps(config.to_dict()))
    assert RunConfig.from_dict(d) == config
    synthetic = {"task", "vocab_size", "min_len", "eval_sequences"}
    text = {f.name for f in dataclasses.fields(DataConfig)} - synthetic - {"kind", "max_len", "eval_decode_lines"}
    unused = text if data.kind == "synthetic" else synthetic
    shown = {k for k in unused if getattr(data, k) != DataConfig.__dataclass_fields__[k].default}
    assert set(d["data"]) == {f.name for f in dataclasses.fields(DataConfig)} - unused | shown
    assert d["data"]["max_len"] == data.max_len and d["data"]["eval_decode_lines"] == 256


def test_run_writes_config_metrics_checkpoints_and_plot(tmp_path):
    out = tmp_path / "run"
    # 12 steps, logged every 5: the last step is logged too, though 12 is no multiple of 5.
    result = fit(run_config(), out, 12, log_every=5, eval_every=10, save_every=5, progress=False, echo=lambda m: None,
                 plot=True)
    # The step evaluated, teacher-forced loss and accuracy, exact match, and the corpus metrics
    # of the decoded text.
    assert set(result) == {"step", "loss", "token_accuracy", "exact_match", "bleu", "chrf", "wer", "cer"}
    assert result["step"] == 12
    assert RunDir(out).load_config() == run_config()
    records = RunDir(out).read_metrics()
    assert {"step", "loss", "learning_rate", "tokens_per_s", "grad_norm"} <= set(records[0])
    assert [r["step"] for r in records if "loss" in r] == [5, 10, 12]
    assert [r["step"] for r in records if "eval_exact_match" in r] == [10, 12]
    assert sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == [5, 10, 12]
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.loads((out / "config.json").read_text())
