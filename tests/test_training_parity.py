"""Training parity: ``torch_ref.training`` and ``flaxformer_mini.train`` from the same weights
on the same batches give the same losses, gradients, learning rates and, after 20 optimizer
steps (optax vs torch.optim), the same parameters.

Both twins start from ``parity.transformer_pair`` (torch initialisation, converted into Flax)
with dropout 0.0, so train mode computes what eval mode does. Batches come from the
``reverse`` synthetic task: right-padded, so the loss's normalisation over non-padding tokens
is part of what is compared.

One parameter family is special: the key projection's bias ``W_k.bias``. It adds ``q . b_k``
to every score of a query row, and the softmax over keys does not change when a row is
shifted by a constant, so its gradient is exactly zero in exact arithmetic. In float32 both
frameworks return rounding noise (~1e-10) instead, different noise in each, and Adam divides
the update by sqrt(v) ~ |noise| (eps is only 1e-9): each framework moves this bias by O(lr)
per step in a direction set by its own rounding. The bias cannot change the model's output,
so it is checked through that (the trained twins compute the same logits) and not entry by
entry (measured: 2e-3 apart after 20 steps at lr 1e-3, 1.7e-2 with the rsqrt run).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
import parity
from flaxformer_mini.data import PAD, SyntheticTask
from flaxformer_mini.train.optimizer import TrainConfig, learning_rate_schedule
from flaxformer_mini.train.trainer import Trainer
from flaxformer_mini.train.loss import token_cross_entropy as flax_token_cross_entropy
from torch_ref.training import (clip_grad_norm, cosine_learning_rate, make_optimizer, rsqrt_learning_rate,
                                token_cross_entropy, train_step)

from conftest import ATOL

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

# Dropout off: the Trainer compiles the train-mode model, and torch trains in train() mode;
# with p = 0 both are deterministic and equal to eval mode.
CONFIG = fm.get_preset("tiny").replace(dropout=0.0)
MODEL_SEED = 0
DATA_SEED = 3
BATCH_SIZE = 5
NUM_STEPS = 20
# Content lengths 2..16: with EOS/BOS the batches fill max_len = 17, and most rows are padded.
TASK = SyntheticTask("reverse", vocab_size=CONFIG.target_vocab_size, min_len=2, max_len=CONFIG.max_len - 1)

# The parity policy's 1e-5 (docs/design.md), well above what was measured: 4.8e-8 at most for a
# gradient, 1.2e-6 for a parameter after NUM_STEPS steps (W_k.bias aside, see above).
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-5
PARAM_ATOL = 1e-5
# The Flax schedule is evaluated in float32 (the learning_rate metric is a float32 scalar),
# torch's LambdaLR in float64, so 1e-9 relative is out of reach. Each float32 rounding costs
# up to 2**-24 ~ 6e-8 relative, and the Flax rsqrt path rounds up to four times (the Python
# constants factor * D^-0.5 and warmup^-1.5 cast to float32, n * warmup^-1.5 or n^-0.5, the
# final product). Measured: 1.5e-7 relative at most (4.7e-8 for a constant 1e-3, which
# float32 cannot hold exactly).
LR_RTOL = 4 * 2.0**-24

KEY_BIAS = "attention.W_k.bias"


def _is_key_bias(name):
    return name.endswith(KEY_BIAS)


def _torch_tokens(batch):
    return tuple(torch.as_tensor(x, dtype=torch.int64) for x in batch)


# ----------------------------------------------------------------------------- loss


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_token_cross_entropy_matches_flax_on_random_logits(label_smoothing):
    B, T, V = 3, 7, 11
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(B, T, V)).astype(np.float32) * 3
    labels = rng.integers(1, V, size=(B, T))
    labels[1, 4:] = PAD
    labels[2, 1:] = PAD
    expected, _ = flax_token_cross_entropy(logits, labels, label_smoothing)
    got = token_cross_entropy(torch.as_tensor(logits), torch.as_tensor(labels), label_smoothing)
    assert abs(float(expected) - got.item()) <= 1e-6


def test_token_cross_entropy_of_a_batch_without_labels_is_zero_as_in_flax():
    labels = np.full((2, 3), PAD)
    logits = np.ones((2, 3, 5), np.float32)
    expected, _ = flax_token_cross_entropy(logits, labels)
    got = token_cross_entropy(torch.as_tensor(logits), torch.as_tensor(labels))
    assert float(expected) == got.item() == 0.0


def test_token_cross_entropy_of_uniform_logits_is_log_vocab_whatever_the_padding():
    V = 13
    labels = torch.tensor([[5, 2, PAD, PAD], [7, PAD, PAD, PAD]])
    for smoothing in (0.0, 0.1):
        loss = token_cross_entropy(torch.zeros(2, 4, V), labels, smoothing)
        assert abs(loss.item() - np.log(V)) <= 1e-6


def test_token_cross_entropy_widens_half_precision_logits_and_keeps_float64():
    # float64 logits (a twin run in float64 as a reference) must not be rounded to float32 first.
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 30
    labels = torch.tensor([[1, 4, PAD], [6, 2, 3]])
    exact = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD)
    loss = token_cross_entropy(logits, labels)
    assert loss.dtype == torch.float64 and abs(loss.item() - exact.item()) <= 1e-13
    assert token_cross_entropy(logits.float(), labels).item() != loss.item()  # float32's rounding is visible here
    assert token_cross_entropy(logits.bfloat16(), labels).dtype == torch.float32


LABEL_SMOOTHINGS = (0.0, 0.1)


def _loss_and_grads(label_smoothing):
    """(Flax loss, torch loss, Flax grads as a torch state dict, torch grads) on one batch."""
    return _losses_and_grads()[label_smoothing]


@functools.cache
def _losses_and_grads():
    """``_loss_and_grads`` of every label smoothing in LABEL_SMOOTHINGS, from one forward pass on
    each side: on the Flax side one compiled program (the Jacobian of the stacked losses, one
    backward pass per loss), not one program per label smoothing."""
    torch_model, flax_model = parity.transformer_pair(CONFIG, MODEL_SEED)
    batch = TASK.batch(DATA_SEED, 0, BATCH_SIZE)
    assert (batch.target_out == PAD).any(), "the batch should have padding, so its normalisation is tested"

    source, target_in, target_out = _torch_tokens(batch)
    torch_logits = torch_model(source, target_in)
    names, params = zip(*torch_model.named_parameters())
    torch_results = {}
    for label_smoothing in LABEL_SMOOTHINGS:
        torch_loss = token_cross_entropy(torch_logits, target_out, label_smoothing)
        torch_grads = torch.autograd.grad(torch_loss, params, retain_graph=True)
        torch_results[label_smoothing] = torch_loss.item(), dict(zip(names, torch_grads))

    graphdef, flax_params, rest = nnx.split(flax_model, nnx.Param, ...)

    def losses(flax_params):
        logits = nnx.merge(graphdef, flax_params, rest, copy=True)(batch.source, batch.target_in)
        stacked = jnp.stack([flax_token_cross_entropy(logits, batch.target_out, s)[0] for s in LABEL_SMOOTHINGS])
        return stacked, stacked

    @jax.jit  # one program, not op by op
    def losses_and_grads(flax_params):
        jacobian, stacked = jax.jacrev(losses, has_aux=True)(flax_params)
        return stacked, [jax.tree.map(lambda g: g[i], jacobian) for i in range(len(LABEL_SMOOTHINGS))]

    flax_losses, grads = losses_and_grads(flax_params)
    flax_losses = np.asarray(flax_losses)
    results = {}
    for i, label_smoothing in enumerate(LABEL_SMOOTHINGS):
        # Put the gradients where the parameters were, so the converter lays them out (transposes
        # kernels) and names them as torch does.
        grad_model = nnx.clone(flax_model)
        nnx.update(grad_model, grads[i])
        torch_loss, torch_grads = torch_results[label_smoothing]
        results[label_smoothing] = float(flax_losses[i]), torch_loss, parity.flax_to_torch(grad_model), torch_grads
    return results


@pytest.mark.parametrize("label_smoothing", LABEL_SMOOTHINGS)
def test_loss_of_the_same_batch_matches_torch(label_smoothing):
    flax_loss, torch_loss, _, _ = _loss_and_grads(label_smoothing)
    assert np.isfinite(flax_loss) and flax_loss > 1.0  # an untrained model: ~log(V) = 2.9
    assert abs(flax_loss - torch_loss) <= ATOL  # measured: 0 without smoothing, 2.4e-7 with


@pytest.mark.parametrize("label_smoothing", LABEL_SMOOTHINGS)
def test_gradients_match_torch_parameter_by_parameter(label_smoothing):
    _, _, flax_grads, torch_grads = _loss_and_grads(label_smoothing)
    assert flax_grads.keys() == torch_grads.keys()
    failures = []
    for name, torch_grad in torch_grads.items():
        a, b = flax_grads[name].double(), torch_grad.double()
        assert a.shape == b.shape, name
        excess = (a - b).abs() - (GRAD_ATOL + GRAD_RTOL * b.abs())
        if excess.max() > 0:
            failures.append(f"{name}: max abs diff {(a - b).abs().max().item():.3e}")
    assert not failures, "gradients differ:\n" + "\n".join(failures)
    # Not a vacuous comparison: the gradients are far larger than the tolerance.
    assert max(g.abs().max().item() for g in torch_grads.values()) > 1e3 * GRAD_ATOL


@pytest.mark.parametrize("label_smoothing", LABEL_SMOOTHINGS)
def test_key_bias_gradient_is_rounding_noise_in_both_frameworks(label_smoothing):
    """Why W_k.bias is compared through the model's output, not entry by entry (module doc)."""
    _, _, flax_grads, torch_grads = _loss_and_grads(label_smoothing)
    key_biases = [name for name in torch_grads if _is_key_bias(name)]
    assert len(key_biases) == 3 * CONFIG.num_layers  # encoder self, decoder self and cross
    for name in key_biases:
        # Measured: 4.7e-10 at most; the other gradients are ~1e-2 to 1e-1.
        assert torch_grads[name].abs().max() < 1e-8, name
        assert flax_grads[name].abs().max() < 1e-8, name


