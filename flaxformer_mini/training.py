"""Loss, optimizer and the pure, jitted train and eval steps.

The steps are pure functions of explicit state, as in Flax's examples:
``train_step(state, batch) -> (state, metrics)`` and ``eval_step(state, batch) -> sums``. The
parameters, optimizer state and step counter are ``TrainState``'s arrays; the model's
structure (its ``nnx.GraphDef``) and the optimizer are its static fields. The training loop,
the sharded step (``sharding.py``) and the benchmarks all compile these same two functions.
Gradient accumulation (``--accumulate``) is ``accumulation.py``'s, on the same loss.

Dropout keys are ``fold_in(key(seed), step)``: a step is reproducible on its own, which is
what makes a resumed run bit-identical to an uninterrupted one.
"""

import dataclasses
import functools
import itertools
import math

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flaxformer_mini.data import PAD, pad_rows
from flaxformer_mini.partitioning import path_name
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
        # `not (x > 0)` rather than `x <= 0`: NaN fails every comparison and must not slip through.
        for name in ("learning_rate", "lr_factor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if self.clip_norm is not None and not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            # clip_norm <= 0 would scale every gradient to zero (or flip its sign): use None for no clipping.
            raise ValueError(f"clip_norm must be a finite number > 0 or None (no clipping), got {self.clip_norm}")


def learning_rate_schedule(config: TrainConfig, d_model: int):
    if config.schedule == "constant":
        return optax.constant_schedule(config.learning_rate)

    def rsqrt(count):
        n = jnp.asarray(count, jnp.float32) + 1.0  # optax counts from 0, the paper from 1
        return config.lr_factor * d_model**-0.5 * jnp.minimum(n**-0.5, n * config.warmup_steps**-1.5)

    return rsqrt


@functools.cache
def make_optimizer(config: TrainConfig, d_model: int):
    """The optax optimizer of ``config``: one object per (config, width), so train states of
    equal configs carry the same static ``tx`` and share their compiled steps (a second run
    in the same process, a resumed one, an evaluation, reuse the first one's compilation)."""
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
    """Everything a train step reads and writes, as one pytree.

    The arrays (step, parameters, optimizer state, dropout RNG state) are its leaves; the
    model's structure (one ``nnx.GraphDef`` per mode: ``model.train()``/``eval()`` change
    static attributes, so each mode is its own compiled program), the optimizer and the
    config are static fields, as ``apply_fn`` and ``tx`` are in Flax's
    ``flax.training.train_state.TrainState``. So ``train_step(state, batch)`` is a plain
    pure function that any caller can ``jax.jit`` with its own shardings.
    """

    step: jax.Array  # int32 scalar: the number of updates applied
    params: nnx.State
    opt_state: optax.OptState
    other: nnx.State  # the model's non-parameter state (dropout RNG streams)
    graphdef: nnx.GraphDef = flax.struct.field(pytree_node=False)  # train mode
    eval_graphdef: nnx.GraphDef = flax.struct.field(pytree_node=False)
    tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)
    config: TrainConfig = flax.struct.field(pytree_node=False)

    @classmethod
    def create(cls, model, config: TrainConfig):
        """A state at step 0 holding ``model``'s parameters. The arrays are copies: the
        compiled step donates its input state, which would otherwise delete ``model``'s. They
        are committed to the default device, as a restored state's are (``on_default_device``).

        An abstract model (``nnx.eval_shape``: ``jax.ShapeDtypeStruct``s for arrays) gives an
        abstract state, its shapes and dtypes alone: a template that ``checkpoint.restore``
        reads a checkpoint into, without the random init the checkpoint would overwrite."""
        was_training = _is_training(model)
        model.train()
        graphdef, params, other = nnx.split(model, nnx.Param, ...)
        model.eval()
        eval_graphdef = nnx.graphdef(model)
        if was_training:
            model.train()
        tx = make_optimizer(config, model.config.embed_size)
        if is_abstract(params):
            step, opt_state = jax.ShapeDtypeStruct((), jnp.int32), jax.eval_shape(tx.init, params)
        else:
            params, other = jax.tree.map(jnp.copy, (params, other))
            step, opt_state = jnp.zeros((), jnp.int32), tx.init(params)
            # Laid out as a restored state is (on_default_device says why).
            step, params, opt_state, other = on_default_device((step, params, opt_state, other))
        return cls(step=step, params=params, opt_state=opt_state, other=other,
                   graphdef=graphdef, eval_graphdef=eval_graphdef, tx=tx, config=config)

    def model(self, train=False):
        """A live model holding this state's parameters (for decoding, saving, inspection)."""
        return nnx.merge(self.graphdef if train else self.eval_graphdef, self.params, self.other)


