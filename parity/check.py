"""One parity check: both twins on the same seeded, padded batch; every intermediate and,
optionally, the gradients of the training loss.

The pieces stay separate so that a test can change one twin between building and checking
(a planted fault) without any hook in the command line::

    torch_model, flax_model = twins_from_state_dict(state_dict, config)
    flax_model.encoder.transformer_layers[1].norm2.epsilon = 1e-1
    report = check_twins(torch_model, flax_model, config)
    report.first_divergence.name  # 'encoder.transformer_layers.1.norm2'

Call ``parity_numerics()`` first (the command line does): parity needs exact float32 matmuls.
"""

import numpy as np

from parity import engine, in_float64
from parity.compare import compare_models, model_intermediates, say_notes
from parity.convert import tensor_to_numpy
from parity.flax_io import abstract_model
from parity.report import Report
from parity.gradients import gradient_rows
from parity.policy import DEFAULT_ATOL, FLOAT64_ATOL, check_tolerance
from parity.tied import own_ties
from parity.twins import as_inputs, sample_batch, twins_from_state_dict


def check_twins(torch_model, flax_model, config, *, batch=4, seed=0, atol=None, grads=False,
                float64_reference=False, float64=False) -> Report:
    """Compare two twins (both in eval mode) of ``config`` on ``sample_batch(config, batch, seed)``.

    Rows: every submodule output in torch's execution order; with ``grads``, then the loss and
    every parameter's gradient in torch's parameter order. ``float64_reference``: each output
    (and with ``grads`` the loss and each gradient) is also measured against the torch twin in
    float64, and one beyond ``atol`` agrees when Flax's error there is as torch's own
    (parity/float64_reference.py: FLOAT64_FACTOR times its root mean square,
    FLOAT64_LARGEST_FACTOR times its largest). ``float64``: copies of both twins run in float64
    instead (parity/in_float64.py), judged at ``FLOAT64_ATOL`` unless ``atol`` is given: neither
    side's float32 rounding hides a slip, and no factor stands in for the port's exactness.
    ``atol``: None is the parity policy's 1e-5 (``FLOAT64_ATOL`` with ``float64``).
    """
    if float64 and float64_reference:
        raise ValueError("check_twins: float64 runs both twins in float64 and float64_reference judges the float32 "
                         "twins against torch's float64 one: give one of them")
    if atol is not None:
        check_tolerance(atol, "check_twins", float64=float64)
    source, target = sample_batch(config, batch=batch, seed=seed)
    torch_inputs, flax_inputs = as_inputs(source, target)
    if float64:
        return _check_in_float64(torch_model, flax_model, source, target, torch_inputs, flax_inputs,
                                 FLOAT64_ATOL if atol is None else atol, grads)
    atol = DEFAULT_ATOL if atol is None else atol
    named = model_intermediates(torch_model, flax_model, torch_inputs, flax_inputs)
    report = compare_models(torch_model, flax_model, torch_inputs, flax_inputs, atol=atol, named=named)
    if float64_reference:
        from parity.float64_reference import judge_against_float64

        judge_against_float64(report, torch_model, named, torch_inputs)
    if grads:
        report.rows.extend(gradient_rows(torch_model, flax_model, source, target, atol,
                                         float64_reference=float64_reference))
    return report


def _check_in_float64(torch_model, flax_model, source, target, torch_inputs, flax_inputs, atol, grads):
    """``check_twins`` with float64 copies of both twins (the callers' stay float32)."""
    torch64, torch_inputs = in_float64.torch_in_float64(torch_model, torch_inputs)
    with in_float64.x64():
        flax64, flax_inputs = in_float64.flax_in_float64(flax_model, flax_inputs)
        named = model_intermediates(torch64, flax64, torch_inputs, flax_inputs)
        report = compare_models(torch64, flax64, torch_inputs, flax_inputs, atol=atol, named=named)
        if grads:
            report.rows.extend(gradient_rows(torch64, flax64, source, target, atol))
    report.float64 = True
    return say_notes(report, in_float64.narrower_rows_note(named[1]))


def refuse_unusable_weights(state_dict, config):
    """Raise ConversionError, before any comparison, for weights a parity check cannot judge.

    First the strict checks of ``parity convert`` (every key, shape, and a floating-point
    dtype: torch's load_state_dict would silently cast int64 weights to float), in its words;
    then non-finite values, by key: NaN is never within any tolerance (NaN != NaN), so a NaN
    weight would be reported as a divergence of the port when the checkpoint is at fault.
    """
    model = abstract_model(config)
    tie, untied = own_ties(model), {}
    if tie is not None:  # a tied model's copies: each its table bit for bit, then left out
        state_dict, untied = tie.forward(state_dict, read=tensor_to_numpy)
    arrays = engine.check_torch(engine.plan(model), state_dict, "Transformer", read=tensor_to_numpy, invalid=untied)
    lines, invalid = [], {}
    for name, found in (("NaN", np.isnan), ("Inf", np.isinf)):
        keys = [key for key, array in arrays.items() if found(array).any()]
        invalid.update({key: f"contains {name}" for key in keys})
        if keys:
            lines.append(f"weights contain {name}: key{'s' if len(keys) > 1 else ''} {', '.join(map(repr, keys))}")
    if lines:
        raise engine.ConversionError(
            "; ".join(lines) + f" ({len(invalid)} of {len(arrays)} tensors); a parity check compares finite "
            "numbers only, so fix the checkpoint (or the run that wrote it) first", invalid=invalid)


def check_checkpoint(state_dict, config, *, batch=4, seed=0, atol=None, grads=False,
                     float64_reference=False, float64=False) -> Report:
    """Load ``state_dict`` into both twins of ``config`` (strictly) and check them; weights
    that cannot be judged (``refuse_unusable_weights``) raise ConversionError first."""
    if atol is not None:
        check_tolerance(atol, "check_checkpoint", float64=float64)
    refuse_unusable_weights(state_dict, config)
    torch_model, flax_model = twins_from_state_dict(state_dict, config, seed=seed)
    return check_twins(torch_model, flax_model, config, batch=batch, seed=seed, atol=atol, grads=grads,
                       float64_reference=float64_reference, float64=float64)
