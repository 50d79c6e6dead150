"""Seed 001's seq2seq Transformer in Flax NNX, twin of ``torch_ref/model.py``.

Masks are keep-masks (True = attend): the source mask (B, 1, 1, S) hides padding, the
target mask (B, 1, T, T) is causal.
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_mini.model import scanned
from flaxformer_mini.model.axes import EMBED, LENGTH, VOCAB
from flaxformer_mini.model.config import ModelConfig
from flaxformer_mini.model.layers import DecoderBlock, TransformerBlock
from flaxformer_mini.model.primitives import SharedEmbedding, TiedLinear, embedding, linear
from flaxformer_mini.model.signature import ConstructorSignature
from flaxformer_mini.model.token_checks import check_same_batch, check_tokens


def _positions(B, T):
    # (B, T) like the seed's torch.arange(T).expand(B, T): the embedding outputs then have the
    # same (B, T, D) shape in both twins, which the parity harness compares.
    return jnp.broadcast_to(jnp.arange(T), (B, T))


def _checked_policy(remat, remat_policy):
    """``remat_policy`` if it can apply: a policy without ``remat`` would be silently ignored."""
    if remat_policy is not None and not remat:
        raise ValueError("remat_policy chooses what a rematerialised block keeps: it needs remat=True")
    if remat_policy is not None and not callable(remat_policy):
        raise TypeError(f"remat_policy must be a jax.checkpoint policy (a callable, e.g. "
                        f"jax.checkpoint_policies.dots_saveable), got {remat_policy!r}")
    return remat_policy


def _blocks(make_block, num_layers, rngs, scan_layers):
    """The layer list: one block per layer in an ``nnx.List`` (torch's indices in the paths),
    or with ``scan_layers`` one stacked block (``scanned.stack``)."""
    if scan_layers:
        return scanned.stack(make_block, num_layers, rngs)
    return nnx.List([make_block(rngs) for _ in range(num_layers)])


class Encoder(nnx.Module):
    """Token embedding + learned position embedding, dropout, then ``num_layers`` blocks.
    ``ffn_dim``: the blocks' feed-forward width F; None keeps the seed's F = D.
    ``scan_layers``, ``remat``, ``remat_policy``: as in ``Transformer``."""

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, num_embeddings, max_len, embed_size, heads, num_layers, dropout, *,
                 ffn_dim=None, dtype=None, param_dtype=jnp.float32, scan_layers=False, remat=False,
                 remat_policy=None, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.num_embeddings = num_embeddings
        self.max_len = max_len
        self.scan_layers, self.remat, self.remat_policy = scan_layers, remat, _checked_policy(remat, remat_policy)
        self.embedding_layer = embedding(num_embeddings, embed_size, axes=(VOCAB, EMBED), **kw)
        self.positional_encoding = embedding(max_len, embed_size, axes=(LENGTH, EMBED), **kw)
        self.transformer_layers = _blocks(
            lambda rngs: TransformerBlock(embed_size, heads, dropout, ffn_dim=ffn_dim, dtype=dtype,
                                          param_dtype=param_dtype, rngs=rngs),
            num_layers, rngs, scan_layers)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, input, mask, *, check_inputs=True):
        # check_inputs=False: the caller (Transformer) has checked ``input`` already.
        if check_inputs:
            check_tokens(input, self.num_embeddings, self.max_len, "source input")
        B, S = input.shape
        out = self.dropout(self.embedding_layer(input) + self.positional_encoding(_positions(B, S)))
        return scanned.apply(self.transformer_layers, out, lambda block, x: block(x, x, x, mask),
                             scan=self.scan_layers, remat=self.remat, remat_policy=self.remat_policy)  # (B, S, D)


class Decoder(nnx.Module):
    """Target embedding + positions, ``num_layers`` decoder blocks, projection to V logits.
    ``ffn_dim``, ``scan_layers``, ``remat``, ``remat_policy`` as in Encoder. ``tie_output=True``:
    the projection's weight is the embedding table (``TiedLinear``; its bias stays its own), as
    torch_ref's ``fc.weight = embedding_layer.weight``; the state then has no ``fc/kernel``."""

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, target_vocab_size, max_len, embed_size, heads, num_layers, dropout, *,
                 ffn_dim=None, dtype=None, param_dtype=jnp.float32, scan_layers=False, remat=False,
                 remat_policy=None, tie_output=False, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.target_vocab_size = target_vocab_size
        self.max_len = max_len
        self.scan_layers, self.remat, self.remat_policy = scan_layers, remat, _checked_policy(remat, remat_policy)
        self.embedding_layer = embedding(target_vocab_size, embed_size, axes=(VOCAB, EMBED), **kw)
        self.positional_embedding = embedding(max_len, embed_size, axes=(LENGTH, EMBED), **kw)
        self.decoder_layers = _blocks(
            lambda rngs: DecoderBlock(embed_size, heads, dropout, ffn_dim=ffn_dim, dtype=dtype,
                                      param_dtype=param_dtype, rngs=rngs),
            num_layers, rngs, scan_layers)
        fc = linear(embed_size, target_vocab_size, axes=(EMBED, VOCAB), **kw)
        # Tied, the kernel just drawn is dropped: drawn all the same, as torch draws its Linear's
        # weight before the tie replaces it, so every other initial value is the untied model's.
        self.fc = TiedLinear(self.embedding_layer, fc.bias, dtype=dtype) if tie_output else fc
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, input, enc_out, source_mask, target_mask, *, check_inputs=True):
        if check_inputs:  # False: checked by the caller (Transformer)
            check_tokens(input, self.target_vocab_size, self.max_len, "target input")
        B, T = input.shape
        x = self.dropout(self.embedding_layer(input) + self.positional_embedding(_positions(B, T)))
        x = scanned.apply(self.decoder_layers, x,
                          lambda layer, x: layer(x, enc_out, enc_out, source_mask, target_mask),
                          scan=self.scan_layers, remat=self.remat, remat_policy=self.remat_policy)
        # Logits, no softmax: the loss applies log-softmax itself.
        return self.fc(x)  # (B, T, V)


