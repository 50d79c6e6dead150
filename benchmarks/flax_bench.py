"""The flaxformer_mini paths, all under ``jax.jit``.

- forward: a pure function ``(state, source, target_in) -> logits`` of the eval-mode model
  (``nnx.split`` / ``nnx.merge``), compiled ahead of time (``lower().compile()``);
- train_step: ``flaxformer_mini.train.trainer.Trainer(model, TrainConfig(schedule='constant',
  learning_rate=1e-4))``'s jitted ``train_step`` (forward, the same loss, backward,
  global-norm clipping at 1.0, optax Adam; the state is donated, so it is always rebound),
  compiled ahead of time from the same jitted function. Its compiled executable gives XLA's
  memory analysis and FLOP count;
- decode_cached: ``flaxformer_mini.decode.search.greedy_decode``: prefill + one position per new
  token with a key/value cache, in a ``lax.while_loop``;
- decode_uncached: ``flaxformer_mini.decode.search.greedy_decode_uncached``: the whole decoder over
  a fixed buffer of N positions for every new token (one shape, one compilation).

The first call of each path is timed from tracing to the end of its first execution.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import flaxformer_mini as fm
from benchmarks import flops
from benchmarks.inputs import EOS_BIAS
from benchmarks.measure import Path
from flaxformer_mini.model.attention import set_attention_impl
from flaxformer_mini.data import EOS, Batch
from flaxformer_mini.decode.search import greedy_decode, greedy_decode_uncached
from flaxformer_mini.runs.config import COMPUTE_DTYPES
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer

VARIANT = "flax_jit"


def variant(preset):
    """The Flax path's name: flax_jit, with _scan for scanned layers and _remat for remat."""
    return VARIANT + ("_scan" if preset.scan_layers else "") + ("_remat" if preset.remat else "")


def _new_model(preset, seed):
    dtype = COMPUTE_DTYPES[preset.dtype]
    model = fm.Transformer.from_config(preset.model, dtype=dtype, scan_layers=preset.scan_layers,
                                       remat=preset.remat, rngs=nnx.Rngs(seed))
    return set_attention_impl(model, preset.attention_impl)


def _forbid_eos(model):
    bias = model.decoder.fc.bias
    bias[...] = bias[...].at[EOS].set(EOS_BIAS)


def _mb(tree):
    return sum(x.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "nbytes")) / 2**20


def _xla_stats(compiled):
    """XLA's memory analysis (bytes of the compiled program's buffers) and FLOP count."""
    out = {}
    try:
        m = compiled.memory_analysis()
        if m is not None:
            out["xla_memory_mb"] = {
                "arguments": m.argument_size_in_bytes / 2**20,
                "outputs": m.output_size_in_bytes / 2**20,
                "aliased (donated)": m.alias_size_in_bytes / 2**20,
                "temporaries": m.temp_size_in_bytes / 2**20,
                # every buffer live at once, donated inputs reused for the outputs: an upper bound
                "peak_estimate": (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                                  + m.temp_size_in_bytes) / 2**20,
            }
    except Exception as e:  # noqa: BLE001 - not every backend implements it
        out["xla_memory_mb"] = f"unavailable: {e}"
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        if cost and "flops" in cost:
            out["xla_flops"] = float(cost["flops"])
    except Exception:  # noqa: BLE001
        pass
    return out


class _AheadOfTime:
    """``jitted.lower(*args).compile()`` in ``prepare``; the time of each stage in ``info``."""

    def __init__(self, jitted, args, info):
        self.jitted, self.args, self.info = jitted, args, info
        self.compiled = None

    def prepare(self):
        start = time.perf_counter()
        lowered = self.jitted.lower(*self.args)
        lowered_at = time.perf_counter()
        self.compiled = lowered.compile()
        self.info["trace_lower_s"] = lowered_at - start
        self.info["xla_compile_s"] = time.perf_counter() - lowered_at
        self.info.update(_xla_stats(self.compiled))


def gpu_probe(run):
    device = jax.devices()[0]
    run()
    stats = device.memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return {"peak_device_mb_process": None if peak is None else peak / 2**20,
            "method": "device.memory_stats()['peak_bytes_in_use'] (the process's peak so far, not resettable)"}


def check_decode_length(tokens, N):
    tokens = np.asarray(tokens)
    if tokens.shape[1] != N or np.any(tokens == EOS):
        raise RuntimeError(f"decoding produced EOS or a short output {tokens.shape}: the timing would not cover N={N} steps")


def _forward_path(preset, model, jbatch, probe):
    c, B, L = preset.model, preset.batch, preset.seq_len
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, source, target: nnx.merge(graphdef, state)(source, target))
    info = {"state_mb": _mb(state)}
    aot = _AheadOfTime(forward, (state, jbatch.source, jbatch.target_in), info)

    def run():
        return aot.compiled(state, jbatch.source, jbatch.target_in).block_until_ready()

    path = Path("forward", variant(preset), "jax", run, flops.forward(c, B, L, L), prepare=aot.prepare, probe=probe,
                info=info)
    path.aot = aot  # the compiled executable, for tools/xla_profile.py
    return path


def _train_path(preset, jbatch, probe):
    c, B, L = preset.model, preset.batch, preset.seq_len
    trainer = Trainer(_new_model(preset, 0), TrainConfig(schedule="constant", learning_rate=1e-4))
    holder = {"state": trainer.init_state()}
    info = {"state_mb": _mb(holder["state"])}
    aot = _AheadOfTime(trainer.train_step, (holder["state"], jbatch), info)

    def run():
        # The step donates its input state: always continue from the returned one.
        holder["state"], metrics = aot.compiled(holder["state"], jbatch)
        return jax.block_until_ready((holder["state"], metrics))

    path = Path("train_step", variant(preset), "jax", run, flops.train_step(c, B, L, L), prepare=aot.prepare,
                probe=probe, info=info)
    path.aot = aot
    return path


def _decode_path(preset, model, jbatch, probe, cached):
    c, B, L, N = preset.model, preset.batch, preset.seq_len, preset.new_tokens
    source = jbatch.source
    decode = greedy_decode if cached else greedy_decode_uncached

    def run():
        return decode(model, source, N).block_until_ready()

    if cached:
        # The cache attends over all N slots (masked beyond t): that is what it executes.
        op, executed, note = "decode_cached", flops.decode_cached(c, B, L, N, key_slots=lambda t: N), \
            "greedy_decode: KV cache, while_loop"
    else:
        op, executed, note = "decode_uncached", flops.decode_uncached_fixed(c, B, L, N), \
            "greedy_decode_uncached: decoder over N positions per token"
    return Path(op, variant(preset), "jax", run, executed, probe=probe, check=lambda out: check_decode_length(out, N),
                notes=[note])


def make_paths(preset, batch, ops):
    """``Path``s of the requested ``ops``; forward and decoding share one eval-mode model."""
    probe = gpu_probe if preset.device == "gpu" else None
    jbatch = Batch(*(jnp.asarray(x) for x in batch))
    eval_model = None
    if {"forward", "decode_cached", "decode_uncached"} & set(ops):
        eval_model = _new_model(preset, 0)
        _forbid_eos(eval_model)
        eval_model.eval()
    paths = []
    if "forward" in ops:
        paths.append(_forward_path(preset, eval_model, jbatch, probe))
    if "train_step" in ops:
        paths.append(_train_path(preset, jbatch, probe))
    if "decode_cached" in ops:
        paths.append(_decode_path(preset, eval_model, jbatch, probe, cached=True))
    if "decode_uncached" in ops:
        paths.append(_decode_path(preset, eval_model, jbatch, probe, cached=False))
    return paths
