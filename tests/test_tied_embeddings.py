"""Tied embeddings (``tie_embeddings``, ``train --tie-embeddings``): one table for the target
embedding and the output projection ("decoder"), and for the source embedding too ("all"), in
both twins, with the seed's untied model unchanged by default.

What is proved here: the untied default keeps the seed's keys, paths and values; a tied model
holds its table once (one torch Parameter under every key, one Flax variable) and every other
initial value of the untied model of the same seed; the tied twins compute the same logits,
gradients and training steps; conversion goes both ways bit for bit and loads strictly; and a
tied run trains, resumes bit for bit from what ``kill -9`` leaves, evaluates, generates,
exports and starts another run from its export. Bad values are refused by name here and in
tests/test_bad_input_matrix.py.
"""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
import parity
import seed_classes
import torch_ref
from flaxformer_mini.data import SyntheticTask
from flaxformer_mini.runs.config import DataConfig, RunConfig, TrainOptions
from flaxformer_mini.runs.run import Run
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer
from parity import ConversionError
from parity.check import check_twins
from parity.decode_check import check_decoding
from parity.twins import sample_batch, transformer_pair, twins_from_state_dict
from torch_ref.training import make_optimizer, train_step

from conftest import ATOL
from helpers import assert_same_training_state, cli, killed_before_its_last_checkpoint, latest_state

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

# One layer a side: a tie joins the embedding tables, whatever the depth, and a second layer
# doubles every compilation here (tests/helpers.py's TINY_RUN).
UNTIED = fm.get_preset("tiny").replace(dropout=0.0, num_layers=1)
V = UNTIED.source_vocab_size  # "all" shares one table between the sides: one vocabulary size
CONFIGS = {
    "decoder": UNTIED.replace(tie_embeddings="decoder"),
    "all": UNTIED.replace(target_vocab_size=V, tie_embeddings="all"),
}
TABLE = "decoder.embedding_layer.weight"  # the table every tie keeps
COPIES = {"decoder": ("decoder.fc.weight",), "all": ("encoder.embedding_layer.weight", "decoder.fc.weight")}
TIES = sorted(CONFIGS)


def untied_of(config):
    return config.replace(tie_embeddings=None)


def torch_model(config, seed=0):
    torch.manual_seed(seed)
    return torch_ref.Transformer(**config.to_dict()).eval()


