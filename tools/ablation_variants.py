"""The ablations' variants: each a configuration of flaxformer_mini's train step, by name.

``VARIANTS`` maps a name to a ``Variant``: what it measures (``what``), how its path is built
(``build(preset, jbatch) -> benchmarks.measure.Path``), and the group it is timed in, each
group a process of its own (``tools/ablations.py`` starts them one after the other):

- ``main`` (``group`` empty): most of them, interleaved with ``default``, so their ratios to
  it hold whatever the machine's load;
- a named group (``group``) for the variants that would weigh on ``main``: the unscanned step,
  whose compile takes minutes on a GPU, and the larger batches, whose memory would add to every
  other variant's; the group times ``default`` beside them (compiled once for the whole run
  where JAX's persistent cache is set), so their ratios are within one process too;
- a group of its own per XLA flag (``xla_flags``): XLA reads its flags once, when the backend
  starts, and aborts on a flag it does not know, so such a variant is ``default`` in a
  process started with that flag, compared with ``main``'s ``default`` (another process).

``gpu_only`` says why a variant cannot run without a GPU; the runner lists such a variant as
skipped rather than leave it out. ``skip(preset)`` gives a reason a variant is meaningless for
a preset (the unscanned step of an unscanned run), or None.

Nothing in flaxformer_mini changes: a variant builds the model with other arguments (the
remat policy, the dropout rate, the attention), runs under another ``jax_default_prng_impl``,
or swaps one function for the time its step is traced (the LayerNorm, the loss), which only an
investigation may do.
"""

import contextlib
import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

import flaxformer_mini as fm
from benchmarks import flax_bench, flops
from benchmarks.inputs import make_batch
from benchmarks.measure import Path
from flaxformer_mini.data import Batch
from flaxformer_mini.model import layers, primitives
from flaxformer_mini.model.attention import set_attention_impl
from flaxformer_mini.runs.config import COMPUTE_DTYPES
from flaxformer_mini.train import loss as losses
from flaxformer_mini.train import step as steps
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.state import TrainState


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    what: str
    build: Callable | None = None  # (preset, jbatch) -> Path; None: ``default`` under ``xla_flags``
    gpu_only: str = ""  # why it needs a GPU ("" runs anywhere)
    group: str = ""  # the group (process) it is timed in; "": main
    xla_flags: str = ""  # a group of its own, started with these XLA_FLAGS added
    skip: Callable = lambda preset: None  # (preset) -> reason it does not apply, or None


# --- the pieces the variants swap in ------------------------------------------------------

@contextlib.contextmanager
def prng_impl(name):
    old = jax.config.jax_default_prng_impl
    jax.config.update("jax_default_prng_impl", name)
    try:
        yield
    finally:
        jax.config.update("jax_default_prng_impl", old)


@contextlib.contextmanager
def plain_nnx_linear():
    """Models built inside use nnx.Linear where flaxformer_mini uses its own Linear."""
    old = primitives.Linear
    primitives.Linear = nnx.Linear
    try:
        yield
    finally:
        primitives.Linear = old


