"""What training and decoding a model will allocate, estimated from its sizes before anything is
allocated, against the memory the machine has free.

The estimates are lower bounds: arrays the computation cannot do without, counted at 4 bytes a
value (float32), so a refusal is never a false alarm. Training keeps the parameters, their
gradients and Adam's two moments (16 bytes a parameter), the logits and their gradient
(2 x R x T x V) and every layer's attention weights for the backward pass (R x H x (S^2 + T^2 +
T x S) per layer; one layer's with rematerialisation). Decoding keeps the parameters, every
decoder layer's key/value cache for self- and cross-attention (2 x L x R x D x (N + S)) and
the next-token log-probabilities (R x V), where R counts every beam of every row.

Free memory is the device's where the backend reports it (``memory_stats``: GPU, TPU) and the
host's otherwise (Linux's MemAvailable: XLA:CPU allocates from the process's heap).
"""

import os

import jax

BYTES_PER_VALUE = 4  # float32: parameters, optimizer state and the activations counted here
GiB = 2**30


def param_count(config):
    """The Transformer's parameter count from its ``ModelConfig`` (the seed's layout: Q/K/V/O
    projections with bias, two LayerNorms per sub-block, a two-layer feed-forward)."""
    D, F, L = config.embed_size, config.feed_forward_width, config.num_layers
    attention = 4 * (D * D + D)
    feed_forward = D * F + F + F * D + D
    encoder_layer = attention + feed_forward + 2 * 2 * D
    decoder_layer = attention + 2 * D + encoder_layer  # its own self-attention and norm, then a block
    embeddings = (config.source_vocab_size + config.target_vocab_size + 2 * config.max_len) * D
    output = D * config.target_vocab_size + config.target_vocab_size
    return L * (encoder_layer + decoder_layer) + embeddings + output


def training_bytes(config, rows, source_len, target_len, remat=False, ema=False):
    """A lower bound of one train step's memory, in bytes: ``{"model": ..., "batch": ...}``, the
    parameters with their gradients and Adam's moments (and ``ema``: their moving average), and
    the batch's activations."""
    H, L, V = config.heads, config.num_layers, config.target_vocab_size
    state = (5 if ema else 4) * param_count(config)  # parameters, gradients, Adam's mu and nu, the average
    logits = 2 * rows * target_len * V
    layers = 1 if remat else L
    attention = layers * rows * H * (source_len**2 + target_len**2 + target_len * source_len)
    return {"model": BYTES_PER_VALUE * state, "batch": BYTES_PER_VALUE * (logits + attention)}


def decoding_bytes(config, rows, new_tokens, source_len, beams=1):
    """A lower bound of decoding's memory for ``rows`` sources, ``beams`` hypotheses each."""
    D, L, V = config.embed_size, config.num_layers, config.target_vocab_size
    hypotheses = rows * beams
    self_cache, cross_cache = 2 * L * hypotheses * D * new_tokens, 2 * L * hypotheses * D * source_len
    if beams > 1:  # each step gathers the surviving beams' rows into a new self-attention cache
        self_cache *= 2
    return BYTES_PER_VALUE * (param_count(config) + self_cache + cross_cache + hypotheses * V)


def free_bytes(device=None):
    """(bytes free, where): the device's free memory where its backend reports it, else the
    host's available memory; None for the bytes where neither can be read."""
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0), f"{device.device_kind}'s memory"
    return host_available(), "this machine's available memory"


def host_available():
    """The host's available memory in bytes (Linux's MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def shortfall(needed, device=None):
    """None when ``needed`` bytes fit in ``device``'s free memory (``free_bytes``; or it cannot
    be read), else the words that say how much there is:
    ``'22.4 GiB (this machine's available memory)'``."""
    free, where = free_bytes(device)
    if free is None or needed <= free:
        return None
    return f"{gib(free)} ({where})"


def gib(n):
    return f"{n / GiB:,.1f} GiB" if n >= 0.1 * GiB else f"{n / 2**20:,.0f} MiB"
