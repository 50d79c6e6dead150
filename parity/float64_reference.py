"""Judge each output against the torch twin run in float64: ``parity check --float64-reference``.

The tolerance of the parity policy (1e-5, absolute) holds for the twins at initialisation, and
the suite holds them to it. A trained model can exceed it from float32 rounding alone: large
activations and weights amplify each rounding, in torch as much as in Flax. So, for each
compared output, this measures both float32 twins against the torch twin in float64 (the
nearest thing to the exact value either side has; JAX computes in float32 unless x64 is on)
and lets a row beyond the tolerance pass when the Flax twin's errors are those of a model as
exact as torch: their root mean square at most ``FLOAT64_FACTOR`` times torch's, and their
largest at most ``FLOAT64_LARGEST_FACTOR`` times torch's largest (parity/policy.py says why
two statistics). A port's bug (a wrong epsilon, a mask off by one) leaves Flax far from
float64 while torch stays near it, and still fails.

Shapes: whatever each compared output's shape is; errors are absolute differences.
"""

import dataclasses

import numpy as np

from parity.compare import match_tuple_outputs, torch_intermediates
from parity.in_float64 import torch_in_float64
from parity.policy import FLOAT64_FACTOR, FLOAT64_LARGEST_FACTOR, FLOAT64_ULPS


@dataclasses.dataclass(frozen=True)
class Float64Errors:
    """Each float32 twin's absolute error against the float64 value: the largest and the root
    mean square over the output's elements; and Flax's largest in float32 rounding steps (the
    spacing of float32 numbers at the float64 value)."""

    torch_largest: float
    flax_largest: float
    torch_rms: float
    flax_rms: float
    flax_ulps: float = float("inf")

    def as_exact_as_torch(self, factor=FLOAT64_FACTOR, largest_factor=FLOAT64_LARGEST_FACTOR, ulps=FLOAT64_ULPS):
        return ((self.flax_rms <= factor * self.torch_rms and self.flax_largest <= largest_factor * self.torch_largest)
                or self.flax_ulps <= ulps)


def float64_errors(torch32, flax32, exact) -> Float64Errors:
    """The errors of ``torch32`` and ``flax32`` (the twins' float32 outputs) against ``exact``.

    An element equal to ``exact`` has error 0, infinities included (a score masked with -inf on
    all three sides), as ``report._differences`` counts it. An element where both twins hold
    the same non-finite value (both overflowed) is left out: they are equally wrong there, and
    its infinite error would hide any error of Flax's elsewhere. Twins that differ there never
    reach this: their row has a note."""
    exact = np.asarray(exact, np.float64)
    t32, f32 = np.asarray(torch32, np.float64), np.asarray(flax32, np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf where equal, set to 0
        t = np.where(t32 == exact, 0.0, np.abs(t32 - exact))
        f = np.where(f32 == exact, 0.0, np.abs(f32 - exact))
    shared = (t32 == f32) & ~np.isfinite(t)
    with np.errstate(over="ignore", invalid="ignore"):  # a float64 value beyond float32's range: inf steps
        step = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
        ulps = np.where(f == 0, 0.0, f / step)
    t, f, ulps = t[~shared], f[~shared], ulps[~shared]

    def rms(e):
        return float(np.sqrt(np.mean(np.square(e)))) if e.size else 0.0

    return Float64Errors(float(t.max(initial=0.0)), float(f.max(initial=0.0)), rms(t), rms(f),
                         float(ulps.max(initial=0.0)))


def judge_against_float64(report, torch_model, named, torch_inputs, factor=FLOAT64_FACTOR,
                          largest_factor=FLOAT64_LARGEST_FACTOR):
    """Fill each intermediate row's float64 errors (``torch_f64``/``flax_f64``, the largest;
    ``torch_f64_rms``/``flax_f64_rms``) and re-judge the rows beyond the tolerance by
    ``factor`` and ``largest_factor`` (``judge_row``); the loss and gradient rows are judged by
    ``parity.gradients.gradient_rows``, which has their values. ``named``: the float32 twins' intermediates the report compared
    (``compare.model_intermediates``). ``report`` is changed in place and returned."""
    t32, f32 = named
    f32 = match_tuple_outputs(t32, f32)
    model64, inputs = torch_in_float64(torch_model, torch_inputs)  # a copy: the caller's twin stays float32
    _, t64 = torch_intermediates(model64, *inputs, sequential=True)
    for row in report.rows:
        if row.kind == "intermediate" and row.name in t64 and row.name in f32:
            judge_row(row, t32[row.name], f32[row.name], t64[row.name], factor, largest_factor)
    report.float64_factor, report.float64_largest_factor = factor, largest_factor
    return report


def judge_row(row, torch32, flax32, exact, factor=FLOAT64_FACTOR, largest_factor=FLOAT64_LARGEST_FACTOR):
    """Fill ``row``'s float64 errors from the twins' float32 values and ``exact``, and let a row
    beyond the tolerance agree when Flax's errors are as torch's (``Float64Errors``). A row with
    a note (missing, shape, NaN) is left as it is."""
    if row.note:
        return
    errors = float64_errors(torch32, flax32, exact)
    row.torch_f64, row.flax_f64 = errors.torch_largest, errors.flax_largest
    row.torch_f64_rms, row.flax_f64_rms = errors.torch_rms, errors.flax_rms
    if not row.ok:
        row.ok = errors.as_exact_as_torch(factor, largest_factor)
