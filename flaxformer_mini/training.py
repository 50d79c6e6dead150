"""Loss, optimizer and the pure, jitted train and eval steps.

The compiled steps are functions of explicit state: ``train_step(state, batch) -> (state,
metrics)``. The model's structure (its ``nnx.GraphDef``) is closed over; its parameters,
the optimizer state and the step counter travel in ``TrainState``, whose buffers are
donated to the step so XLA updates them in place.

Dropout keys are ``fold_in(key(seed), step)``: a step is reproducible on its own, which is
what makes a resumed run bit-identical to an uninterrupted one.
"""

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flaxformer_mini.data import PAD
from flaxformer_mini.validation import check_same_batch, check_tokens


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. ``schedule='rsqrt'`` is the warm-up + inverse square root of
    "Attention Is All You Need": lr = factor * D^-0.5 * min(n^-0.5, n * warmup^-1.5), n = step + 1.
    ``schedule='constant'`` uses ``learning_rate`` throughout."""

    schedule: str = "rsqrt"
    learning_rate: float = 1e-3  # for schedule='constant'
    lr_factor: float = 1.0  # for schedule='rsqrt'
    warmup_steps: int = 4000
    b1: float = 0.9
    b2: float = 0.98  # the paper's Adam betas and epsilon
    eps: float = 1e-9
    weight_decay: float = 0.0  # > 0 switches Adam to AdamW (decoupled, as torch.optim.AdamW)
    clip_norm: float | None = 1.0  # global-norm gradient clipping; None turns it off
    label_smoothing: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.schedule not in ("rsqrt", "constant"):
            raise ValueError(f"unknown schedule {self.schedule!r}; choose 'rsqrt' or 'constant'")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {self.warmup_steps}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")


def learning_rate_schedule(config: TrainConfig, d_model: int):
    if config.schedule == "constant":
        return optax.constant_schedule(config.learning_rate)

    def rsqrt(count):
        n = jnp.asarray(count, jnp.float32) + 1.0  # optax counts from 0, the paper from 1
        return config.lr_factor * d_model**-0.5 * jnp.minimum(n**-0.5, n * config.warmup_steps**-1.5)

    return rsqrt


def make_optimizer(config: TrainConfig, d_model: int):
    lr = learning_rate_schedule(config, d_model)
    # optax's adam divides by sqrt(v_hat) + eps, as torch.optim.Adam does (eps_root = 0).
    if config.weight_decay > 0:
        adam = optax.adamw(lr, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay)
    else:
        adam = optax.adam(lr, b1=config.b1, b2=config.b2, eps=config.eps)
    if config.clip_norm is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(config.clip_norm), adam)


def token_cross_entropy(logits, labels, label_smoothing=0.0, pad_id=PAD):
    """Cross-entropy averaged over the non-padding target tokens.

    Equals ``F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=pad_id,
    label_smoothing=label_smoothing)``. Returns (mean loss, (summed loss, token count)).
    """
    logits = logits.astype(jnp.float32)  # log-softmax in float32 whatever the compute dtype
    targets = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32)
    if label_smoothing:
        targets = optax.smooth_labels(targets, label_smoothing)
    per_token = optax.softmax_cross_entropy(logits, targets)  # (B, T)
    mask = (labels != pad_id).astype(jnp.float32)
    total = jnp.sum(per_token * mask)
    count = jnp.sum(mask)
    return total / jnp.maximum(count, 1.0), (total, count)


def correct_tokens(logits, labels, pad_id=PAD):
    """How many non-padding labels the logits' argmax predicts."""
    return jnp.sum((jnp.argmax(logits, -1) == labels) & (labels != pad_id))


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: the number of updates applied
    params: nnx.State
    opt_state: optax.OptState
    other: nnx.State  # the model's non-parameter state (dropout RNG streams)


