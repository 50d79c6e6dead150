"""``Trainer``: the compiled steps for one model and one optimizer, with host-side batch checks."""

import jax
import jax.numpy as jnp

from flaxformer_mini.data import pad_rows
from flaxformer_mini.train.accumulation import GradientSums, add_micro_batch, apply_gradient_sums, zero_gradient_sums
from flaxformer_mini.train.optimizer import TrainConfig, learning_rate_schedule
from flaxformer_mini.train.state import TrainState, check_model_and_config, is_abstract
from flaxformer_mini.train.step import check_batch, eval_step, train_step


class Trainer:
    """The compiled steps for one model and one optimizer, with host-side batch checks.

    ``Trainer(model, TrainConfig(...))``: ``init_state()`` is a fresh ``TrainState``;
    ``train_step`` and ``eval_step`` are ``train_step``/``eval_step`` under ``jax.jit`` (the
    train step donates its state, so XLA updates the buffers in place); ``step`` and
    ``evaluate`` check each batch on the host first. ``accumulate`` makes one update from K
    micro-batches, each compiled in its own shape (``--accumulate``). From an abstract model
    (``nnx.eval_shape(lambda: Transformer(...))``) it compiles the same steps and makes no
    arrays: ``state_template()`` is what a checkpoint is restored into (``Run`` reads runs so),
    and ``init_state()`` is refused.
    """

    def __init__(self, model, config: TrainConfig):
        check_model_and_config(model, config, "Trainer")
        self.config = config
        self.model_config = model.config
        self.lr_schedule = learning_rate_schedule(config, model.config.embed_size)
        self._template = TrainState.create(model, config)
        self.train_step = jax.jit(train_step, donate_argnums=0)
        self.eval_step = jax.jit(eval_step)
        # --accumulate K (``accumulate``): one compiled micro-step per micro-batch shape, the
        # sums donated from one micro-batch to the next, and one compiled optimizer update.
        self.add_micro_batch = jax.jit(add_micro_batch, donate_argnums=1)
        self.apply_gradient_sums = jax.jit(apply_gradient_sums, donate_argnums=0)
        self._zero_sums = {}  # the parameters' layout -> zero_gradient_sums compiled to it

    def init_state(self):
        """A fresh state at step 0 (copies of the model's initial arrays)."""
        if is_abstract(self._template):
            raise ValueError("this Trainer was built from an abstract model (nnx.eval_shape): it has the state's "
                             "shapes (state_template(), to restore a checkpoint into) and no initial arrays; "
                             "build it from a model made with real arrays for a fresh state")
        return jax.tree.map(jnp.copy, self._template)

    def state_template(self):
        """The state's shapes and dtypes (``jax.ShapeDtypeStruct`` leaves, no arrays made):
        what ``checkpoint.restore`` reads a checkpoint into."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self._template)

    def step(self, state, batch):
        """Check ``batch`` on the host, then run the compiled train step."""
        check_batch(batch, self.model_config)
        return self.train_step(state, batch)

    def accumulate(self, state, micro_batches, stop=None):
        """One optimizer update from ``micro_batches`` (K ``Batch``es, each of its own shape,
        any iterable: drawn one at a time): ``(state, metrics)``, the update ``train_step``
        makes on their union. ``stop()``, asked between micro-batches: True abandons the update
        and returns None, ``state`` untouched (only the sums are donated), so a stop request
        is honoured within a micro-batch however many an update holds.

        Each micro-batch goes through ``add_micro_batch`` in its own shape, so a --max-tokens
        budget holds for every one of them and the compiled shapes are the ones a run
        without --accumulate compiles; stacking them into one array would pad all K to the most
        rows and the longest lengths among them (up to K times the budget in rows, and a compiled
        shape per combination of shapes). Each micro-batch is placed on the devices as given
        (``sharding.shard_batch`` on a mesh), and checked by the caller (``check_batch``)."""
        sums = self._zeros_for(state)(state)
        micro_batches = iter(micro_batches)
        for batch in micro_batches:
            sums = self.add_micro_batch(state, sums, batch)
            if stop is not None and stop():
                if next(micro_batches, None) is None:  # that was the last: the update is whole
                    break
                return None
        return self.apply_gradient_sums(state, sums)

    def _zeros_for(self, state):
        """``zero_gradient_sums`` compiled to lay the sums out as ``state``'s parameters are.

        The layout is pinned where the state's is committed (a mesh's NamedShardings, or one
        device: ``on_default_device``): zeros depend on no input, so they would come out
        uncommitted, and ``add_micro_batch``, whose output follows the committed state, would
        compile again for the sums it returns (jit keys its cache on the layout and on being
        committed). A state of uncommitted arrays (made by hand) gets unpinned zeros, so that
        its update does not commit it either."""
        params, treedef = jax.tree.flatten(state.params)
        leaves = [p.sharding for p in params] if any(p.committed for p in params) else ()
        treedef = treedef if leaves else None
        key = (treedef, tuple(leaves), state.step.sharding if leaves else None)
        if key not in self._zero_sums:
            if not leaves:
                self._zero_sums[key] = jax.jit(zero_gradient_sums)
            else:
                scalar = state.step.sharding
                shardings = GradientSums(grads=jax.tree.unflatten(treedef, leaves), loss=scalar, tokens=scalar,
                                         correct=scalar, micro_batches=scalar)
                self._zero_sums[key] = jax.jit(zero_gradient_sums, out_shardings=shardings)
        return self._zero_sums[key]

    def evaluate(self, state, batches, stop=None):
        """Teacher-forced loss and token accuracy over ``batches`` (summed, then divided); a
        last batch smaller than the first is padded to its size (``data.pad_rows``). ``stop()``,
        asked between batches: True ends the evaluation, which returns None."""
        total = count = correct = 0.0
        rows = None
        for batch in batches:
            if stop is not None and stop():
                return None
            check_batch(batch, self.model_config)
            rows = rows or len(batch.source)
            m = jax.device_get(self.eval_step(state, pad_rows(batch, rows)))
            total, count, correct = total + m["loss_sum"], count + m["tokens"], correct + m["correct"]
        return {"loss": float(total / max(count, 1.0)), "token_accuracy": float(correct / max(count, 1.0))}

    def model(self, state, train=False):
        """A live model holding ``state``'s parameters (for decoding, saving, inspection)."""
        return state.model(train)
