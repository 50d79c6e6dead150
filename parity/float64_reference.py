"""Judge each output against the torch twin run in float64: ``parity check --float64-reference``.

The tolerance of the parity policy (1e-5, absolute) holds for the twins at initialisation, and
the suite holds them to it. A trained model can exceed it from float32 rounding alone: large
activations and weights amplify each rounding, in torch as much as in Flax. So, for each
compared output, this measures both float32 twins against the torch twin in float64 (the
nearest thing to the exact value either side has; JAX computes in float32 unless x64 is on)
and lets a row beyond the tolerance pass when the Flax twin's error is at most
``FLOAT64_FACTOR`` times torch's own: the port is then as exact as the model it ports. A
port's bug (a wrong epsilon, a mask off by one) leaves Flax far from float64 while torch stays
near it, and still fails.

Shapes: whatever each compared output's shape is; errors are max absolute differences.
"""

import copy

import numpy as np

from parity.compare import _match_tuple_outputs, torch_intermediates
from parity.policy import FLOAT64_FACTOR


def judge_against_float64(report, torch_model, named, torch_inputs, factor=FLOAT64_FACTOR):
    """Fill each intermediate row's ``torch_f64`` and ``flax_f64`` (each float32 twin's max
    absolute error against the torch twin in float64) and re-judge the rows beyond the
    tolerance by ``factor``; gradient rows, and rows with a note (missing, shape, NaN), stay as
    they are. ``named``: the float32 twins' intermediates the report compared
    (``compare.model_intermediates``). ``report`` is changed in place and returned."""
    t32, f32 = named
    f32 = _match_tuple_outputs(t32, f32)
    # A copy, so the caller's twin stays float32; the inputs are token ids, unchanged.
    _, t64 = torch_intermediates(copy.deepcopy(torch_model).double(), *torch_inputs, sequential=True)
    for row in report.rows:
        if row.kind != "intermediate" or row.note or row.name not in t64 or row.name not in f32:
            continue
        exact = np.asarray(t64[row.name], np.float64)
        row.torch_f64 = float(np.abs(np.asarray(t32[row.name], np.float64) - exact).max(initial=0.0))
        row.flax_f64 = float(np.abs(np.asarray(f32[row.name], np.float64) - exact).max(initial=0.0))
        if not row.ok:
            row.ok = row.flax_f64 <= factor * row.torch_f64
    report.float64_factor = factor
    return report