def flax_state(model):
    return {"/".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def flax_path(torch_key):
    return torch_key.replace(".", "/").replace("/weight", "/embedding" if "embedding" in torch_key else "/kernel")


# ----------------------------------------------------------------------------- the models


def test_the_untied_default_is_the_seeds_model_in_both_twins():
    # The seed's own classes give the keys; the option's default builds the same model, bit for bit.
    seed_arguments = {k: v for k, v in UNTIED.to_dict().items() if k != "ffn_dim"}  # ffn_dim None: the seed's F = D
    seed_keys = list(seed_classes.Transformer(**seed_arguments).state_dict())
    assert "tie_embeddings" not in UNTIED.to_dict()  # config.json, metadata, constructor arguments: as the seed's
    default = torch_model(UNTIED)
    torch.manual_seed(0)
    explicit = torch_ref.Transformer(**UNTIED.to_dict(), tie_embeddings=None)
    assert list(default.state_dict()) == list(explicit.state_dict()) == seed_keys
    for key, value in default.state_dict().items():
        assert torch.equal(value, explicit.state_dict()[key]), key
    assert len(list(default.parameters())) == len(seed_keys)  # every key its own Parameter
    a = flax_state(fm.Transformer.from_config(UNTIED, rngs=nnx.Rngs(0)))
    b = flax_state(fm.Transformer(**UNTIED.to_dict(), tie_embeddings=None, rngs=nnx.Rngs(0)))
    assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert {"decoder/fc/kernel", "encoder/embedding_layer/embedding"} <= set(a)


@pytest.mark.parametrize("tie", TIES)
def test_a_tied_model_holds_one_table_and_the_untied_models_other_initial_values(tie):
    config = CONFIGS[tie]
    untied, tied = torch_model(untied_of(config)), torch_model(config)
    assert list(tied.state_dict()) == list(untied.state_dict())  # the seed's keys, every one
    params = dict(tied.named_parameters(remove_duplicate=False))
    assert all(params[copy] is params[TABLE] for copy in COPIES[tie])  # one Parameter
    assert len(list(tied.parameters())) == len(list(untied.parameters())) - len(COPIES[tie])
    for key, value in tied.state_dict().items():  # the tie replaces the copies; nothing else moved
        assert torch.equal(value, untied.state_dict()[TABLE if key in COPIES[tie] else key]), key

    untied_flax = flax_state(fm.Transformer.from_config(untied_of(config), rngs=nnx.Rngs(0)))
    tied_flax = flax_state(fm.Transformer.from_config(config, rngs=nnx.Rngs(0)))
    assert set(tied_flax) == set(untied_flax) - {flax_path(copy) for copy in COPIES[tie]}
    assert "decoder/fc/bias" in tied_flax  # the output bias stays its own
    for path, value in tied_flax.items():
        assert np.array_equal(value, untied_flax[path]), path


@pytest.mark.parametrize("tie", TIES)
def test_a_tie_survives_split_and_merge_as_one_variable(tie):
    model = fm.Transformer.from_config(CONFIGS[tie], rngs=nnx.Rngs(0))
    merged = nnx.merge(*nnx.split(model))
    assert merged.decoder.fc.embed is merged.decoder.embedding_layer
    if tie == "all":
        assert merged.encoder.embedding_layer.embed is merged.decoder.embedding_layer


@pytest.mark.parametrize("twin", ["torch", "flax"])
@pytest.mark.parametrize("changes, message", [
    (dict(tie_embeddings="encoder"), "tie_embeddings must be None or one of 'decoder', 'all', got 'encoder'"),
    (dict(tie_embeddings="all"), "tie_embeddings='all' shares one table between the source and target vocabularies, "
                                 "which must then have one size, got 23 and 19"),
], ids=["unknown", "all-with-two-sizes"])
def test_a_tie_the_model_cannot_make_is_refused_by_name(twin, changes, message):
    arguments = {**UNTIED.to_dict(), **changes}
    with pytest.raises(ValueError, match=re.escape(message)):
        torch_ref.Transformer(**arguments) if twin == "torch" else fm.Transformer(**arguments, rngs=nnx.Rngs(0))


# ----------------------------------------------------------------------------- the twins agree


@pytest.mark.parametrize("tie", TIES)
def test_tied_twins_agree_forward_and_gradients(tie):
    config = CONFIGS[tie]
    torch_twin, flax_twin = transformer_pair(config)
    # torch's N(0, 1) table as the output projection gives logits of about sqrt(D) (up to ~20
    # at D = 30), where float32's spacing is 1.9e-6: the logits then differ by rounding of a few
    # of those (measured, CPU: 5.7e-6 to 9.5e-6 over seeds 0-5). The float64 reference judges
    # any row past 1e-5 against the torch twin run in float64 (parity.policy.FLOAT64_FACTOR).
    report = check_twins(torch_twin, flax_twin, config, grads=True, float64_reference=True)
    assert report.ok, report.format_table()
    assert any(row.name == f"grad:{TABLE}" for row in report.rows)
    # With the table at fairseq's N(0, 1/D) the logits are O(1), as the untied model's are:
    # there 1e-5 measures the port alone (measured: 7.2e-7 and 1.2e-6, gradients 9.5e-7 and 1.2e-6).
    torch_twin, flax_twin = scaled_twins(config)
    source, target = sample_batch(config)
    with torch.no_grad():
        want = torch_twin(torch.as_tensor(source), torch.as_tensor(target)).cpu().numpy()
    got = np.asarray(flax_twin(jnp.asarray(source), jnp.asarray(target)))
    assert np.abs(got - want).max() <= ATOL
    report = check_twins(torch_twin, flax_twin, config, grads=True)
    assert report.ok, report.format_table()


def test_tied_twins_decode_the_same_tokens_with_their_kv_caches():
    # Cached decoding calls the head alone (decoder.fc) on each new position, in both twins.
    config = CONFIGS["all"]
    torch_twin, flax_twin = transformer_pair(config)
    report = check_decoding(torch_twin, flax_twin, config, 8)
    assert report.ok, report.format()


def scaled_twins(config):
    """``transformer_pair(config)`` with the tied table scaled to N(0, 1/D) (fairseq's init of
    an embedding), so the logits are O(1) (``test_tied_twins_agree_forward_and_gradients``)."""
    state = transformer_pair(config)[0].state_dict()
    state[TABLE] = state[TABLE] * config.embed_size ** -0.5
    for copy in COPIES[config.tie_embeddings]:
        state[copy] = state[TABLE]
    return twins_from_state_dict(state, config)


def _torch_tokens(batch):
    return tuple(torch.as_tensor(np.asarray(a)).long() for a in (batch.source, batch.target_in, batch.target_out))


def test_a_few_training_steps_of_the_tied_twins_match():
    config = CONFIGS["all"]
    task = SyntheticTask("reverse", vocab_size=V, min_len=2, max_len=config.max_len - 1)
    train = TrainConfig(schedule="constant", learning_rate=1e-3, clip_norm=1.0)
    torch_twin, flax_twin = scaled_twins(config)  # O(1) logits, where 1e-5 measures the port
    initial = torch_twin.state_dict()[TABLE].clone()
    torch_twin.train()
    optimizer, scheduler = make_optimizer(torch_twin, schedule="constant", learning_rate=1e-3)
    trainer = Trainer(flax_twin, train)
    state = trainer.init_state()
    flax_losses, torch_losses = [], []
    for step in range(5):
        batch = task.batch(3, step, 5)
        state, metrics = trainer.step(state, batch)
        flax_losses.append(float(jax.device_get(metrics["loss"])))
        torch_losses.append(train_step(torch_twin, optimizer, scheduler, batch, train.clip_norm)["loss"])
    # Measured: 4.8e-7 at most (losses 3.3 to 3.8).
    np.testing.assert_allclose(flax_losses, torch_losses, rtol=0, atol=ATOL)
    trained = parity.flax_to_torch(trainer.model(state))
    got, want = trained[TABLE], torch_twin.state_dict()[TABLE]
    assert all(torch.equal(trained[copy], got) for copy in COPIES["all"])  # still one table
    # test_training_parity's PARAM_ATOL. Measured: 3.0e-8 apart, after moving 5.0e-3 (5 steps of lr
    # 1e-3): the tolerance is no formality, and the table trained.
    assert (got - want).abs().max().item() <= 1e-5
    assert (want - initial).abs().max().item() > 100 * 1e-5
    held_out = task.eval_batches(3, 1, 5)[0]
    torch_twin.eval()
    with torch.no_grad():
        torch_logits = torch_twin(*_torch_tokens(held_out)[:2]).cpu().numpy()
    flax_logits = np.asarray(trainer.model(state)(held_out.source, held_out.target_in))
    # Measured: 1.2e-6 (logits of up to 2.8).
    np.testing.assert_allclose(flax_logits, torch_logits, rtol=0, atol=ATOL)


# ----------------------------------------------------------------------------- conversion


@pytest.mark.parametrize("scan_layers", [False, True], ids=["layers", "scanned"])
@pytest.mark.parametrize("tie", TIES)
def test_conversion_both_ways_is_bit_exact_and_loads_strictly(tie, scan_layers, tmp_path):
    config = CONFIGS[tie]
    source = torch_model(config)
    want = source.state_dict()
    flax_model = fm.Transformer.from_config(config, scan_layers=scan_layers, rngs=nnx.Rngs(1))
    parity.torch_to_flax(want, flax_model)  # the model's own ties: no tied= needed
    back = parity.flax_to_torch(flax_model)
    assert sorted(back) == sorted(want)
    for key, value in want.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key
    # Each copy a tensor of its own, so safetensors (which refuses shared memory) writes it.
    assert all(back[copy].data_ptr() != back[TABLE].data_ptr() for copy in COPIES[tie])
    fresh = torch_model(config, seed=1)
    fresh.load_state_dict(back, strict=True)
    assert fresh.decoder.fc.weight is fresh.decoder.embedding_layer.weight  # still tied
    for key, value in want.items():
        assert torch.equal(fresh.state_dict()[key], value), key
    # parity convert's layers: Flax parameters and back, in the torch twin's order; and the file.
    params = parity.convert.flax_params_from_state_dict(want, config)
    assert not any(flax_path(copy) in params for copy in COPIES[tie])
    exported = parity.convert.state_dict_from_flax_params(params, config)
    assert list(exported) == list(want) and all(torch.equal(exported[k], v) for k, v in want.items())
    path = parity.save_state_dict(exported, tmp_path / "tied.safetensors", config=config)
    loaded = parity.load_state_dict(path)
    torch_model(config, seed=2).load_state_dict(loaded, strict=True)
    assert all(torch.equal(loaded[k], v.cpu()) for k, v in want.items())  # a file loads onto the CPU


@pytest.mark.parametrize("tie", TIES)
def test_an_untied_state_dict_is_refused_by_a_tied_model_naming_the_copy(tie):
    config = CONFIGS[tie]
    untied = torch_model(untied_of(config)).state_dict()
    model = fm.Transformer.from_config(config, rngs=nnx.Rngs(1))
    before = flax_state(model)
    with pytest.raises(ConversionError) as info:
        parity.torch_to_flax(untied, model)
    assert "decoder.fc.weight" in info.value.invalid
    assert ("invalid value for 'decoder.fc.weight': tied to 'decoder.embedding_layer.weight', but "
            in str(info.value))
    after = flax_state(model)
    assert all(np.array_equal(after[k], v) for k, v in before.items())  # nothing half-loaded
    # A file holding the table under one name alone (safetensors' save_model) loads from it.
    tied = torch_model(config).state_dict()
    parity.torch_to_flax({k: v for k, v in tied.items() if k not in COPIES[tie]}, model)
    np.testing.assert_array_equal(model.decoder.embedding_layer.embedding.get_value(), tied[TABLE].cpu().numpy())


@pytest.mark.parametrize("tie", TIES)
def test_parity_reads_a_tied_save_model_file_once_told_the_tie_and_names_the_tie_when_not(tie, tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.torch import save_model

    from parity.cli import main as parity_main
    from parity.convert import flax_params_from_state_dict
    from parity.flax_io import read_flax_params

    config = CONFIGS[tie]
    model = torch_model(config)
    path = tmp_path / "tied.safetensors"
    save_model(model, str(path))  # one name of each group of tensors sharing memory
    with safe_open(str(path), "pt") as f:
        assert not set(COPIES[tie]) & set(f.keys())  # the file this test is about: the copies' names dropped
    told = tmp_path / "tie.json"
    told.write_text(json.dumps({"heads": config.heads, "tie_embeddings": tie}))
    capsys.readouterr()
    assert parity_main(["convert", str(path), str(tmp_path / "untold.safetensors"), "--heads", str(config.heads)]) == 2
    assert f'say the tie in --config, {{"tie_embeddings": "{tie}"}}' in capsys.readouterr().err
    assert not (tmp_path / "untold.safetensors").exists()
    out = tmp_path / "flax.safetensors"
    assert parity_main(["convert", str(path), str(out), "--config", str(told)]) == 0
    params, read_config, _ = read_flax_params(out)
    assert read_config.tie_embeddings == tie
    want = flax_params_from_state_dict(model.state_dict(), config)  # the whole state dict, every name
    assert sorted(params) == sorted(want) and all(np.array_equal(params[k], v) for k, v in want.items())
    if tie == "all":  # the check builds both twins from the file: the key inference could not do without the tie
        assert parity_main(["check", "--torch-checkpoint", str(path), "--config", str(told)]) == 0


# ----------------------------------------------------------------------------- the command line

# One vocabulary (--shared-vocab): source and target words overlap, as in a corpus of one
# language's edits; 40 pairs, 4 held out (--valid-size).
WORDS = "a b c d e f g h".split()
TSV = "".join(f"{' '.join(WORDS[(i + j) % 8] for j in range(1 + i % 4))}\t"
              f"{' '.join(WORDS[(i * 3 + j) % 8] for j in range(1 + i % 3))}\n" for i in range(40))
STEPS, SAVE_EVERY = 30, 10


def train_command(data, out, *extra):
    return ["train", "--data", str(data), "--shared-vocab", "--tie-embeddings", "all", "--preset", "tiny",
            "--layers", "1", "--max-len", "6", "--batch-size", "8", "--valid-size", "4", "--warmup", "5",
            "--eval-every", "1000", "--log-every", "5", "--save-every", str(SAVE_EVERY), "--no-progress", "--no-plot",
            "--steps", str(STEPS), "--out", str(out), *extra]


@pytest.fixture(scope="module")
def tied_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tied")
    (root / "train.tsv").write_text(TSV)
    proc = cli(*train_command(root / "train.tsv", root / "straight"))
    assert proc.returncode == 0, proc.stderr
    return root


def test_a_tied_run_records_its_tie_and_resumes_after_kill_9_bit_for_bit(tied_run):
    config = json.loads((tied_run / "straight" / "config.json").read_text())
    assert config["model"]["tie_embeddings"] == "all" and config["data"]["shared_vocab"] is True
    state = Run.open(tied_run / "straight").latest_state()
    assert "embedding_layer" not in state.params["encoder"] and "kernel" not in state.params["decoder"]["fc"]
    # What `kill -9` leaves, not a second run killed: the resume must give the straight run's
    # last step again.
    out = killed_before_its_last_checkpoint(tied_run / "straight", tied_run / "killed")
    command = train_command(tied_run / "train.tsv", out)
    killed_at = latest_state(out)[0]
    assert killed_at < STEPS
    resumed = cli(*command)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {out} from step {killed_at}" in resumed.stderr
    (s1, a), (s2, b) = latest_state(tied_run / "straight"), latest_state(out)
    assert s1 == s2 == STEPS
    assert_same_training_state(a, b)
    # Resumed without the option, the run is another model: refused by name, nothing written.
    proc = cli(*[arg for arg in command if arg not in ("--tie-embeddings", "all")])
    assert proc.returncode == 2
    assert "model.tie_embeddings (--tie-embeddings): 'all' in the run, None now" in proc.stderr


def test_a_tied_run_evaluates_and_generates(tied_run):
    run = str(tied_run / "straight")
    scores = cli("evaluate", "--checkpoint", run, "--json")
    assert scores.returncode == 0, scores.stderr
    assert set(json.loads(scores.stdout)) >= {"loss", "token_accuracy", "bleu"}
    beams = cli("generate", "--checkpoint", run, "--beam-size", "2", "--nbest", "2", stdin="a b c\nd e\n")
    assert beams.returncode == 0, beams.stderr
    assert len(beams.stdout.splitlines()) == 4  # two inputs, two hypotheses each
    assert all(set(line.split()) <= set(WORDS) | {"<unk>"} for line in beams.stdout.splitlines())


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_parity_convert_of_a_tied_run_loads_into_the_tied_torch_twin_and_starts_a_tied_run(tied_run, tmp_path,
                                                                                          suffix):
    from parity.cli import main as parity_main

    exported = tmp_path / f"tied{suffix}"
    assert parity_main(["convert", str(tied_run / "straight"), str(exported)]) == 0
    run = Run.open(tied_run / "straight")
    state = run.latest_state()
    state_dict = parity.load_state_dict(exported)
    from_run = parity.flax_to_torch(run.trainer.model(state))  # the run's newest parameters, bit for bit
    assert sorted(from_run) == sorted(state_dict) and all(torch.equal(state_dict[k], v.cpu()) for k, v in from_run.items())
    # Every key of the torch twin (safetensors writes its keys sorted).
    assert sorted(state_dict) == sorted(torch_model(run.config.model).state_dict())
    assert all(torch.equal(state_dict[copy], state_dict[TABLE]) for copy in COPIES["all"])
    twin = torch_ref.Transformer(**run.config.model.to_dict()).eval()
    twin.load_state_dict(state_dict, strict=True)
    assert twin.decoder.fc.weight is twin.encoder.embedding_layer.weight
    source, target = sample_batch(run.config.model, batch=3, seed=1)
    with torch.no_grad():
        want = twin(torch.as_tensor(source), torch.as_tensor(target)).cpu().numpy()
    got = np.asarray(run.trainer.model(state)(jnp.asarray(source), jnp.asarray(target)))
    # A trained tied model's logits reach 14 here (float32's spacing 9.5e-7). Measured: 4.8e-6.
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    # A new tied run from the export: its step 0 holds the file's weights, bit for bit.
    options = TrainOptions(preset="tiny", num_layers=1, dropout=0.0, tie_embeddings="all", init_from=str(exported))
    # The run's own data settings (--shared-vocab, the same file): the same token ids.
    new = Run.start(tmp_path / "fine-tuned", options, run.config.data, echo=lambda m: None)
    try:
        state = new.restore_or_init(new.checkpoints(), echo=lambda m: None)
    finally:
        new.close()
    assert int(state.step) == 0
    started = parity.flax_to_torch(new.trainer.model(state))
    assert sorted(started) == sorted(state_dict) and all(torch.equal(started[k].cpu(), v) for k, v in state_dict.items())


def test_a_run_config_without_the_field_loads_untied():
    # config.json written before tie_embeddings existed: no key, and an untied run writes none.
    config = RunConfig(model=UNTIED, train=TrainConfig(), data=DataConfig(kind="synthetic", task="copy"))
    stored = config.to_dict()
    assert "tie_embeddings" not in stored["model"]
    assert RunConfig.from_dict(stored).model.tie_embeddings is None
    tied = RunConfig(model=CONFIGS["all"], train=TrainConfig(), data=DataConfig(kind="synthetic", task="copy"))
    assert RunConfig.from_dict(tied.to_dict()) == tied