@contextlib.contextmanager
def swapped(module, name, value):
    """``module.name`` is ``value`` inside (a function the model or the step looks up when traced)."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def layer_norms_recomputed(prevent_cse):
    """Models traced inside recompute each LayerNorm in the backward pass. A variant of the
    experiment only: inside ``nnx.remat`` a LayerNorm is traced as a copy, so parity's
    recording of intermediates would lose its rows, and graph-mode nnx.remat refuses a model
    closed over by a plain JAX transform."""
    return swapped(layers, "normalize", nnx.remat(primitives.normalize, prevent_cse=prevent_cse))


def normalize_by_autodiff(norm, x):
    """``primitives.normalize(norm, x)`` by nnx.LayerNorm's own ``__call__``, differentiated by
    autodiff (three float32 arrays of x's shape kept per LayerNorm), not by the backward pass of
    flaxformer_mini's ``LayerNorm``: the same values."""
    with jax.numpy_dtype_promotion("standard"):  # flax promotes its statistics to float32 (primitives.normalize)
        return nnx.LayerNorm.__call__(norm, x)


def bfloat16_dots_saveable(prim, *avals, **params):
    """A ``jax.checkpoint`` policy: keep the outputs of matrix products computed in bfloat16
    (the Linear layers' GEMMs of a bfloat16 model, batch dimensions or not), and no float32
    product (the einsum attention's float32 scores, which ``dots_saveable`` keeps). In a
    float32 model it keeps nothing, as ``nothing_saveable``."""
    if prim is not jax.lax.dot_general_p:
        return False
    out = params.get("preferred_element_type") or avals[0].dtype
    return jnp.dtype(out) == jnp.bfloat16


# --- paths ---------------------------------------------------------------------------------

def _model(preset, **model_kw):
    kw = dict(scan_layers=preset.scan_layers, remat=preset.remat) | model_kw
    model = fm.Transformer.from_config(preset.model, dtype=COMPUTE_DTYPES[preset.dtype], rngs=nnx.Rngs(0), **kw)
    return set_attention_impl(model, preset.attention_impl)


def train_path(name, preset, jbatch, *, impl="threefry2x32", building=contextlib.nullcontext,
               tracing=contextlib.nullcontext, model_kw=None, **train_config):
    """A train-step Path: the Trainer's step (``train.step.train_step``, its state donated) for
    the model of ``preset`` (with ``model_kw``), its state and executable all made under the
    PRNG implementation ``impl``; ``building`` holds while the model is built, ``tracing``
    while its step is traced. Each path jits its own wrapper of ``train_step``: jax.jit keeps
    one trace cache per function, and a step traced under ``tracing`` has the default's
    function, structure and shapes."""
    c, B, L = preset.model, preset.batch, preset.seq_len
    with prng_impl(impl), building():
        model = _model(preset, **(model_kw or {}))
        state = TrainState.create(model, TrainConfig(schedule="constant", learning_rate=1e-4, **train_config))
        holder = {"state": jax.tree.map(jnp.copy, state)}
    step = jax.jit(lambda state, batch: steps.train_step(state, batch), donate_argnums=0)
    compiled = {}

    def prepare():
        with prng_impl(impl), tracing():
            compiled["step"] = step.lower(holder["state"], jbatch).compile()
        path.info.update(memory_analysis(compiled["step"]))

    def run():
        holder["state"], metrics = compiled["step"](holder["state"], jbatch)
        return jax.block_until_ready((holder["state"], metrics))

    path = Path("train_step", name, "jax", run, flops.train_step(c, B, L, L), prepare=prepare,
                info={"batch": B})
    return path


def memory_analysis(compiled):
    """XLA's sizes for a compiled program, in MB: its temporaries, and every buffer live at
    once (arguments + outputs - donated + temporaries: an upper bound of its peak)."""
    m = compiled.memory_analysis()  # None where the backend gives none
    if m is None:
        return {}
    return {"xla_temp_mb": m.temp_size_in_bytes / 2**20,
            "xla_peak_estimate_mb": (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                                     + m.temp_size_in_bytes) / 2**20}


def _scan_path(preset, jbatch, steps_per_call=4):
    """``steps_per_call`` train steps in one compiled call: ``lax.scan`` with
    ``train.step.train_step`` (the function the Trainer jits) as its body."""
    c, B, L = preset.model, preset.batch, preset.seq_len
    state = TrainState.create(_model(preset), TrainConfig(schedule="constant", learning_rate=1e-4))
    holder = {"state": jax.tree.map(jnp.copy, state)}
    batches = jax.tree.map(lambda x: jnp.stack([x] * steps_per_call), jbatch)
    jitted = jax.jit(lambda state, batches: jax.lax.scan(steps.train_step, state, batches), donate_argnums=0)
    compiled = {}

    def prepare():
        compiled["steps"] = jitted.lower(holder["state"], batches).compile()
        path.info.update(memory_analysis(compiled["steps"]))

    def run():
        holder["state"], metrics = compiled["steps"](holder["state"], batches)
        return jax.block_until_ready((holder["state"], metrics))

    path = Path("train_step", f"scan_x{steps_per_call}", "jax", run, flops.train_step(c, B, L, L) * steps_per_call,
                prepare=prepare, info={"steps_per_call": steps_per_call, "batch": B})
    return path


def _forward_x3(preset, jbatch):
    (path,) = flax_bench.make_paths(preset, Batch(*jbatch), ["forward"])
    inner = path.run

    def run():
        for _ in range(3):
            out = inner()
        return out

    return Path("train_step", "eval_forward_x3", "jax", run, path.flops * 3, prepare=path.prepare,
                info={"batch": preset.batch})


def _batch_path(factor):
    def build(preset, jbatch):
        bigger = preset.replace(batch=preset.batch * factor)
        batch = Batch(*(jnp.asarray(x) for x in make_batch(bigger)))
        return train_path(f"batch_x{factor}", bigger, batch)
    return build


def _remat(policy):
    return lambda name: lambda preset, jbatch: train_path(name, preset, jbatch,
                                                          model_kw=dict(remat=True, remat_policy=policy))


def _not_scanned(preset):
    return None if preset.scan_layers else "the run's layers are unscanned already (--scan-layers compares the two)"


def _attention_is(impl):
    return lambda preset: f"the run's attention is {impl} already" if preset.attention_impl == impl else None


def _remat_already(preset):
    return "the run rematerialises its blocks already" if preset.remat else None


_POLICIES = jax.checkpoint_policies
_GPU_FLAG = "an XLA:GPU flag"


def _catalogue():
    """The variants in the order ``--variants`` lists them by default."""
    remat = {
        "remat_nothing": (None, "each block rematerialised (jax.checkpoint, nothing_saveable: "
                                "jax.checkpoint's default), only its input kept; the step recomputes a forward"),
        "remat_dots": (_POLICIES.dots_saveable, "each block rematerialised, its matrix products' outputs kept "
                                               "(dots_saveable: the einsum attention's float32 scores too)"),
        "remat_dots_no_batch_dims": (_POLICIES.dots_with_no_batch_dims_saveable,
                                     "each block rematerialised, the outputs of its products without batch "
                                     "dimensions (the Linear layers' GEMMs) kept"),
        "remat_bfloat16_dots": (bfloat16_dots_saveable, "each block rematerialised, the outputs of its bfloat16 "
                                                        "products kept, no float32 one (in a float32 model: "
                                                        "nothing, as remat_nothing)"),
    }
    flag_variants = {
        "xla_latency_hiding_scheduler": "--xla_gpu_enable_latency_hiding_scheduler=true",
        "xla_simplify_fp_conversions": "--xla_gpu_simplify_all_fp_conversions=true",
        "xla_custom_fusions": "--xla_gpu_enable_custom_fusions=true",
        "xla_dynamic_slice_fusion": "--xla_gpu_enable_dynamic_slice_fusion=true",
        "xla_deterministic_ops": "--xla_gpu_deterministic_ops=true",
    }
    flag_what = {
        "xla_latency_hiding_scheduler": "XLA:GPU's latency-hiding scheduler (overlaps independent kernels and copies)",
        "xla_simplify_fp_conversions": "XLA:GPU removes float conversion pairs (bf16 -> f32 -> bf16) everywhere",
        "xla_custom_fusions": "XLA:GPU's custom fusions (library kernels with fused prologues or epilogues)",
        "xla_dynamic_slice_fusion": "XLA:GPU's custom fusion of the scanned loop's dynamic slices into the GEMMs "
                                    "that read them (no copy of each layer's weights out of the stack)",
        "xla_deterministic_ops": "XLA:GPU's deterministic kernels (scatter-adds without atomics, autotuning off): "
                                 "what a bit-exact resume costs on a GPU",
    }
    out = [
        Variant("default", "the benchmark's train step: dropout 0.1 with threefry keys (JAX's default), the "
                           "model's LayerNorms (their input and statistics kept), the plain loss",
                build=lambda p, b: train_path("default", p, b)),
        Variant("no_dropout", "the same model with dropout 0.0: the floor of dropout's cost",
                build=lambda p, b: train_path("no_dropout", p.replace(model=p.model.replace(dropout=0.0)), b)),
        Variant("rbg_dropout", "dropout's bits from XLA's RngBitGenerator (jax_default_prng_impl='rbg') instead of "
                               "threefry2x32", build=lambda p, b: train_path("rbg_dropout", p, b, impl="rbg")),
        Variant("unsafe_rbg_dropout", "dropout's bits from 'unsafe_rbg' (RngBitGenerator, keys split without "
                                      "threefry too)",
                build=lambda p, b: train_path("unsafe_rbg_dropout", p, b, impl="unsafe_rbg")),
        Variant("layer_norm_recomputed", "each LayerNorm recomputed in the backward pass (nnx.remat around it, "
                                         "prevent_cse=False as under scan): only its input kept, no statistics",
                build=lambda p, b: train_path("layer_norm_recomputed", p, b,
                                              tracing=lambda: layer_norms_recomputed(False))),
        Variant("layer_norm_recomputed_cse", "the same with jax.checkpoint's default barriers (prevent_cse=True)",
                build=lambda p, b: train_path("layer_norm_recomputed_cse", p, b,
                                              tracing=lambda: layer_norms_recomputed(True))),
        Variant("layer_norm_autodiff", "each LayerNorm differentiated by autodiff of nnx.LayerNorm, which keeps "
                                       "three float32 (B, T, D) arrays, instead of the model's LayerNorm backward, "
                                       "which keeps its input and a float32 mean and 1/std per token",
                build=lambda p, b: train_path("layer_norm_autodiff", p, b,
                                              tracing=lambda: swapped(layers, "normalize", normalize_by_autodiff))),
        *[Variant(name, what, build=_remat(policy)(name), skip=_remat_already)
          for name, (policy, what) in remat.items()],
        Variant("fused_loss", "the loss as fused_token_cross_entropy: logits kept in the compute dtype, float32 "
                              "arithmetic and accumulation, the gradient written in the logits' dtype",
                build=lambda p, b: train_path("fused_loss", p, b, tracing=lambda: swapped(
                    steps, "token_cross_entropy", losses.fused_token_cross_entropy))),
        Variant("no_clipping", "TrainConfig(clip_norm=None): the cost of the global-norm clipping",
                build=lambda p, b: train_path("no_clipping", p, b, clip_norm=None)),
        Variant("nnx_linear", "plain nnx.Linear layers (a (B, T, D) product) instead of flaxformer_mini's Linear, "
                              "which flattens to (B*T, D) first",
                build=lambda p, b: train_path("nnx_linear", p, b, building=plain_nnx_linear)),
        Variant("attention_einsum", "the einsum attention instead of the run's (cuDNN's on the large preset)",
                build=lambda p, b: train_path("attention_einsum", p.replace(attention_impl="einsum"), b),
                skip=_attention_is("einsum")),
        Variant("attention_cudnn", "cuDNN's fused attention instead of the run's", gpu_only="cuDNN",
                build=lambda p, b: train_path("attention_cudnn", p.replace(attention_impl="cudnn"), b),
                skip=_attention_is("cudnn")),
        Variant("scan_x4", "four train steps per compiled call (lax.scan over the step): what the per-call "
                           "allocation and dispatch cost; time per step", build=lambda p, b: _scan_path(p, b)),
        Variant("eval_forward_x3", "three eval forwards: a train step at the forward pass's efficiency "
                                   "(backward = 2 forwards)", build=_forward_x3),
        Variant("batch_x2", "the batch doubled (B=32 on the large preset), time per step: where the step "
                            "becomes GEMM-bound", build=_batch_path(2), group="batch"),
        Variant("batch_x4", "the batch x4 (B=64 on the large preset)", build=_batch_path(4), group="batch"),
        Variant("unscanned", "the same step with the layers unscanned (one module per layer, no stacks to fill "
                             "or slice), at the run's other settings",
                build=lambda p, b: train_path("unscanned", p.replace(scan_layers=False), b),
                group="unscanned", skip=_not_scanned),
        *[Variant(name, f"{flag_what[name]}: {flags}", gpu_only=_GPU_FLAG, group=name, xla_flags=flags)
          for name, flags in flag_variants.items()],
    ]
    return {v.name: v for v in out}


VARIANTS = _catalogue()
