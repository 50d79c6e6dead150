"""The exponential moving average of the parameters (``train --ema DECAY``).

After each optimizer update the average moves toward the new parameters:

    ema = d * ema + (1 - d) * params,   d = min(DECAY, (1 + n) / (10 + n))

n being the updates applied before this one. The warm-up of ``d`` is TensorFlow's
``ExponentialMovingAverage(num_updates=n)``'s (t5x and the Flax examples' EMA use it too): the
first updates count more, so the average leaves the random init behind within tens of updates
instead of 1 / (1 - DECAY). Marian's ``--exponential-smoothing`` keeps such an average for
validation and for the model it saves; here it is what the evaluation during training scores
and what ``evaluate``, ``generate`` and ``parity convert`` read (``TrainState.for_inference``).
The average is computed in float32, the parameters' dtype, inside the compiled update, and saved
in every checkpoint, so a resumed run's average is bit-identical to a run never stopped.
"""

import jax
import jax.numpy as jnp

WARMUP_OFFSET = 10.0  # d = (1 + n) / (10 + n) until it reaches DECAY: TensorFlow's


def decay_at(decay, step):
    """The decay ``d`` of the update made at ``step`` (the updates applied before it), float32."""
    n = jnp.asarray(step, jnp.float32)
    return jnp.minimum(jnp.float32(decay), (1.0 + n) / (WARMUP_OFFSET + n))


def update(ema, params, decay, step):
    """The average after the update at ``step`` produced ``params``."""
    d = decay_at(decay, step)
    return jax.tree.map(lambda e, p: (d * e + (1.0 - d) * p).astype(e.dtype), ema, params)
