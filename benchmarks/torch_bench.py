"""The torch_ref paths: eager and ``torch.compile`` (inductor, default mode).

- forward: ``model(source, target_in)`` in eval mode under ``torch.no_grad()``;
- train_step: ``torch_ref.training.train_step`` (forward, cross-entropy over non-padding
  tokens, backward, global-norm clipping at 1.0, Adam, constant learning rate 1e-4), the
  model in train mode (dropout on). Under torch.compile only the model is compiled
  (forward and, through AOTAutograd, backward); loss, clipping and Adam run eagerly;
- decode_cached: ``torch_ref.cached_decoding.CachedDecoder(model).greedy``: the encoder and
  the cross-attention keys/values once, then one position per token with a preallocated
  (L, B, H, N, K) key/value cache written in place (gpt-fast's scheme). Under torch.compile
  the one-token step is compiled with static shapes: one graph for all N steps;
- decode_uncached (on request): ``torch_ref.decoding.greedy_decode``, seed 001's inference
  without a cache: the decoder re-reads the whole prefix for every new token. Under
  torch.compile, the decoder is compiled with ``dynamic=True``.

Each path gets its own model instance (eval-mode forward and eager decoding share one),
seeded, so a compiled path never shares parameters or optimizer state with an eager one.
"""

import numpy as np
import torch

import torch_ref
from benchmarks import flops
from benchmarks.inputs import EOS_BIAS
from benchmarks.machine import usable_cores
from benchmarks.measure import Path
from flaxformer_mini.data import EOS
from torch_ref.cached_decoding import CachedDecoder
from torch_ref.decoding import greedy_decode
from torch_ref.training import make_optimizer, train_step


def setup_threads():
    """Intra-op threads = the cores this process may use, the report's core count (torch's
    default may differ in a container; more threads than usable cores would oversubscribe)."""
    torch.set_num_threads(usable_cores())
    return torch.get_num_threads()


def _device(preset):
    return "cuda" if preset.device == "gpu" else "cpu"


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _new_model(preset, seed, train):
    torch.manual_seed(seed)
    model = torch_ref.Transformer(**preset.model.to_dict()).to(_device(preset))
    model.train(train)
    return model


def _forbid_eos(model):
    with torch.no_grad():
        model.decoder.fc.bias[EOS] = EOS_BIAS


def _autocast(preset):
    # bfloat16 compute with float32 parameters: the counterpart of the Flax twin's
    # dtype=bfloat16, param_dtype=float32.
    if preset.dtype == "bfloat16":
        return torch.autocast(_device(preset), dtype=torch.bfloat16)
    return torch.autocast(_device(preset), enabled=False)


def _state_mb(model, optimizer=None):
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if optimizer is not None:
        total += sum(p.numel() * p.element_size() for p in model.parameters())  # gradients
        for s in optimizer.state.values():
            total += sum(v.numel() * v.element_size() for v in s.values() if torch.is_tensor(v))
    return total / 2**20


def _graph_count():
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _compile_watch(path):
    """Record how many graphs dynamo compiled in the first call and after it (recompiles)."""
    state = {}
    inner_prepare, inner_run = path.prepare, path.run

    def prepare():
        state["before"] = _graph_count()
        if inner_prepare is not None:
            inner_prepare()

    def run():
        out = inner_run()
        if "first" not in state:
            state["first"] = _graph_count() - state["before"]
        return out

    inner_after = path.after

    def after():
        out = dict(inner_after()) if inner_after is not None else {}
        out.update(graphs_compiled_first_call=state["first"],
                   graphs_compiled_later=_graph_count() - state["before"] - state["first"])
        return out

    path.prepare, path.run, path.after = prepare, run, after
    return path


def cuda_probe(run):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    return {"peak_device_delta_mb": (torch.cuda.max_memory_allocated() - before) / 2**20,
            "method": "torch.cuda.max_memory_allocated during one call - allocated before"}