def check_batch(batch, model_config):
    """Host-side checks before a batch enters compiled code (JAX would not raise)."""
    c = model_config
    check_tokens(batch.source, c.source_vocab_size, c.max_len, "batch.source")
    check_tokens(batch.target_in, c.target_vocab_size, c.max_len, "batch.target_in")
    check_tokens(batch.target_out, c.target_vocab_size, c.max_len, "batch.target_out")
    check_same_batch(batch.source, batch.target_in)
    if batch.target_in.shape != batch.target_out.shape:
        raise ValueError(f"target_in {batch.target_in.shape} and target_out {batch.target_out.shape} differ in shape")


class Trainer:
    """Owns the compiled steps for one model structure and one optimizer.

    ``Trainer(model, TrainConfig(...))`` splits ``model`` into a train-mode and an eval-mode
    graph definition (``model.train()``/``eval()`` change static attributes, so each mode
    is its own compiled program) and builds the jitted ``train_step`` and ``eval_step``.
    """

    def __init__(self, model, config: TrainConfig):
        self.config = config
        self.model_config = model.config
        self.tx = make_optimizer(config, model.config.embed_size)
        self.lr_schedule = learning_rate_schedule(config, model.config.embed_size)
        model.train()
        self.train_graphdef, params, other = nnx.split(model, nnx.Param, ...)
        model.eval()
        self.eval_graphdef = nnx.graphdef(model)
        self._template = (params, other)
        self.train_step = jax.jit(self._train_step, donate_argnums=0)
        self.eval_step = jax.jit(self._eval_step)

    def init_state(self):
        """A fresh state at step 0. Copies the template's arrays: the train step donates its
        input state, which would otherwise delete the template after the first step."""
        params, other = jax.tree.map(jnp.copy, self._template)
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.tx.init(params), other=other)

    def _loss(self, model, batch):
        logits = model(batch.source, batch.target_in)
        loss, (_, count) = token_cross_entropy(logits, batch.target_out, self.config.label_smoothing)
        correct = correct_tokens(logits, batch.target_out)
        return loss, (count, correct)

    def _train_step(self, state: TrainState, batch):
        model = nnx.merge(self.train_graphdef, state.params, state.other)
        # Dropout keys from (seed, step) alone. Tag "default" when the model was built with
        # nnx.Rngs(seed), "dropout" when it has a dropout stream; reseed ignores absent tags.
        key = jax.random.fold_in(jax.random.key(self.config.seed), state.step)
        nnx.reseed(model, default=key, dropout=key)
        # nnx.value_and_grad differentiates the Params and lets dropout advance its RNG
        # counters inside the trace (jax.grad over merged state cannot mutate them).
        grad_fn = nnx.value_and_grad(self._loss, has_aux=True)
        (loss, (count, correct)), grads = grad_fn(model, batch)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": loss,
            "tokens": count,
            "token_accuracy": correct / jnp.maximum(count, 1.0),
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": self.lr_schedule(state.step),
        }
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    def _eval_step(self, params, other, batch):
        model = nnx.merge(self.eval_graphdef, params, other)
        logits = model(batch.source, batch.target_in)
        _, (total, count) = token_cross_entropy(logits, batch.target_out)
        correct = correct_tokens(logits, batch.target_out)
        return {"loss_sum": total, "tokens": count, "correct": correct}

    def step(self, state, batch):
        """Check ``batch`` on the host, then run the compiled train step."""
        check_batch(batch, self.model_config)
        return self.train_step(state, batch)

    def evaluate(self, state, batches):
        """Teacher-forced loss and token accuracy over ``batches`` (summed, then divided)."""
        total = count = correct = 0.0
        for batch in batches:
            check_batch(batch, self.model_config)
            m = jax.device_get(self.eval_step(state.params, state.other, batch))
            total, count, correct = total + m["loss_sum"], count + m["tokens"], correct + m["correct"]
        return {"loss": float(total / max(count, 1.0)), "token_accuracy": float(correct / max(count, 1.0))}

    def model(self, state, train=False):
        """A live model holding ``state``'s parameters (for decoding, saving, inspection)."""
        return nnx.merge(self.train_graphdef if train else self.eval_graphdef, state.params, state.other)