# ----------------------------------------------------------------------------- clipping, schedule


def test_clip_grad_norm_follows_optax_not_torch_clip_grad_norm_():
    max_norm = 1.0
    optax_clip = optax.clip_by_global_norm(max_norm)
    for scale in (5.0, 1.0 - 1e-7 * 4):  # well above max_norm, and just below it
        values = [np.array([3.0, -4.0], np.float32) / 5 * scale, np.array([[0.0]], np.float32)]
        params = [torch.nn.Parameter(torch.zeros(v.shape)) for v in values]
        for p, v in zip(params, values):
            p.grad = torch.as_tensor(v.copy())
        norm = clip_grad_norm(params, max_norm)
        expected, _ = optax_clip.update(values, optax_clip.init(values))
        assert abs(norm.item() - scale) <= 1e-6
        for p, e in zip(params, expected):
            np.testing.assert_allclose(p.grad.cpu().numpy(), np.asarray(e), rtol=1e-7, atol=0)

    # Where they part: torch's clip_grad_norm_ scales by max_norm / (norm + 1e-6), so it also
    # shrinks a gradient just below max_norm, which optax (and torch_ref) leave untouched.
    grad = torch.tensor([0.6, -0.8]) * (1.0 - 4e-7)
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = grad.clone()
    torch.nn.utils.clip_grad_norm_([p], max_norm)
    assert not torch.equal(p.grad, grad)
    p.grad = grad.clone()
    clip_grad_norm([p], max_norm)
    assert torch.equal(p.grad, grad)


