"""flaxformer-mini: a Flax NNX port of a from-scratch PyTorch seq2seq Transformer.

Every module of the seed tutorials has a twin here with the same class name, constructor
arguments (plus a keyword-only ``rngs: nnx.Rngs``) and call signature as in ``torch_ref``,
and parameter paths that mirror the torch ``state_dict`` keys
(``encoder.transformer_layers.0.attention.W_q.weight`` <-> ``encoder/transformer_layers/0/attention/W_q/kernel``).

Shape legend, used in comments and einsum strings across the project:

    B  batch                 D  model width (embed_size, d_model)
    S  source (key) length   H  attention heads
    T  target (query) length K  head width (D // H)
    V  vocabulary            F  feed-forward width
    L  layers (a stacked axis: decoding caches, scanned blocks)
    N  decoded positions (a decoding cache's length, max new tokens)

This package never imports torch, torch_ref or parity: a TPU user needs no PyTorch.

From Python (the command line, ``flaxformer-mini train``, is docs/cli.md's), a model of the
tiny preset (one layer a side, quick to compile) and batches of a synthetic task whose ids fit
both of its vocabularies (23 source, 19 target ids):

    >>> from flax import nnx
    >>> import flaxformer_mini as fm
    >>> from flaxformer_mini.data import SyntheticTask
    >>> config = fm.get_preset("tiny").replace(num_layers=1)
    >>> model = fm.Transformer.from_config(config, rngs=nnx.Rngs(0))
    >>> task = SyntheticTask("copy", vocab_size=config.target_vocab_size, min_len=2, max_len=8)
    >>> batch = task.batch(seed=0, step=0, batch_size=4)  # a data.Batch: source, target_in, target_out
    >>> model(batch.source, batch.target_in).shape  # logits (B, T, V)
    (4, 9, 19)

Training: a ``Trainer`` compiles ``train.step.train_step``, a pure function of a ``TrainState``
(parameters, optimizer state, step) and a batch, and checks each batch on the host first:

    >>> from flaxformer_mini.train.optimizer import TrainConfig
    >>> from flaxformer_mini.train.trainer import Trainer
    >>> trainer = Trainer(model, TrainConfig(schedule="constant", learning_rate=1e-3))
    >>> state = trainer.init_state()
    >>> for step in range(3):
    ...     state, metrics = trainer.step(state, task.batch(seed=0, step=step, batch_size=4))
    >>> int(state.step), sorted(metrics)
    (3, ['grad_norm', 'learning_rate', 'loss', 'token_accuracy', 'tokens'])

Decoding the trained parameters (``state.model()``, in eval mode): greedy, beam search, sampling:

    >>> from flaxformer_mini.decode.search import beam_search, greedy_decode, sample
    >>> trained = state.model()
    >>> greedy_decode(trained, batch.source, max_new_tokens=9).shape  # EOS included, PAD after it
    (4, 9)
    >>> tokens, scores = beam_search(trained, batch.source, 9, beam_size=2)
    >>> tokens.shape, scores.shape  # best beam first
    ((4, 2, 9), (4, 2))
    >>> sample(trained, batch.source, 9, temperature=0.8, top_k=5, seed=1).shape
    (4, 9)

Checkpoints (orbax, rotating): saved from a state, restored into the trainer's template:

    >>> import tempfile
    >>> from flaxformer_mini.train import checkpoint
    >>> manager = checkpoint.open_manager(tempfile.mkdtemp())
    >>> checkpoint.save(manager, state)  # returns the step saved
    3
    >>> int(checkpoint.restore(manager, trainer.state_template()).step)
    3

A ``torch_ref`` model's state dict loads into the twin through ``parity.torch_to_flax(state_dict,
model)`` (README.md, "A short tour"; docs/porting.md). A whole training run, its directory, its
evaluation and text generation: ``flaxformer_mini.runs.run.Run`` (its docstring starts one),
``flaxformer_mini.runs.fit.fit``, ``flaxformer_mini.runs.generate`` and ``flaxformer_mini.runs.evaluate``.
"""

from flaxformer_mini.lazy_exports import lazy_exports

# Names are imported on first use (lazy_exports.py): `flaxformer-mini --help` and an
# option's error answer without importing JAX and Flax (seconds), while `from flaxformer_mini
# import Transformer` works as usual.
_EXPORTS = {
    "MASK_FILL_VALUE": "flaxformer_mini.model.attention",
    "MultiHeadAttention": "flaxformer_mini.model.attention",
    "MultiHeadSelfAttention": "flaxformer_mini.model.attention",
    "PerHeadSelfAttention": "flaxformer_mini.model.attention",
    "SelfAttention": "flaxformer_mini.model.attention",
    "scaled_dot_product_attention": "flaxformer_mini.model.attention",
    "set_attention_impl": "flaxformer_mini.model.attention",
    "PRESETS": "flaxformer_mini.model.config",
    "ModelConfig": "flaxformer_mini.model.config",
    "get_preset": "flaxformer_mini.model.config",
    "DecoderBlock": "flaxformer_mini.model.layers",
    "FeedForward": "flaxformer_mini.model.layers",
    "LearnedPositionalEncoding": "flaxformer_mini.model.layers",
    "TransformerBlock": "flaxformer_mini.model.layers",
    "Decoder": "flaxformer_mini.model.transformer",
    "Encoder": "flaxformer_mini.model.transformer",
    "Transformer": "flaxformer_mini.model.transformer",
    "LAYER_NORM_EPS": "flaxformer_mini.model.primitives",
    "check_tokens": "flaxformer_mini.model.token_checks",
    "checked": "flaxformer_mini.model.token_checks",
    "traced_checks": "flaxformer_mini.model.token_checks",
}

__version__ = "0.1.0"

__all__ = sorted(_EXPORTS)


# The library's floors (docs/design.md), as attributes too: help(fm.train) in a REPL.
_SUBPACKAGES = ("data", "decode", "model", "runs", "scale", "train")

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), _SUBPACKAGES)