class Transformer(nnx.Module):
    """Seed 001's encoder-decoder. ``model(source_input, target_input)`` -> logits (B, T, V).

    ``dtype`` is the compute dtype (e.g. ``jnp.bfloat16``), ``param_dtype`` the dtype the
    parameters are stored in; softmax and LayerNorm statistics stay in float32. ``ffn_dim``
    is the feed-forward width F of every block; None keeps the seed's F = D (the paper's base
    model has D = 512, F = 2048).

    ``scan_layers=True`` holds each side's blocks as one stacked block run by ``nnx.scan``
    (compile time flat in depth; parameter paths without the layer index, a leading L axis
    instead: ``flaxformer_mini/model/scanned.py``). ``remat=True`` recomputes each block's
    activations in the backward pass (``nnx.remat``) instead of keeping them. Both default to
    off: the seed's model, paths and initial values. ``remat_policy`` (with ``remat=True``
    only): a ``jax.checkpoint`` policy saying what each block keeps for the backward pass all
    the same (``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``: its matmuls'
    outputs); None keeps nothing but the block's input. It changes no parameter.

    ``tie_embeddings`` (``ModelConfig.tie_embeddings``): None, the default, is the seed's model,
    every table its own. ``"decoder"``: the output projection's weight is the target embedding
    table (fairseq's ``--share-decoder-input-output-embed``); ``"all"``: the source embedding
    is that table too (``--share-all-embeddings``; needs one vocabulary for both sides, of one
    size). The one table is ``decoder/embedding_layer/embedding``; the state has no
    ``decoder/fc/kernel`` (and, with "all", no ``encoder/embedding_layer/embedding``), which
    torch_ref's twin holds as the same tensor under its own keys. The tables a tie drops are
    drawn all the same, so every other initial value is the untied model's of the same seed.
    """

    __signature__ = ConstructorSignature()  # help(cls): the constructor's arguments

    def __init__(self, src_pad_idx, source_vocab_size, target_vocab_size, max_len, embed_size, heads,
                 num_layers, dropout, *, ffn_dim=None, tie_embeddings=None, dtype=None, param_dtype=jnp.float32,
                 scan_layers=False, remat=False, remat_policy=None, rngs: nnx.Rngs):
        if not isinstance(rngs, nnx.Rngs):  # flax's own error, deep in a layer, names no argument
            raise TypeError(f"rngs must be an nnx.Rngs (e.g. rngs=nnx.Rngs(0)), got {type(rngs).__name__}")
        # Validates the arguments (divisible heads, pad id inside the vocabulary, ...).
        self.config = ModelConfig(src_pad_idx, source_vocab_size, target_vocab_size, max_len,
                                  embed_size, heads, num_layers, dropout, ffn_dim=ffn_dim,
                                  tie_embeddings=tie_embeddings)
        self.src_pad_idx = src_pad_idx
        self.scan_layers, self.remat = scan_layers, remat
        kw = dict(ffn_dim=ffn_dim, dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers, remat=remat,
                  remat_policy=remat_policy, rngs=rngs)
        self.encoder = Encoder(source_vocab_size, max_len, embed_size, heads, num_layers, dropout, **kw)
        self.decoder = Decoder(target_vocab_size, max_len, embed_size, heads, num_layers, dropout,
                               tie_output=tie_embeddings is not None, **kw)
        if tie_embeddings == "all":
            # The decoder's table, looked up by the encoder: NNX holds a module reachable by two
            # paths once, under the first in its (sorted) traversal, decoder/ before encoder/.
            self.encoder.embedding_layer = SharedEmbedding(self.decoder.embedding_layer)

    @classmethod
    def from_config(cls, config: ModelConfig, *, dtype=None, param_dtype=jnp.float32, scan_layers=False,
                    remat=False, remat_policy=None, rngs: nnx.Rngs):
        """The model of ``config`` (a ``ModelConfig``: ``get_preset(name)``, or its ``replace``)."""
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig (get_preset('tiny'), or ModelConfig(**d) from a dict), "
                            f"got {type(config).__name__}")
        return cls(**config.to_dict(), dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers, remat=remat,
                   remat_policy=remat_policy, rngs=rngs)

    @classmethod
    def abstract(cls, config: ModelConfig, *, dtype=None, param_dtype=jnp.float32, scan_layers=False, remat=False,
                 remat_policy=None):
        """The model of ``config`` with ``jax.ShapeDtypeStruct``s in place of arrays, as
        ``nnx.eval_shape`` of ``from_config`` gives it: what a checkpoint or a converted state dict
        is loaded into. Its RNG streams are shapes too, so it takes no seed. Each call returns a
        model of its own; the init is traced once per process for each set of arguments
        (``_abstract_parts``)."""
        graphdef, state = _abstract_parts(cls, config, dtype, param_dtype, scan_layers, remat, remat_policy)
        return nnx.merge(graphdef, state, copy=True)

    def create_source_mask(self, source_input):
        return (source_input != self.src_pad_idx)[:, None, None, :]  # (B, 1, 1, S)

    def create_target_mask(self, target_input):
        B, T = target_input.shape
        return jnp.tril(jnp.ones((B, 1, T, T), dtype=jnp.bool_))  # (B, 1, T, T), causal

    def check_has_arrays(self):
        """A ValueError when the model holds shapes, not arrays (``abstract``, ``nnx.eval_shape``):
        JAX's own errors there name a ShapeDtypeStruct deep in a layer, not the model's state."""
        if isinstance(self.decoder.embedding_layer.embedding.get_value(), jax.ShapeDtypeStruct):
            raise ValueError("this Transformer holds shapes, not arrays (Transformer.abstract or nnx.eval_shape): "
                             "load weights into it first (parity.torch_to_flax(state_dict, model), nnx.update(model, "
                             "state)), or build one with arrays: Transformer.from_config(config, rngs=nnx.Rngs(0))")

    def encode(self, source_input, *, check_inputs=True):
        """Encoder output (B, S, D) and the source mask (B, 1, 1, S). ``check_inputs=False``
        skips the token check, for a caller that has checked ``source_input`` already."""
        self.check_has_arrays()
        if check_inputs:
            check_tokens(source_input, self.config.source_vocab_size, self.config.max_len, "source input")
        source_input = jnp.asarray(source_input)
        source_mask = self.create_source_mask(source_input)
        return self.encoder(source_input, source_mask, check_inputs=False), source_mask

    def __call__(self, source_input, target_input):
        """Logits (B, T, V) for source ids (B, S) and target ids (B, T) (``Batch.source`` and
        ``Batch.target_in``), each checked first: integer ids inside the vocabulary, at most
        ``max_len`` long, one batch size."""
        # Both inputs are checked here, once each, before any layer runs (the encoder would
        # otherwise run on a batch whose target is unusable); the submodules do not check again.
        self.check_has_arrays()
        c = self.config
        check_tokens(source_input, c.source_vocab_size, c.max_len, "source input")
        check_tokens(target_input, c.target_vocab_size, c.max_len, "target input")
        source_input, target_input = jnp.asarray(source_input), jnp.asarray(target_input)
        check_same_batch(source_input, target_input)
        enc_out, source_mask = self.encode(source_input, check_inputs=False)
        target_mask = self.create_target_mask(target_input)
        return self.decoder(target_input, enc_out, source_mask, target_mask, check_inputs=False)


@functools.lru_cache(maxsize=16)
def _abstract_parts(cls, config, dtype, param_dtype, scan_layers, remat, remat_policy):
    """(graphdef, state of shapes) of ``cls.abstract``'s arguments. Tracing the random init
    under ``nnx.eval_shape`` costs more than merging a kept copy, the more so the deeper the
    model, and one process builds the same abstract model again and again (a run's steps, each
    restore of its checkpoints, each conversion of a state dict)."""
    model = nnx.eval_shape(lambda: cls.from_config(config, dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers,
                                                   remat=remat, remat_policy=remat_policy, rngs=nnx.Rngs(0)))
    return nnx.split(model)