def test_rsqrt_schedule_values_worked_by_hand():
    # D = 16, warmup 4: lr = 16^-0.5 * min(n^-0.5, n / 8) with n = step + 1.
    assert rsqrt_learning_rate(0, 16, 1.0, 4) == 0.25 * 0.125  # warming up: n / 8
    assert rsqrt_learning_rate(3, 16, 1.0, 4) == 0.25 * 0.5  # the peak, where both agree
    assert rsqrt_learning_rate(15, 16, 2.0, 4) == 2.0 * 0.25 * 0.25  # decaying: n^-0.5


def test_cosine_schedule_values_worked_by_hand():
    # Peak 2, warm-up 4 from 2 / 4, 0 at update 12: the half cosine spans updates 4..12.
    assert [cosine_learning_rate(s, 2.0, 4, 12) for s in range(5)] == [0.5, 0.875, 1.25, 1.625, 2.0]
    assert cosine_learning_rate(8, 2.0, 4, 12) == pytest.approx(1.0, abs=1e-15)  # half-way: cos(pi / 2) = 0
    assert cosine_learning_rate(6, 2.0, 4, 12) == pytest.approx(1.0 + 2 ** -0.5, rel=1e-15)  # cos(pi / 4)
    assert cosine_learning_rate(12, 2.0, 4, 12) == 0.0
    assert cosine_learning_rate(40, 2.0, 4, 12) == 0.0  # past decay_steps it stays at 0


