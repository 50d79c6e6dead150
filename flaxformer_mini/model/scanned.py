"""Scanned layers: L identical blocks held as one block whose variables carry a leading layer
axis, run with ``nnx.scan``, so XLA compiles one block body whatever the depth; and
activation rematerialisation (``nnx.remat``) around the block body.

The default model keeps one module per layer in an ``nnx.List`` (paths
``encoder/transformer_layers/0/attention/W_q/kernel``, torch's indices). With
``scan_layers=True`` the list becomes one stacked block at the same place, without the index:

    encoder/transformer_layers/attention/W_q/kernel    (L, D, D)   slice i = layer i's (D, D)
    decoder/decoder_layers/transformer_block/norm1/scale   (L, D)

``parity`` still reads and writes torch's per-layer keys (``encoder.transformer_layers.{i}...``):
its rule table declares these two lists as stackable (``parity.rules.STACKS``) and the engine
slices or stacks axis 0. The stacked block is built the way Flax's docs build one ("scan over
layers", ``nnx.scan``'s docstring): ``nnx.split_rngs`` gives every layer its own keys (its own
initial values, and its own dropout masks), then ``nnx.vmap`` calls the block's constructor
once per key. The layers' initial values therefore differ from the unscanned model's built
from the same seed; loaded with the same weights, the two compute the same numbers.

Rematerialisation (``remat=True``) wraps each block's forward in ``nnx.remat``
(``jax.checkpoint``): the backward pass recomputes a block's activations from its input
instead of keeping them, trading about one more forward pass for memory that does not grow
with L x (activations of one block). ``remat_policy``, a ``jax.checkpoint`` policy
(``jax.checkpoint_policies.dots_saveable``, ...), chooses what each block keeps all the same;
None keeps nothing but the block's input (``jax.checkpoint``'s default).

Like every nnx transform, ``nnx.scan`` refuses Variables made at another trace level: trace a
scanned model through nnx's own transforms (``nnx.jit``, ``nnx.value_and_grad``), or merge it
inside the traced function from (graphdef, state) arguments; a state closed over from outside
a ``jax.grad`` or a loop body needs ``nnx.merge(..., copy=True)`` (decode/search.py does this).

Shapes: L layers, and the model's legend (``flaxformer_mini/__init__.py``).
"""

import jax
import jax.numpy as jnp
from flax import nnx

# Parameters may carry logical sharding names (nnx.with_partitioning); a stacked variable
# gains an axis those names do not cover. None: the layer axis is not sharded (every device
# holds every layer), and nnx inserts/removes that None as it stacks and slices.
_LAYER_AXIS_METADATA = {nnx.PARTITION_NAME: None}


def stack(make_block, num_layers, rngs: nnx.Rngs):
    """One block built by ``make_block(rngs)`` with every variable stacked L times along a
    new axis 0, each layer from its own split of ``rngs`` (the RNG streams' own keys are
    stacked too, so each layer's dropout draws its own masks)."""

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, axis_size=num_layers, transform_metadata=_LAYER_AXIS_METADATA)
    def build(rngs):
        return make_block(rngs)

    return build(rngs)


def apply(blocks, x, call, *, scan, remat, remat_policy=None):
    """``x`` through every block in order: ``x = call(block, x)`` per layer.

    ``blocks``: an ``nnx.List`` of blocks (``scan=False``) or one stacked block from ``stack``
    (``scan=True``, run by ``nnx.scan`` over axis 0, carrying ``x``). ``call`` may close over
    arrays every layer reads (masks, the encoder output). ``remat``: recompute each block's
    activations in the backward pass instead of keeping them, but for what ``remat_policy``
    (a ``jax.checkpoint`` policy; None: nothing) lets it keep.
    """
    # prevent_cse=False under scan: the loop already keeps XLA from merging the recomputation
    # with the forward pass (jax.checkpoint's docs), and CSE barriers would slow the body.
    body = nnx.remat(call, prevent_cse=not scan, policy=remat_policy) if remat else call
    if not scan:
        for block in blocks:
            x = body(block, x)
        return x

    def step(x, block):
        return body(block, x)

    scanned = nnx.scan(step, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry, transform_metadata=_LAYER_AXIS_METADATA)
    return scanned(x, blocks)


def per_layer(blocks, fn, *, scan):
    """``[fn(block) for block in blocks]`` stacked along a new axis 0: outputs of shape
    (L, ...). Stacked blocks are mapped with ``nnx.vmap`` (one traced body)."""
    if scan:
        return nnx.vmap(fn, in_axes=0, out_axes=0, transform_metadata=_LAYER_AXIS_METADATA)(blocks)
    outs = [fn(block) for block in blocks]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
