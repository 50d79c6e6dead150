"""Gradient accumulation (``--accumulate K``): one optimizer update from K micro-batches.

The update equals ``train_step`` on the micro-batches' union: the gradients of each
micro-batch's *summed* token loss are added up (in float32), then divided by the total token
count, and one optimizer step is taken. ``add_micro_batch(state, sums, batch)`` runs per
micro-batch, each compiled in its own shape (``--max-tokens`` micro-batches differ in shape, and
stacking them would pad every one to the largest), then ``apply_gradient_sums(state, sums)``
takes the step; ``Trainer.accumulate`` runs both.

optax.MultiSteps would average per-micro-batch *mean* gradients instead, which weighs a short
micro-batch's tokens more than the big batch does, and keeps its own step counter in the
optimizer state (checkpoints of --accumulate runs would then differ in structure).

Micro-batch j's dropout keys are ``fold_in(fold_in(key(seed), step), j)``.
"""

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flaxformer_mini.train.loss import correct_tokens, token_cross_entropy
from flaxformer_mini.train.optimizer import learning_rate_schedule
from flaxformer_mini.train.state import TrainState
from flaxformer_mini.train.step import averaged, reseed_dropout


def _summed_loss(model, batch, label_smoothing):
    logits = model(batch.source, batch.target_in)
    _, (total, count) = token_cross_entropy(logits, batch.target_out, label_smoothing)
    return total, (count, correct_tokens(logits, batch.target_out))


@flax.struct.dataclass
class GradientSums:
    """The running sums of one update's micro-batches (``--accumulate``), carried from one
    ``add_micro_batch`` to the next: float32 gradients of the summed token losses (a
    bfloat16 sum of K gradients would round each addition), the summed loss, the label count,
    the correct labels, and how many micro-batches were added (micro-batch j's dropout keys are
    fold_in(step key, j))."""

    grads: nnx.State  # float32, shaped like the parameters
    loss: jax.Array  # float32 scalar
    tokens: jax.Array  # float32 scalar: non-PAD labels
    correct: jax.Array  # int32 scalar
    micro_batches: jax.Array  # int32 scalar


def zero_gradient_sums(state: TrainState):
    """The ``GradientSums`` an update starts from: zeros shaped like ``state``'s parameters."""
    zero = jnp.zeros((), jnp.float32)
    return GradientSums(grads=jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params), loss=zero,
                        tokens=zero, correct=jnp.zeros((), jnp.int32), micro_batches=jnp.zeros((), jnp.int32))


def add_micro_batch(state: TrainState, sums: GradientSums, batch):
    """``sums`` plus one micro-batch's gradient and loss sums, pure; ``state`` is only read.
    Compiled once per micro-batch shape: the shapes a run without --accumulate compiles."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(state.config.seed), state.step), sums.micro_batches)
    model = nnx.merge(state.graphdef, state.params, state.other)
    reseed_dropout(model, key)
    grad_fn = nnx.value_and_grad(_summed_loss, has_aux=True)
    (total, (count, correct)), grads = grad_fn(model, batch, state.config.label_smoothing)
    return GradientSums(grads=jax.tree.map(lambda a, g: a + g.astype(jnp.float32), sums.grads, grads),
                        loss=sums.loss + total, tokens=sums.tokens + count, correct=sums.correct + correct,
                        micro_batches=sums.micro_batches + 1)


def apply_gradient_sums(state: TrainState, sums: GradientSums):
    """The optimizer update from an update's ``GradientSums``: ``(state, sums) -> (state,
    metrics)``, pure: the gradients summed over every micro-batch's tokens, divided by their
    total count, which is ``train_step``'s normalisation over the micro-batches' union."""
    denominator = jnp.maximum(sums.tokens, 1.0)
    # Summed in float32 (GradientSums), stepped in the parameters' own dtype, as train_step is.
    grads = jax.tree.map(lambda g, p: (g / denominator).astype(p.dtype), sums.grads, state.params)
    d_model = nnx.merge(state.graphdef, state.params, state.other).config.embed_size  # at trace time only
    with jax.numpy_dtype_promotion("standard"):  # optax's own promotions: see train_step
        updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        learning_rate = learning_rate_schedule(state.config, d_model)(state.step)
    metrics = {
        "loss": sums.loss / denominator,
        "tokens": sums.tokens,
        "token_accuracy": sums.correct.astype(jnp.float32) / denominator,  # int32 count of correct tokens
        "grad_norm": optax.tree.norm(grads),
        "learning_rate": learning_rate,
    }
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state, ema=averaged(state, params)), metrics
