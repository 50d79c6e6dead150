"""``TrainState``: everything a train step reads and writes, as one pytree, and where its
arrays live (the default device; abstract shapes for a template to restore into)."""

import itertools

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flaxformer_mini.model.config import ModelConfig
from flaxformer_mini.model.paths import path_name
from flaxformer_mini.train.optimizer import TrainConfig, make_optimizer


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
    # The parameters' exponential moving average (``config.ema_decay``; ema.py), or None.
    ema: nnx.State | None = None

    @classmethod
    def create(cls, model, config: TrainConfig):
        """A state at step 0 holding ``model``'s parameters. The arrays are copies: the
        compiled step donates its input state, which would otherwise delete ``model``'s. They
        are committed to the default device, as a restored state's are (``on_default_device``).

        An abstract model (``nnx.eval_shape``: ``jax.ShapeDtypeStruct``s for arrays) gives an
        abstract state, its shapes and dtypes alone: a template that ``checkpoint.restore``
        reads a checkpoint into, without the random init the checkpoint would overwrite."""
        check_model_and_config(model, config, "TrainState.create")
        was_training = _is_training(model)
        model.train()
        graphdef, params, other = nnx.split(model, nnx.Param, ...)
        model.eval()
        eval_graphdef = nnx.graphdef(model)
        if was_training:
            model.train()
        tx = make_optimizer(config, model.config.embed_size)
        # The moving average (--ema) starts at the initial parameters.
        if is_abstract(params):
            step, opt_state = jax.ShapeDtypeStruct((), jnp.int32), jax.eval_shape(tx.init, params)
            ema = None if config.ema_decay is None else params
        else:
            params, other = jax.tree.map(jnp.copy, (params, other))
            step, opt_state = jnp.zeros((), jnp.int32), tx.init(params)
            # Arrays of their own: the step donates the state, and XLA refuses to donate one buffer twice.
            ema = None if config.ema_decay is None else jax.tree.map(jnp.copy, params)
            # Laid out as a restored state is (on_default_device says why).
            step, params, opt_state, other, ema = on_default_device((step, params, opt_state, other, ema))
        return cls(step=step, params=params, opt_state=opt_state, other=other,
                   graphdef=graphdef, eval_graphdef=eval_graphdef, tx=tx, config=config, ema=ema)

    def model(self, train=False):
        """A live model holding this state's parameters (for decoding, saving, inspection)."""
        return nnx.merge(self.graphdef if train else self.eval_graphdef, self.params, self.other)

    def for_inference(self):
        """The state whose parameters evaluation and decoding read: the moving average in place
        of the parameters where the run keeps one (``--ema``), else this state. Without its
        optimizer state and average: what decoding never reads, it does not hold."""
        params = self.params if self.ema is None else self.ema
        return self.replace(params=params, opt_state=None, ema=None)


def check_model_and_config(model, config, who):
    """A TypeError naming ``who``'s wrong argument: a model (a Transformer) and a ``TrainConfig``
    are read field by field, and a ModelConfig or a dict in their place fails with an
    AttributeError or "unhashable type" naming neither."""
    if not isinstance(getattr(model, "config", None), ModelConfig):
        hint = " (build one: Transformer.from_config(config, rngs=nnx.Rngs(0)))" if isinstance(model, ModelConfig) else ""
        raise TypeError(f"{who} takes a model (a Transformer), got {type(model).__name__}{hint}")
    if not isinstance(config, TrainConfig):
        raise TypeError(f"{who}'s config must be a TrainConfig, got {type(config).__name__}")


def check_state(state, name, made_by="Trainer.init_state() or TrainState.create(model, TrainConfig())"):
    """A TrainState, or a TypeError naming the argument (``name``, as "train_step's state"),
    where one comes from (``made_by``) and what came instead (a model, a Trainer): the steps
    and the checkpoints read its fields, and neither an AttributeError from inside a trace
    nor orbax's errors name any of this."""
    if not isinstance(state, TrainState):
        raise TypeError(f"{name} must be a TrainState ({made_by}), got {type(state).__name__}")


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
    notebook), seconds each time. The arrays keep their buffers: nothing is copied."""
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
