"""Named benchmark settings: the model, the batch shape, the dtype and how often to repeat.

A preset pairs a ``flaxformer_mini.ModelConfig`` (the seed's constructor arguments, the same
for both twins) with what the benchmark feeds it:

    batch       B, sequences per step
    seq_len     S = T, source and target lengths of the forward pass and the train step
    new_tokens  N, tokens greedy decoding generates (from a source of length S), so the
                model's max_len must be >= N (decoder positions) and >= S

Repetition counts are per preset: the base preset's defaults are chosen to keep
``python -m benchmarks`` under 5 minutes on a quiet 2-core CPU, where torch.compile's first
calls take most of the time (docs/benchmarks.md has the measured wall times).
"""

import dataclasses

from flaxformer_mini.model.attention import ATTENTION_IMPLS
from flaxformer_mini.model.config import ModelConfig, get_preset
from flaxformer_mini.model.config import DTYPES


@dataclasses.dataclass(frozen=True)
class BenchPreset:
    name: str
    model: ModelConfig
    batch: int
    seq_len: int
    new_tokens: int
    dtype: str = "float32"  # compute dtype: "float32" or "bfloat16" (parameters stay float32)
    device: str = "cpu"  # "cpu", or "gpu": refuses to run without one (unless forced)
    reps: int = 5  # timed repetitions of forward and train step (the median is reported)
    decode_reps: int = 3  # timed repetitions of each decoding path (they are the slow ones)
    warmup: int = 1  # untimed calls after the first (compiling) call
    decode_warmup: int = 0  # the same for decoding: its first call already runs all N steps
    matmul_size: int = 4096  # side of the square matmul that measures the machine's peak
    torch_compile_backend: str = "inductor"  # torch.compile's default; "eager" only traces (smoke tests)
    attention_impl: str = "einsum"  # the Flax path's SelfAttention (flaxformer_mini.model.attention.ATTENTION_IMPLS)
    # The Flax model's layer layout (flaxformer_mini/model/scanned.py): stacked layers run by nnx.scan,
    # and activations recomputed in the backward pass. The Flax path is named after them:
    # flax_jit, flax_jit_scan, flax_jit_remat, flax_jit_scan_remat.
    scan_layers: bool = False
    remat: bool = False
    description: str = ""

    def __post_init__(self):
        c = self.model
        problems = []
        if self.seq_len > c.max_len:
            problems.append(f"seq_len={self.seq_len} exceeds the model's max_len={c.max_len}")
        if self.new_tokens > c.max_len:
            problems.append(f"new_tokens={self.new_tokens} exceeds the model's max_len={c.max_len}")
        if self.dtype not in DTYPES:
            problems.append(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attention_impl not in ATTENTION_IMPLS:
            problems.append(f"attention_impl must be one of {', '.join(ATTENTION_IMPLS)}, got {self.attention_impl!r}")
        if self.device not in ("cpu", "gpu"):
            problems.append(f"device must be 'cpu' or 'gpu', got {self.device!r}")
        for name in ("batch", "seq_len", "new_tokens", "reps", "decode_reps", "matmul_size"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "decode_warmup"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if problems:
            raise ValueError(f"invalid benchmark preset {self.name!r}: " + "; ".join(problems))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def summary(self):
        c = self.model
        return (f"{self.name}: B={self.batch} S=T={self.seq_len} N={self.new_tokens} D={c.embed_size} "
                f"H={c.heads} L={c.num_layers}+{c.num_layers} V={c.target_vocab_size} {self.dtype}, "
                f"dropout {c.dropout} in the train step"
                + ("" if self.attention_impl == "einsum" else f"; Flax attention: {self.attention_impl}")
                + ("; Flax layers scanned" if self.scan_layers else "") + ("; Flax remat" if self.remat else ""))


PRESETS = {
    # The seed's width and depth (512, 8 heads, 6 + 6 layers, feed-forward width 512) at a
    # realistic batch; flaxformer_mini's 'base' model config (vocabulary 1000, max_len 128).
    "base": BenchPreset(
        name="base", model=get_preset("base"), batch=16, seq_len=64, new_tokens=64,
        # 11 rounds (5 for decoding, after one warm-up): with 5 and 3, one disturbed round on
        # a shared 2-core VM moved a median by 10-20%, as much as the ratios being judged.
        reps=11, decode_reps=5, decode_warmup=1,
        description="the seed's width and depth at a realistic batch (the issue's CPU targets)",
    ),
    # A smoke test: the tests' tiny model (odd sizes) with one layer a side, as the tests'
    # tiny runs (tests/helpers.py's TINY_RUN): a smoke run needs every path, not depth, and
    # each layer more lengthens every path's compile. A few tokens, one repetition, a small
    # matmul. Seconds, apart from torch.compile.
    "tiny": BenchPreset(
        name="tiny", model=get_preset("tiny").replace(num_layers=1), batch=3, seq_len=7, new_tokens=5,
        reps=1, decode_reps=1, warmup=0, matmul_size=256,
        description="smoke test: the tests' tiny model",
    ),
    # For a GPU: twice the width, twice the depth, 8x the length, bfloat16 compute, and
    # cuDNN's fused attention on the Flax side (--attention einsum turns it off).
    "large": BenchPreset(
        name="large",
        model=ModelConfig(src_pad_idx=0, source_vocab_size=1000, target_vocab_size=1000, max_len=1024,
                          embed_size=1024, heads=16, num_layers=12, dropout=0.1),
        batch=16, seq_len=512, new_tokens=64, dtype="bfloat16", device="gpu", attention_impl="cudnn",
        reps=10, decode_reps=3, warmup=2, matmul_size=8192,
        description="GPU: embed 1024, 16 heads, 12 + 12 layers, length 512, bfloat16",
    ),
}


def get_bench_preset(name):
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown benchmark preset {name!r}; choose one of {', '.join(sorted(PRESETS))}") from None