def make_paths(preset, batch, ops, variants):
    """``Path``s for the requested ``ops`` and ``variants`` (subsets of torch_eager, torch_compile)."""
    device = _device(preset)
    c, B, L, N = preset.model, preset.batch, preset.seq_len, preset.new_tokens
    probe = cuda_probe if device == "cuda" else None
    source = torch.as_tensor(batch.source, dtype=torch.long, device=device)
    target_in = torch.as_tensor(batch.target_in, dtype=torch.long, device=device)
    paths = []
    eval_model = None

    def eval_shared():
        nonlocal eval_model
        if eval_model is None:
            eval_model = _new_model(preset, 0, train=False)
            _forbid_eos(eval_model)
        return eval_model

    if "forward" in ops:
        for variant in variants:
            model = eval_shared()
            fn = torch.compile(model, backend=preset.torch_compile_backend) if variant == "torch_compile" else model

            def run(fn=fn):
                with torch.no_grad(), _autocast(preset):
                    out = fn(source, target_in)
                _sync(device)
                return out

            p = Path("forward", variant, "torch", run, flops.forward(c, B, L, L), probe=probe,
                     info={"state_mb": _state_mb(model)})
            paths.append(_compile_watch(p) if variant == "torch_compile" else p)

    if "train_step" in ops:
        for variant in variants:
            model = _new_model(preset, 0, train=True)
            optimizer, scheduler = make_optimizer(model, schedule="constant", learning_rate=1e-4)
            fn = torch.compile(model, backend=preset.torch_compile_backend) if variant == "torch_compile" else model

            def run(fn=fn, optimizer=optimizer, scheduler=scheduler):
                with _autocast(preset):
                    # train_step reads the loss back with .item(): the step is finished.
                    return train_step(fn, optimizer, scheduler, batch)

            p = Path("train_step", variant, "torch", run, flops.train_step(c, B, L, L), probe=probe,
                     after=lambda model=model, optimizer=optimizer: {"state_mb": _state_mb(model, optimizer)})
            if variant == "torch_compile":
                p.notes.append("model compiled; loss, clipping and Adam eager")
                _compile_watch(p)
            paths.append(p)

    if "decode_cached" in ops:
        for variant in variants:
            decoder = CachedDecoder(eval_shared(), compile=variant == "torch_compile",
                                    backend=preset.torch_compile_backend)

            def run(decoder=decoder):
                with _autocast(preset):
                    out = decoder.greedy(source, N)
                _sync(device)
                return out

            p = Path("decode_cached", variant, "torch", run, flops.decode_cached(c, B, L, N, key_slots=lambda t: N),
                     probe=probe, check=lambda out: check_decode_length(out, N),
                     notes=["CachedDecoder.greedy: KV cache, Python loop"])
            if variant == "torch_compile":
                p.notes.append("one-token step compiled, static shapes")
                _compile_watch(p)
            paths.append(p)

    if "decode_uncached" in ops:
        for variant in variants:
            if variant == "torch_compile":
                model = _new_model(preset, 0, train=False)
                _forbid_eos(model)
                model.decoder.compile(dynamic=True, backend=preset.torch_compile_backend)
            else:
                model = eval_shared()

            def run(model=model):
                with _autocast(preset):
                    out = greedy_decode(model, source, N)
                _sync(device)
                return out

            p = Path("decode_uncached", variant, "torch", run, flops.decode_uncached_growing(c, B, L, N), probe=probe,
                     check=lambda out: check_decode_length(out, N), notes=["torch_ref.decoding.greedy_decode: decoder over 1..N positions per token"])
            if variant == "torch_compile":
                p.notes.append("decoder compiled with dynamic=True")
                _compile_watch(p)
            paths.append(p)
    return paths


def check_decode_length(tokens, N):
    """Every row got N real tokens: no EOS cut the loop short (see inputs.EOS_BIAS)."""
    tokens = np.asarray(tokens.cpu() if torch.is_tensor(tokens) else tokens)
    if tokens.shape[1] != N or np.any(tokens == EOS):
        raise RuntimeError(f"decoding produced EOS or a short output {tokens.shape}: the timing would not cover N={N} steps")