@pytest.mark.parametrize(
    "train_config",
    [
        TrainConfig(schedule="rsqrt", lr_factor=2.0, warmup_steps=10),
        TrainConfig(schedule="rsqrt", warmup_steps=1),
        TrainConfig(schedule="constant", learning_rate=3e-4),
        TrainConfig(schedule="cosine", learning_rate=2e-3, warmup_steps=10, decay_steps=70),  # ends inside the 100
    ],
    ids=["rsqrt-warmup10", "rsqrt-warmup1", "constant", "cosine"],
)
def test_learning_rate_schedules_match_flax_for_100_steps(train_config):
    d_model = 30
    flax_schedule = learning_rate_schedule(train_config, d_model)
    _, scheduler = make_optimizer(
        torch.nn.Linear(2, 3),
        schedule=train_config.schedule,
        learning_rate=train_config.learning_rate,
        lr_factor=train_config.lr_factor,
        warmup_steps=train_config.warmup_steps,
        decay_steps=train_config.decay_steps,
        d_model=d_model,
    )
    torch_lrs, flax_lrs = [], []
    for step in range(100):
        torch_lrs.append(scheduler.get_last_lr()[0])
        flax_lrs.append(float(flax_schedule(step)))
        scheduler.optimizer.step()  # no gradients: a no-op, but keeps LambdaLR from warning
        scheduler.step()
    # Near its end the cosine's 1 + cos(pi x) cancels in float32 (optax's): an error of a few
    # float32 roundings of the peak, large relative to the small rate left there.
    atol = LR_RTOL * train_config.learning_rate if train_config.schedule == "cosine" else 0
    np.testing.assert_allclose(flax_lrs, torch_lrs, rtol=LR_RTOL, atol=atol)


@pytest.mark.parametrize("bad, message", [
    (dict(schedule="linear"), "unknown schedule 'linear'"),
    (dict(warmup_steps=0), "warmup_steps must be >= 1, got 0"),
    # no decay_steps: where it reaches 0 is part of the schedule
    (dict(schedule="cosine"), "schedule 'cosine' needs decay_steps"),
    # nothing left to decay over
    (dict(schedule="cosine", warmup_steps=10, decay_steps=10), "schedule 'cosine' needs decay_steps"),
], ids=["unknown-schedule", "no-warmup", "cosine-without-decay-steps", "cosine-ending-at-its-warmup"])
def test_make_optimizer_refuses_what_train_config_refuses(bad, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**bad)
    with pytest.raises(ValueError, match=message):
        make_optimizer(torch.nn.Linear(2, 3), d_model=4, **bad)


# ----------------------------------------------------------------------------- 20 steps


@dataclasses.dataclass
class Run:
    config: TrainConfig
    flax: dict  # metric name -> list over steps
    torch: dict
    flax_params: dict  # torch key -> tensor, after NUM_STEPS updates
    torch_params: dict
    initial_params: dict
    flax_logits: np.ndarray  # on a held-out batch, after training
    torch_logits: np.ndarray


def _torch_optimizer(torch_model, config):
    """torch_ref's optimizer with every setting of a Flax TrainConfig."""
    return make_optimizer(
        torch_model,
        schedule=config.schedule,
        learning_rate=config.learning_rate,
        lr_factor=config.lr_factor,
        warmup_steps=config.warmup_steps,
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
    )  # d_model: read from the model, as the Trainer reads config.embed_size


