"""Gradient accumulation (``--accumulate K``): one optimizer update from K micro-batches.

The update equals ``train_step`` on the micro-batches' union: the gradients of each
micro-batch's *summed* token loss are added up (in float32), then divided by the total token
count, and one optimizer step is taken. Two ways to run it, one maths
(``_apply_summed_gradients``):

- ``accumulated_train_step(state, stacked)``: K micro-batches of one shape, stacked
  (``stack_batches``) and scanned in one compiled program;
- ``add_micro_batch(state, sums, batch)`` per micro-batch, each compiled in its own shape, then
  ``apply_gradient_sums(state, sums)``: what ``Trainer.accumulate`` (and so ``train
  --accumulate``) runs, since ``--max-tokens`` micro-batches differ in shape and stacking
  would pad every one of them to the largest.

Micro-batch j's dropout keys are ``fold_in(fold_in(key(seed), step), j)`` either way.
``flaxformer_mini.training`` gives every public name here too (imported on first use: this
module imports training).
"""

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flaxformer_mini.data import PAD
from flaxformer_mini.training import TrainState, correct_tokens, learning_rate_schedule, reseed_dropout, token_cross_entropy


def _summed_loss(model, batch, label_smoothing):
    logits = model(batch.source, batch.target_in)
    _, (total, count) = token_cross_entropy(logits, batch.target_out, label_smoothing)
    return total, (count, correct_tokens(logits, batch.target_out))


def _micro_batch_gradients(graphdef, params, other, batch, key, label_smoothing):
    """Gradients of one micro-batch's *summed* token loss, its dropout keys from ``key``:
    (grads, summed loss, label count, correct labels, params, other). The params and RNG
    state come back for ``lax.scan``'s carry (nnx may only reseed variables of the trace
    that made them)."""
    model = nnx.merge(graphdef, params, other)
    reseed_dropout(model, key)
    (total, (count, correct)), grads = nnx.value_and_grad(_summed_loss, has_aux=True)(model, batch, label_smoothing)
    _, params, other = nnx.split(model, nnx.Param, ...)
    return grads, total, count, correct, params, other


def _apply_summed_gradients(state: TrainState, grads, total, count, correct):
    """The optimizer update from gradients summed over every micro-batch's tokens, divided by
    their total count: ``train_step``'s normalisation over the micro-batches' union."""
    denominator = jnp.maximum(count, 1.0)
    # Summed in float32 (GradientSums), stepped in the parameters' own dtype, as train_step is.
    grads = jax.tree.map(lambda g, p: (g / denominator).astype(p.dtype), grads, state.params)
    d_model = nnx.merge(state.graphdef, state.params, state.other).config.embed_size  # at trace time only
    with jax.numpy_dtype_promotion("standard"):  # optax's own promotions: see train_step
        updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": total / denominator,
        "tokens": count,
        "token_accuracy": correct.astype(jnp.float32) / denominator,  # int32 count of correct tokens
        "grad_norm": optax.tree.norm(grads),
        "learning_rate": learning_rate_schedule(state.config, d_model)(state.step),
    }
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def _float32_zeros(params):
    return jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)


def accumulated_train_step(state: TrainState, batches):
    """One optimizer update from K micro-batches of one shape: ``batches`` is a ``Batch`` of
    arrays with a leading axis K (``stack_batches``). Pure, like ``train_step``.

    Gradients of the summed token losses are added over the micro-batches (``lax.scan``: one
    micro-batch's activations in memory at a time) and divided by the total token count, so
    the update equals ``train_step`` on the K micro-batches concatenated into one batch (with
    dropout 0; micro-batch j's dropout keys are fold_in(step key, j)). optax.MultiSteps would
    average per-micro-batch *mean* gradients instead, which weighs a short micro-batch's tokens
    more than the big batch does, and keeps its own step counter in the optimizer state
    (checkpoints of --accumulate runs would then differ in structure).

    Stacking pads every micro-batch to the largest one's shape: micro-batches of different
    shapes (``--max-tokens``) go through ``add_micro_batch`` and ``apply_gradient_sums``
    instead, each in its own shape (``Trainer.accumulate``).
    """
    base = jax.random.fold_in(jax.random.key(state.config.seed), state.step)

    def micro(carry, inputs):
        grads_sum, total_sum, count_sum, correct_sum, params, other = carry
        j, batch = inputs
        grads, total, count, correct, params, other = _micro_batch_gradients(
            state.graphdef, params, other, batch, jax.random.fold_in(base, j), state.config.label_smoothing)
        grads_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads_sum, grads)
        return (grads_sum, total_sum + total, count_sum + count, correct_sum + correct, params, other), None

    k = batches.source.shape[0]
    init = (_float32_zeros(state.params), jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32),
            jnp.zeros((), jnp.int32), state.params, state.other)
    (grads, total, count, correct, _, _), _ = jax.lax.scan(micro, init, (jnp.arange(k), batches))
    return _apply_summed_gradients(state, grads, total, count, correct)


