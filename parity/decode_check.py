"""Greedy decoding on both twins, token for token: what ``parity check --decode N`` adds.

Each twin decodes the same source batch greedily with its own KV cache (torch_ref's
``CachedDecoder``, flaxformer_mini's ``greedy_decode``), and the token ids are compared row by
row. Logits equal to 1e-5 do not promise equal tokens: where a step's best two logits are
closer than the twins' rounding, either may win, and the two continuations part from there.
So a row that differs is judged at its first differing step by the margins of the two tokens
the twins chose: each side's logit of its own token minus its logit of the other's. Either
above ``NEAR_TIE_FACTOR * atol``: the twins disagree on a clear choice, which is a bug; both
at or below it: the step is a near-tie, a property of the data (tests/test_decoding.py's ``greedy_margin`` reasons the
same way).

    torch_model, flax_model = transformer_pair(config)
    decoded = check_decoding(torch_model, flax_model, config, 10)
    decoded.ok, decoded.first_difference  # True, None: the same ids in every row

Shapes: B batch, S source length, N new tokens, V target vocabulary.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from flaxformer_mini import data as flax_data
from flaxformer_mini.decode import search as decoding
from parity.compare import on_device_of
from parity.policy import DEFAULT_ATOL, NEAR_TIE_FACTOR, check_tolerance
from parity.twins import as_inputs, sample_batch
from torch_ref import decoding as torch_decoding
from torch_ref.cached_decoding import CachedDecoder, prefill


@dataclasses.dataclass
class TokenDifference:
    """Where one row's decoded ids first differ, and how close that step's choice was."""
    row: int
    position: int  # the step: how many new tokens both twins agreed on before it
    torch_token: int
    flax_token: int
    torch_margin: float  # torch's logit of torch_token minus its logit of flax_token, at that step
    flax_margin: float  # Flax's logit of flax_token minus its logit of torch_token
    near_tie: bool  # both margins <= the report's near_tie_margin

    def to_dict(self):
        out = dataclasses.asdict(self)
        for key in ("torch_margin", "flax_margin"):  # strict JSON: no NaN or Infinity
            out[key] = out[key] if math.isfinite(out[key]) else None
        return out


@dataclasses.dataclass
class DecodeReport:
    max_new_tokens: int
    torch_tokens: np.ndarray  # (B, N) int64: EOS included, PAD after it
    flax_tokens: np.ndarray  # (B, N)
    near_tie_margin: float  # NEAR_TIE_FACTOR * atol
    differences: list  # one TokenDifference per differing row, in row order

    @property
    def identical(self):
        return not self.differences

    @property
    def ok(self):
        """No row differs at a clear margin (near-ties alone do not fail)."""
        return all(d.near_tie for d in self.differences)

    @property
    def first_difference(self):
        return self.differences[0] if self.differences else None

    def format(self):
        """A few lines for after the table: the verdict, then the first differing row."""
        B, N = self.torch_tokens.shape
        head = f"greedy decoding of {N} new tokens with KV caches, {B} row{'' if B == 1 else 's'}:"
        if self.identical:
            return f"{head} the same token ids in every row"
        clear = [d for d in self.differences if not d.near_tie]
        d = self.first_difference
        ties = len(self.differences) - len(clear)
        lines = [f"{head} {len(self.differences)} of {B} rows differ "
                 f"({len(clear)} at a clear margin, {ties} near-tie{'' if ties == 1 else 's'})",
                 f"first difference: row {d.row}, position {d.position}: torch chose {d.torch_token} "
                 f"({d.torch_margin:.3e} above {d.flax_token} in torch's logits), Flax chose {d.flax_token} "
                 f"({d.flax_margin:.3e} above {d.torch_token} in Flax's)"]
        if d.near_tie:
            lines.append(f"note: a near-tie (both margins <= "
                         f"{self.near_tie_margin:g}, {NEAR_TIE_FACTOR} x atol): either token is right at this "
                         f"precision, so it is not counted as a difference")
        else:
            lines.append(f"decoding diverges: a margin of {max(d.torch_margin, d.flax_margin):.3e} > "
                         f"{self.near_tie_margin:g} "
                         f"({NEAR_TIE_FACTOR} x atol) is no near-tie")
        if d.near_tie and clear:  # the verdict rests on a later row: name it
            lines.append(f"decoding diverges: row {clear[0].row} differs at position {clear[0].position} with "
                         f"a margin of {max(clear[0].torch_margin, clear[0].flax_margin):.3e} > "
                         f"{self.near_tie_margin:g}")
        return "\n".join(lines)

    def to_dict(self):
        first = self.first_difference
        return {
            "max_new_tokens": self.max_new_tokens,
            "identical": self.identical,
            "ok": self.ok,
            # NEAR_TIE_FACTOR x an --atol near float's largest is inf: null, as strict JSON has no inf.
            "near_tie_margin": self.near_tie_margin if math.isfinite(self.near_tie_margin) else None,
            "first_difference": first.to_dict() if first else None,
            "differences": [d.to_dict() for d in self.differences],
            "torch_tokens": self.torch_tokens.tolist(),
            "flax_tokens": self.flax_tokens.tolist(),
        }


def check_decoding(torch_model, flax_model, config, max_new_tokens, *, batch=4, seed=0,
                   atol=DEFAULT_ATOL) -> DecodeReport:
    """Greedy decoding of ``max_new_tokens`` on both twins of ``config``, on the source of
    ``sample_batch(config, batch, seed)``: the batch ``check_twins`` compares."""
    source, _ = sample_batch(config, batch=batch, seed=seed)
    return compare_greedy(torch_model, flax_model, source, max_new_tokens, atol=atol)


def compare_greedy(torch_model, flax_model, source, max_new_tokens, *, atol=DEFAULT_ATOL) -> DecodeReport:
    """Decode ``source`` (B, S) int64 greedily on both twins and compare the ids row by row.
    Each decoder checks its inputs (a ValueError names the problem)."""
    check_tolerance(atol, "compare_greedy")
    # Each decoder starts from its own package's BOS and stops at its EOS; torch_ref repeats
    # flaxformer_mini.data's ids because it may not import JAX. If they drifted apart, every
    # row would differ at position 0 and the report would blame the port.
    ids = {name: (getattr(torch_decoding, name), getattr(flax_data, name)) for name in ("PAD", "BOS", "EOS")}
    if any(t != f for t, f in ids.values()):
        raise RuntimeError(f"torch_ref.decoding and flaxformer_mini.data disagree on special ids (torch, Flax): {ids}")

    (torch_source,), (flax_source,) = as_inputs(source)
    (torch_source,) = on_device_of(torch_model, (torch_source,))
    decoder = CachedDecoder(torch_model)
    torch_tokens = decoder.greedy(torch_source, max_new_tokens).cpu().numpy()
    flax_tokens = np.asarray(decoding.greedy_decode(flax_model, flax_source, max_new_tokens)).astype(np.int64)

    threshold = NEAR_TIE_FACTOR * atol
    differs = torch_tokens != flax_tokens  # (B, N)
    rows = np.flatnonzero(differs.any(axis=1))
    differences = []
    if rows.size:
        positions = differs[rows].argmax(axis=1)  # the first differing step of each differing row
        torch_logits = _torch_step_logits(decoder, torch_source, torch_tokens)  # (B, N, V)
        flax_logits = _flax_step_logits(flax_model, flax_source, flax_tokens)
        for r, t in zip(rows.tolist(), positions.tolist()):
            a, b = int(torch_tokens[r, t]), int(flax_tokens[r, t])
            torch_gap, flax_gap, near_tie = judge_step(torch_logits[r, t], flax_logits[r, t], a, b, threshold)
            differences.append(TokenDifference(r, t, a, b, torch_gap, flax_gap, near_tie=near_tie))
    return DecodeReport(max_new_tokens, torch_tokens, flax_tokens, threshold, differences)


def judge_step(torch_logits, flax_logits, torch_token, flax_token, threshold):
    """(torch's gap, Flax's gap, near-tie) at a step where torch chose ``torch_token`` and Flax
    ``flax_token``, from each side's logits (V,) there. A side's gap is its logit of its own
    token minus its logit of the other side's: the two tokens the twins actually chose, not
    torch's top two (Flax may have chosen torch's third). A near-tie only when both gaps are
    within ``threshold``: then rounding within the tolerance can have swapped the two; NaN is
    never one."""
    torch_gap = float(torch_logits[torch_token] - torch_logits[flax_token])
    flax_gap = float(flax_logits[flax_token] - flax_logits[torch_token])
    return torch_gap, flax_gap, bool(torch_gap <= threshold and flax_gap <= threshold)


# The logits behind each decoder's choices: its cached step replayed on the tokens it chose
# (PAD after a row's EOS, as the decoders feed back), at every step. Up to a row's first
# differing step both twins were fed the same ids, so their logits there are comparable.


def _torch_step_logits(decoder, source, tokens):
    """(B, N, V) float64: torch's cached decoder's logits at each step of ``tokens`` (B, N)."""
    model = decoder.model
    B, N = tokens.shape
    was_training = model.training
    model.eval()  # as greedy decoded: no dropout
    try:
        with torch.no_grad():
            cache = prefill(model, source, N)
            fed = torch.full((B,), torch_decoding.BOS, dtype=torch.long, device=source.device)
            out = []
            for t in range(N):
                out.append(decoder.step(cache, fed, torch.tensor(t, device=source.device)).double().cpu().numpy())
                fed = torch.as_tensor(tokens[:, t], device=source.device)
    finally:
        model.train(was_training)
    return np.stack(out, axis=1)


def _flax_step_logits(model, source, tokens):
    """(B, N, V) float64: Flax's cached decoder's logits at each step of ``tokens`` (B, N)."""
    graphdef, state = decoding.eval_split(model)  # the caller's model stays in its mode
    return np.asarray(_flax_replay(graphdef, state, source, jnp.asarray(tokens, source.dtype)), np.float64)


@functools.partial(jax.jit, static_argnums=0)
def _flax_replay(graphdef, state, source, tokens):
    # Compiled: eagerly, each of the step's operations compiles on its own, which costs more.
    B, N = tokens.shape
    cache = decoding.prefill(nnx.merge(graphdef, state), source, N)
    fed = jnp.concatenate([jnp.full((B, 1), flax_data.BOS, tokens.dtype), tokens[:, :-1]], axis=1)  # (B, N)

    def step(cache, t_and_fed):
        t, fed_t = t_and_fed
        # The body's own copy of the model: nnx transforms refuse Variables of another trace.
        logits, cache = decoding.decode_one_token(nnx.merge(graphdef, state, copy=True), cache, fed_t, t)
        return cache, logits

    _, logits = jax.lax.scan(step, cache, (jnp.arange(N), fed.T))  # (N, B, V)
    return logits.transpose(1, 0, 2)
