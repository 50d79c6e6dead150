"""The pure train and eval steps: ``train_step(state, batch) -> (state, metrics)`` and
``eval_step(state, batch) -> sums``, as in Flax's examples.

They are plain functions of a ``TrainState`` (state.py): the training loop (``Trainer``), the
sharded loop and the benchmarks all compile these same two functions. Gradient accumulation
(``--accumulate``) is ``accumulation.py``'s, on the same loss.

Dropout keys are ``fold_in(key(seed), step)``: a step is reproducible on its own, which is
what makes a resumed run bit-identical to an uninterrupted one.
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flaxformer_mini.data import Batch
from flaxformer_mini.model.token_checks import check_same_batch, check_tokens
from flaxformer_mini.train import ema
from flaxformer_mini.train.loss import correct_tokens, token_cross_entropy
from flaxformer_mini.train.optimizer import learning_rate_schedule
from flaxformer_mini.train.state import TrainState, check_state


def _loss(model, batch, label_smoothing):
    logits = model(batch.source, batch.target_in)
    loss, (_, count) = token_cross_entropy(logits, batch.target_out, label_smoothing)
    return loss, (count, correct_tokens(logits, batch.target_out))


def reseed_dropout(model, key):
    """Reset every dropout stream from ``key``. A scalar stream gets the key as nnx.reseed
    gives it (the unscanned model's draws are unchanged); a stacked one (scanned layers, one
    key per layer) gets ``key`` split to its shape, so layers keep distinct masks."""
    nnx.reseed(model, policy="match_shape", default=key, dropout=key)


def train_step(state: TrainState, batch):
    """One optimizer update: ``(state, batch) -> (state, metrics)``, pure. Jit it (the
    ``Trainer`` does, donating the state); ``check_batch`` the batch on the host first."""
    check_state(state, "train_step's state")
    model = nnx.merge(state.graphdef, state.params, state.other)
    # Dropout keys from (seed, step) alone. Tag "default" when the model was built with
    # nnx.Rngs(seed), "dropout" when it has a dropout stream; reseed ignores absent tags.
    key = jax.random.fold_in(jax.random.key(state.config.seed), state.step)
    reseed_dropout(model, key)
    # nnx.value_and_grad differentiates the Params and lets dropout advance its RNG
    # counters inside the trace (jax.grad over merged state cannot mutate them).
    grad_fn = nnx.value_and_grad(_loss, has_aux=True)
    (loss, (count, correct)), grads = grad_fn(model, batch, state.config.label_smoothing)
    # optax mixes Python floats with its int32 step count (bias correction, schedules): run it
    # under standard promotion, so the step also traces where a user (or our tests) set
    # jax_numpy_dtype_promotion="strict" to catch silent promotions in the model.
    with jax.numpy_dtype_promotion("standard"):
        updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        learning_rate = learning_rate_schedule(state.config, model.config.embed_size)(state.step)
    metrics = {
        "loss": loss,
        "tokens": count,
        "token_accuracy": correct.astype(jnp.float32) / jnp.maximum(count, 1.0),
        "grad_norm": optax.tree.norm(grads),
        "learning_rate": learning_rate,
    }
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state, ema=averaged(state, params)), metrics


def averaged(state: TrainState, params):
    """The parameters' moving average after the update that made ``params`` (None without one)."""
    return None if state.ema is None else ema.update(state.ema, params, state.config.ema_decay, state.step)


def eval_step(state: TrainState, batch):
    """Teacher-forced sums over one batch, pure: summed loss, label count, correct labels."""
    check_state(state, "eval_step's state")
    model = state.model()
    logits = model(batch.source, batch.target_in)
    _, (total, count) = token_cross_entropy(logits, batch.target_out)
    return {"loss_sum": total, "tokens": count, "correct": correct_tokens(logits, batch.target_out)}


def check_batch(batch, model_config):
    """Host-side checks before a batch enters compiled code (JAX would not raise)."""
    missing = [name for name in Batch._fields if not hasattr(batch, name)]
    if missing:
        raise TypeError(f"a batch must be a Batch (source, target_in, target_out: data.make_batch makes one), "
                        f"got {type(batch).__name__}" + ("" if len(missing) == 3 else f" without {', '.join(missing)}"))
    c = model_config
    check_tokens(batch.source, c.source_vocab_size, c.max_len, "batch.source")
    check_tokens(batch.target_in, c.target_vocab_size, c.max_len, "batch.target_in")
    check_tokens(batch.target_out, c.target_vocab_size, c.max_len, "batch.target_out")
    check_same_batch(batch.source, batch.target_in)
    if batch.target_in.shape != batch.target_out.shape:
        raise ValueError(f"target_in {batch.target_in.shape} and target_out {batch.target_out.shape} differ in shape")
