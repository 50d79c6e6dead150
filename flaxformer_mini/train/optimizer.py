"""Optimisation settings and the optax optimizer they make: Adam or AdamW, global-norm
clipping, and the warm-up + inverse-square-root schedule of "Attention Is All You Need" or a
warm-up + cosine decay to zero for runs of a known length."""

import dataclasses
import functools
import math
import numbers

import jax.numpy as jnp
import optax


SCHEDULES = ("rsqrt", "constant", "cosine")


# TrainConfig's numeric fields: integers, real numbers (an integer too), and those None may be.
_INTEGER_FIELDS = ("warmup_steps", "seed", "decay_steps")
_REAL_FIELDS = ("learning_rate", "lr_factor", "b1", "b2", "eps", "weight_decay", "clip_norm", "label_smoothing",
                "ema_decay")
_OPTIONAL_FIELDS = ("clip_norm", "ema_decay", "decay_steps")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. ``schedule='rsqrt'`` is the warm-up + inverse square root of
    "Attention Is All You Need": lr = factor * D^-0.5 * min(n^-0.5, n * warmup^-1.5), n = step + 1.
    ``schedule='constant'`` uses ``learning_rate`` throughout. ``schedule='cosine'`` warms up
    linearly to ``learning_rate`` over ``warmup_steps`` updates, then decays it along a half
    cosine to 0 at update ``decay_steps`` (optax.warmup_cosine_decay_schedule), and stays at 0."""

    schedule: str = "rsqrt"
    learning_rate: float = 1e-3  # schedule='constant': the rate; 'cosine': its peak
    lr_factor: float = 1.0  # for schedule='rsqrt'
    warmup_steps: int = 4000
    b1: float = 0.9
    b2: float = 0.98  # the paper's Adam betas and epsilon
    eps: float = 1e-9
    weight_decay: float = 0.0  # > 0 switches Adam to AdamW (decoupled, as torch.optim.AdamW)
    clip_norm: float | None = 1.0  # global-norm gradient clipping; None turns it off
    label_smoothing: float = 0.0
    seed: int = 0
    # An exponential moving average of the parameters, kept beside them (``ema.py``; Marian's
    # --exponential-smoothing, fairseq's --ema-decay): its decay, or None for none.
    ema_decay: float | None = None
    # schedule='cosine': the update at which the learning rate reaches 0 (a run's --steps).
    decay_steps: int | None = None

    def __post_init__(self):
        # The type first: a string ("1e-3", from a config file) would otherwise fail a comparison
        # below with Python's own message, which names no field.
        for name in (*_INTEGER_FIELDS, *_REAL_FIELDS):
            value = getattr(self, name)
            kind = numbers.Integral if name in _INTEGER_FIELDS else numbers.Real
            if (value is None and name in _OPTIONAL_FIELDS) or (isinstance(value, kind) and not isinstance(value, bool)):
                continue
            raise TypeError(f"TrainConfig.{name} must be {'an integer' if kind is numbers.Integral else 'a number'}"
                            + (" or None" if name in _OPTIONAL_FIELDS else "") + f", got {value!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {self.warmup_steps}")
        if self.schedule == "cosine" and not (isinstance(self.decay_steps, int) and self.decay_steps > self.warmup_steps):
            raise ValueError(f"schedule 'cosine' needs decay_steps (where the learning rate reaches 0) above "
                             f"warmup_steps {self.warmup_steps}, got {self.decay_steps!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        # `not (x > 0)` rather than `x <= 0`: NaN fails every comparison and must not slip through.
        for name in ("learning_rate", "lr_factor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        # torch.optim.Adam's bounds for the betas. Its eps may be 0, which this refuses: a parameter
        # whose gradient is 0 at every step so far (an embedding row no batch has used) divides 0 by 0.
        for name in ("b1", "b2"):
            if not 0 <= getattr(self, name) < 1:  # NaN fails it too
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"eps must be a finite number > 0, got {self.eps}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:  # NaN fails it too
            raise ValueError(f"ema_decay must be in (0, 1) or None (no moving average), got {self.ema_decay}")
        if self.clip_norm is not None and not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            # clip_norm <= 0 would scale every gradient to zero (or flip its sign): use None for no clipping.
            raise ValueError(f"clip_norm must be a finite number > 0 or None (no clipping), got {self.clip_norm}")


def learning_rate_schedule(config: TrainConfig, d_model: int):
    if config.schedule == "constant":
        return optax.constant_schedule(config.learning_rate)
    if config.schedule == "cosine":
        # Starts at learning_rate / warmup_steps, not 0, so the first update is not wasted.
        w = config.warmup_steps
        return optax.warmup_cosine_decay_schedule(init_value=config.learning_rate / w, peak_value=config.learning_rate,
                                                  warmup_steps=w, decay_steps=config.decay_steps, end_value=0.0)

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
