"""Build a torch twin and a Flax twin holding the same weights, and inputs to feed both."""

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

import flaxformer_mini
import torch_ref
from flaxformer_mini.train.state import fresh_streams
from parity.convert import ConversionError, torch_to_flax


def parity_numerics():
    """Numerics settings for a parity run: exact float32 matmuls on both sides.

    On TPU JAX's default matmul precision uses bfloat16 passes, and on Ampere+ GPUs TF32,
    which torch may use too. Both round the product's inputs: TF32 to 11 significant bits,
    bfloat16 to 8 (unit roundoff 2^-11 ~ 4.9e-4 and 2^-8 ~ 3.9e-3, against float32's 2^-24),
    far coarser than the 1e-5 tolerance. (No accelerator measurement of the resulting error
    is recorded here.)
    """
    jax.config.update("jax_default_matmul_precision", "highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def torch_device(name):
    """The ``torch.device`` that ``name`` names ("cpu", "cuda", "cuda:1", ...), or a ValueError
    naming it when torch cannot compute there (no such device type, no CUDA device visible, an
    index past the last device): found by placing one number there, as a twin's weights would be."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"torch device {name!r}: not a device torch knows ({e})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"torch device {name!r}: torch sees no CUDA device (torch {torch.__version__}, "
                         f"{'built with CUDA ' + torch.version.cuda if torch.version.cuda else 'a CPU-only build'})")
    if device.type == "meta":
        raise ValueError(f"torch device {name!r}: meta tensors hold shapes, not values, so there is nothing to compare")
    try:
        torch.zeros(1, device=device).add_(1)
    except (RuntimeError, AssertionError) as e:  # torch raises AssertionError for a type it was built without
        reason = str(e).split(". ")[0].splitlines()[0]  # torch's first sentence; the rest lists its backends
        raise ValueError(f"torch device {name!r}: torch cannot compute there ({reason})") from None
    return device


def transformer_pair(config, seed=0):
    """(torch_ref.Transformer, flaxformer_mini.Transformer) with identical weights, both in
    eval mode. The torch twin is initialised from ``torch.manual_seed(seed)``; its weights
    are converted into the Flax twin."""
    torch.manual_seed(seed)
    # Initialised on the CPU whatever torch's default device (CUDA's generator draws other
    # numbers from the same seed), so a seed gives the same weights on every machine; then
    # moved to the default device, where the inputs of ``as_inputs`` are made.
    with torch.device("cpu"):
        torch_model = torch_ref.Transformer(**config.to_dict()).eval()
    torch_model.to(torch.get_default_device())
    return torch_model, flax_twin(torch_model.state_dict(), config, seed)


def flax_twin(state_dict, config, seed=0, *, dtype=None):
    """The ``flaxformer_mini.Transformer`` of ``config`` holding ``state_dict``'s weights (every
    one of them: ``torch_to_flax`` is strict), in eval mode. ``dtype``: its compute dtype
    (``jnp.bfloat16``: parity/bfloat16.py); the parameters stay float32 whatever it is.

    Built from shapes (``Transformer.abstract``): a random init would be overwritten, and eager,
    op by op, it compiles each operation's program on its first use. A state dict holds no dropout
    streams: ``fresh_streams`` makes them from ``seed`` (train mode needs real keys;
    ``train_step`` reseeds them from (seed, step))."""
    flax_model = flaxformer_mini.Transformer.abstract(config, dtype=dtype)
    torch_to_flax(state_dict, flax_model)
    # Over the whole state: any variable other than a stream still holding shapes (neither the
    # state dict nor fresh_streams fills it: a bug here) is a ValueError naming it.
    nnx.update(flax_model, fresh_streams(nnx.state(flax_model), seed))
    flax_model.eval()
    return flax_model


def twins_from_state_dict(state_dict, config, seed=0):
    """(torch_ref.Transformer, flaxformer_mini.Transformer) of ``config`` holding the weights
    of ``state_dict``, both in eval mode.

    The torch twin loads it with ``strict=True`` (a key missing, unexpected or of the wrong
    shape raises ConversionError with torch's list of them); the Flax twin is converted from
    the torch twin's state, so both hold the same float32 values even when the file holds
    another dtype. ``seed`` only seeds the Flax twin's dropout streams.
    """
    torch_model = torch_ref.Transformer(**config.to_dict())
    try:
        torch_model.load_state_dict(state_dict, strict=True)
    except RuntimeError as e:  # torch's message lists every offending key
        c = config
        raise ConversionError(
            f"state dict does not fit torch_ref.Transformer(src_pad_idx={c.src_pad_idx}, vocab "
            f"{c.source_vocab_size}/{c.target_vocab_size}, max_len {c.max_len}, embed {c.embed_size}, "
            f"{c.heads} heads, {c.num_layers} layers): {str(e).strip()}"
        ) from None
    torch_model.eval()
    return torch_model, flax_twin(torch_model.state_dict(), config, seed)


def sample_batch(config, batch=4, seed=0, source_len=None, target_len=None):
    """Seeded (source, target) int64 numpy arrays with padding.

    Row 0 is full length, later rows are padded with ``src_pad_idx`` after a random length.
    Target rows have padding as well (the seed masks only the source; the decoder's mask is
    causal), with ids drawn from the whole target vocabulary.
    """
    rng = np.random.default_rng(seed)
    S = source_len or config.max_len
    T = target_len or max(config.max_len - 1, 1)
    pad = config.src_pad_idx
    ids = [i for i in range(config.source_vocab_size) if i != pad] or [pad]
    source = rng.choice(ids, size=(batch, S))
    lengths = np.concatenate([[S], rng.integers(1, S + 1, size=batch - 1)])
    source[np.arange(S)[None, :] >= lengths[:, None]] = pad
    target = rng.integers(0, config.target_vocab_size, size=(batch, T))
    target_lengths = np.concatenate([[T], rng.integers(1, T + 1, size=batch - 1)])
    target[np.arange(T)[None, :] >= target_lengths[:, None]] = 0
    return source.astype(np.int64), target.astype(np.int64)


def as_inputs(*arrays):
    """The same arrays as torch tensors (on torch's default device) and as JAX arrays."""
    return tuple(torch.as_tensor(a) for a in arrays), tuple(jnp.asarray(a) for a in arrays)