def default_device():
    """Where ``jnp`` puts a new array: ``jax_default_device`` (a device, or a platform's name)
    or else this process's first device."""
    device = jax.config.jax_default_device or jax.local_devices()[0]
    return jax.local_devices(backend=device)[0] if isinstance(device, str) else device


def on_default_device(tree):
    """``tree``'s arrays committed to the default device, where orbax restores a checkpoint's
    (``checkpoint.restore``). A fresh state is so laid out as a restored one: jit keys its
    compiled programs on whether each argument is committed to a device (``jnp`` makes arrays
    uncommitted, a restore commits them), and each step compiled for a fresh state compiled
    again for a restored one in the same process (a resume, ``evaluate`` after ``train``, a
    notebook): 3-5 s each time for the tiny preset's train step (AMD EPYC family 25 model 1,
    the tests' XLA flags). The arrays keep their buffers: nothing is copied."""
    return jax.device_put(tree, default_device())


def is_abstract(tree):
    """Whether ``tree`` holds shapes (``jax.ShapeDtypeStruct``, as ``jax.eval_shape`` and
    ``nnx.eval_shape`` give) rather than arrays."""
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))


def fresh_streams(other, seed):
    """``other`` (a state's dropout streams) with each abstract key and counter made
    concrete, on the default device: each stream a key of its own from ``seed``, counters 0.
    Their values carry nothing: every train step reseeds every stream from (seed, step)
    (``reseed_dropout``) and eval mode draws none, which is also why checkpoints leave them
    out. Another kind of variable left abstract is a ValueError naming it: zeros would be
    wrong for it, and no checkpoint holds it."""
    key = jax.random.key(seed)
    index = itertools.count()

    def concrete(path, v):
        if not isinstance(v.get_value(), jax.ShapeDtypeStruct):
            return v
        x = v.get_value()
        if isinstance(v, nnx.RngKey):
            # A key of its own for every stream, as the init forks them: one mask per layer in
            # a train-mode call that does not reseed (parity's twins); one per layer again in a
            # stacked (scanned) stream. And an array of its own: the train step donates the
            # state, and XLA refuses to donate one buffer twice.
            return v.replace(jax.random.split(jax.random.fold_in(key, next(index)), x.shape))
        if isinstance(v, nnx.RngCount):
            return v.replace(jnp.zeros(x.shape, x.dtype))
        raise ValueError(f"{path_name(path)}: a {type(v).__name__} with shapes only: neither a dropout stream, made "
                         f"fresh, nor in a checkpoint")

    return jax.tree_util.tree_map_with_path(concrete, other, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _is_training(model):
    return any(not m.deterministic for _, m in nnx.iter_modules(model) if isinstance(m, nnx.Dropout))


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
    metrics = {
        "loss": loss,
        "tokens": count,
        "token_accuracy": correct.astype(jnp.float32) / jnp.maximum(count, 1.0),
        "grad_norm": optax.tree.norm(grads),
        "learning_rate": learning_rate_schedule(state.config, model.config.embed_size)(state.step),
    }
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(state: TrainState, batch):
    """Teacher-forced sums over one batch, pure: summed loss, label count, correct labels."""
    model = state.model()
    logits = model(batch.source, batch.target_in)
    _, (total, count) = token_cross_entropy(logits, batch.target_out)
    return {"loss_sum": total, "tokens": count, "correct": correct_tokens(logits, batch.target_out)}


def check_batch(batch, model_config):
    """Host-side checks before a batch enters compiled code (JAX would not raise)."""
    c = model_config
    check_tokens(batch.source, c.source_vocab_size, c.max_len, "batch.source")
    check_tokens(batch.target_in, c.target_vocab_size, c.max_len, "batch.target_in")
    check_tokens(batch.target_out, c.target_vocab_size, c.max_len, "batch.target_out")
    check_same_batch(batch.source, batch.target_in)
    if batch.target_in.shape != batch.target_out.shape:
        raise ValueError(f"target_in {batch.target_in.shape} and target_out {batch.target_out.shape} differ in shape")


# The accumulation steps live in accumulation.py (which imports this module); their names are
# this module's too, as they were before it was split out, imported on first use (PEP 562).
_ACCUMULATION = ("GradientSums", "accumulated_train_step", "add_micro_batch", "apply_gradient_sums",
                 "stack_batches", "zero_gradient_sums")


def __getattr__(name):
    if name in _ACCUMULATION:
        from flaxformer_mini import accumulation

        return getattr(accumulation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        from flaxformer_mini.accumulation import accumulated_train_step, add_micro_batch, apply_gradient_sums

        self.config = config
        self.model_config = model.config
        self.lr_schedule = learning_rate_schedule(config, model.config.embed_size)
        self._template = TrainState.create(model, config)
        self.train_step = jax.jit(train_step, donate_argnums=0)
        self.accumulated_train_step = jax.jit(accumulated_train_step, donate_argnums=0)
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

    def accumulate(self, state, micro_batches, place=None):
        """One optimizer update from ``micro_batches`` (K ``Batch``es, each of its own shape):
        ``(state, metrics)``, the update ``train_step`` makes on their union.

        Each micro-batch goes through ``add_micro_batch`` in its own shape, so a --max-tokens
        budget holds for every one of them and the compiled shapes are the ones a run
        without --accumulate compiles; ``stack_batches`` would pad all K to the most rows and
        the longest lengths among them (up to K times the budget in rows, and a compiled
        shape per combination of shapes). ``place(batch)`` puts a checked micro-batch on the
        devices (``sharding.shard_batch`` on a mesh)."""
        sums = self._zeros_for(state)(state)
        for batch in micro_batches:
            sums = self.add_micro_batch(state, sums, batch if place is None else place(batch))
        return self.apply_gradient_sums(state, sums)

    def _zeros_for(self, state):
        """``zero_gradient_sums`` compiled to lay the sums out as ``state``'s parameters are.

        The layout is pinned where the state's is committed (a mesh's NamedShardings, or one
        device: ``on_default_device``): zeros depend on no input, so they would come out
        uncommitted, and ``add_micro_batch``, whose output follows the committed state, would
        compile again for the sums it returns (jit keys its cache on the layout and on being
        committed). A state of uncommitted arrays (made by hand) gets unpinned zeros, so that
        its update does not commit it either."""
        from flaxformer_mini.accumulation import GradientSums, zero_gradient_sums

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

    def evaluate(self, state, batches):
        """Teacher-forced loss and token accuracy over ``batches`` (summed, then divided); a
        last batch smaller than the first is padded to its size (``data.pad_rows``)."""
        total = count = correct = 0.0
        rows = None
        for batch in batches:
            check_batch(batch, self.model_config)
            rows = rows or len(batch.source)
            m = jax.device_get(self.eval_step(state, pad_rows(batch, rows)))
            total, count, correct = total + m["loss_sum"], count + m["tokens"], correct + m["correct"]
        return {"loss": float(total / max(count, 1.0)), "token_accuracy": float(correct / max(count, 1.0))}

    def model(self, state, train=False):
        """A live model holding ``state``'s parameters (for decoding, saving, inspection)."""
        return state.model(train)