@flax.struct.dataclass
class GradientSums:
    """The running sums of one update's micro-batches (``--accumulate``), carried from one
    ``add_micro_batch`` to the next: float32 gradients of the summed token losses (a
    bfloat16 sum of K gradients would round each addition), the summed loss, the label count,
    the correct labels, and how many micro-batches were added (micro-batch j's dropout keys are
    fold_in(step key, j), as in ``accumulated_train_step``)."""

    grads: nnx.State  # float32, shaped like the parameters
    loss: jax.Array  # float32 scalar
    tokens: jax.Array  # float32 scalar: non-PAD labels
    correct: jax.Array  # int32 scalar
    micro_batches: jax.Array  # int32 scalar


def zero_gradient_sums(state: TrainState):
    """The ``GradientSums`` an update starts from: zeros shaped like ``state``'s parameters."""
    zero = jnp.zeros((), jnp.float32)
    return GradientSums(grads=_float32_zeros(state.params), loss=zero, tokens=zero,
                        correct=jnp.zeros((), jnp.int32), micro_batches=jnp.zeros((), jnp.int32))


def add_micro_batch(state: TrainState, sums: GradientSums, batch):
    """``sums`` plus one micro-batch's gradient and loss sums, pure; ``state`` is only read.
    Compiled once per micro-batch shape: the shapes a run without --accumulate compiles."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(state.config.seed), state.step), sums.micro_batches)
    grads, total, count, correct, _, _ = _micro_batch_gradients(
        state.graphdef, state.params, state.other, batch, key, state.config.label_smoothing)
    return GradientSums(grads=jax.tree.map(lambda a, g: a + g.astype(jnp.float32), sums.grads, grads),
                        loss=sums.loss + total, tokens=sums.tokens + count, correct=sums.correct + correct,
                        micro_batches=sums.micro_batches + 1)


def apply_gradient_sums(state: TrainState, sums: GradientSums):
    """The optimizer update from an update's ``GradientSums``: ``(state, sums) -> (state,
    metrics)``, pure, the same update and metrics as ``accumulated_train_step`` on the same
    micro-batches (which equals ``train_step`` on their union)."""
    return _apply_summed_gradients(state, sums.grads, sums.loss, sums.tokens, sums.correct)


def stack_batches(batches):
    """K ``Batch``es padded with PAD to one shape and stacked: a ``Batch`` of (K, B, S) and
    (K, B, T) arrays for ``accumulated_train_step``. PAD rows and columns carry no labels, but
    they cost compute and memory: micro-batches of different shapes (--max-tokens buckets) go
    to ``Trainer.accumulate`` instead, which keeps each one's own shape."""
    import numpy as np

    rows = max(b.source.shape[0] for b in batches)
    s = max(b.source.shape[1] for b in batches)
    t = max(b.target_in.shape[1] for b in batches)

    def pad(a, length):
        return np.pad(a, ((0, rows - a.shape[0]), (0, length - a.shape[1])), constant_values=PAD)

    return type(batches[0])(*(np.stack([pad(getattr(b, f), n) for b in batches])
                              for f, n in (("source", s), ("target_in", t), ("target_out", t))))