def _train_both(config):
    torch_model, flax_model = parity.transformer_pair(CONFIG, MODEL_SEED)
    initial = {k: v.clone() for k, v in torch_model.state_dict().items()}
    torch_model.train()
    optimizer, scheduler = _torch_optimizer(torch_model, config)
    trainer = Trainer(flax_model, config)
    state = trainer.init_state()
    # From here on the Flax parameters being trained live in `state` (init_state copies the
    # model's arrays, which the compiled step then donates); flax_model keeps the initial ones.

    flax_metrics, torch_metrics = {}, {}
    for step in range(NUM_STEPS):
        batch = TASK.batch(DATA_SEED, step, BATCH_SIZE)
        state, metrics = trainer.step(state, batch)
        for name, value in jax.device_get(metrics).items():
            flax_metrics.setdefault(name, []).append(float(value))
        result = train_step(torch_model, optimizer, scheduler, batch, config.clip_norm, config.label_smoothing)
        for name, value in result.items():
            torch_metrics.setdefault(name, []).append(value)

    held_out = TASK.eval_batches(DATA_SEED, 1, BATCH_SIZE)[0]
    flax_trained = trainer.model(state)  # eval mode
    torch_model.eval()
    with torch.no_grad():
        torch_logits = torch_model(*_torch_tokens(held_out)[:2]).cpu().numpy()
    return Run(
        config=config,
        flax=flax_metrics,
        torch=torch_metrics,
        flax_params=parity.flax_to_torch(flax_trained),
        torch_params={k: v.detach().clone() for k, v in torch_model.state_dict().items()},
        initial_params=initial,
        flax_logits=np.asarray(flax_trained(held_out.source, held_out.target_in)),
        torch_logits=torch_logits,
    )


RUNS = {
    # Adam, constant lr, clipping on: the gradient norm starts above 1 and ends below it.
    "adam-constant-clipped": TrainConfig(schedule="constant", learning_rate=1e-3, clip_norm=1.0),
    # AdamW under the warm-up schedule (warmup 7 of 20 steps, so both sides of its peak, up to
    # lr 1.4e-2), no clipping, label smoothing. Decay 0.1 is large enough to see: training the
    # torch side without it moves the parameters by 7.8e-2, against a tolerance of 1e-4.
    "adamw-rsqrt-unclipped": TrainConfig(
        schedule="rsqrt", lr_factor=0.2, warmup_steps=7, clip_norm=None, weight_decay=0.1, label_smoothing=0.1
    ),
}


@pytest.fixture(scope="module", params=list(RUNS))
def run(request):
    return _train_both(RUNS[request.param])


def test_loss_of_every_step_matches_torch(run):
    # Measured: 7.2e-7 at most.
    np.testing.assert_allclose(run.flax["loss"], run.torch["loss"], rtol=0, atol=ATOL)
    assert run.torch["loss"][-1] < run.torch["loss"][0]  # it does train


def test_gradient_norm_of_every_step_matches_torch(run):
    # Measured: 3.6e-7 at most.
    np.testing.assert_allclose(run.flax["grad_norm"], run.torch["grad_norm"], rtol=0, atol=ATOL)
    clip = run.config.clip_norm
    if clip is not None:  # both branches of the clipping are exercised
        assert max(run.torch["grad_norm"]) > clip > min(run.torch["grad_norm"])


def test_learning_rate_of_every_step_matches_torch(run):
    np.testing.assert_allclose(run.flax["learning_rate"], run.torch["learning_rate"], rtol=LR_RTOL, atol=0)
    if run.config.schedule == "rsqrt":
        lrs = run.torch["learning_rate"]
        peak = int(np.argmax(lrs))
        assert peak == run.config.warmup_steps - 1 and lrs[0] < lrs[peak] > lrs[-1]


def test_parameters_after_20_steps_match_torch(run):
    assert run.flax_params.keys() == run.torch_params.keys()
    diffs = {
        name: (run.flax_params[name].double() - run.torch_params[name].double()).abs().max().item()
        for name in run.torch_params
        if not _is_key_bias(name)  # see the module docstring; covered by the logits test
    }
    too_far = {name: d for name, d in diffs.items() if d > PARAM_ATOL}
    assert not too_far, "parameters differ after training:\n" + "\n".join(f"{k}: {v:.3e}" for k, v in too_far.items())
    # Measured: 2.4e-7 (adam-constant-clipped), 1.2e-6 (adamw-rsqrt-unclipped).
    # Not vacuous: training moved the parameters far more than the tolerance.
    moved = max((run.torch_params[k] - run.initial_params[k]).abs().max().item() for k in diffs)
    assert moved > 100 * PARAM_ATOL


def test_trained_twins_compute_the_same_logits(run):
    # Also the check on W_k.bias, which the two frameworks set differently but which cannot
    # change the output. Measured: 1.4e-6 and 1.7e-6.
    np.testing.assert_allclose(run.flax_logits, run.torch_logits, rtol=0, atol=ATOL)
