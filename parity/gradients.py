"""Gradients of the same loss in both twins, parameter by parameter.

The loss is the project's token cross-entropy (``torch_ref.training`` and
``flaxformer_mini.train.loss``), averaged over non-padding labels, with next-token labels: the
target shifted left by one, padded at the end. torch's ``param.grad`` is compared with the
Flax gradient put into a clone of the Flax model and converted with ``flax_to_torch``, so
both sides are keyed by torch names and laid out as torch lays them out.

One family is rounding noise on both sides: ``W_k.bias`` adds ``q . b_k`` to every score of a
query row, and the softmax over keys ignores a per-row constant, so its gradient is exactly
zero in exact arithmetic; float32 gives ~1e-9 in each framework, far within an absolute
tolerance.
"""

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from flaxformer_mini.data import PAD
from flaxformer_mini.train.loss import token_cross_entropy as flax_token_cross_entropy
from parity import in_float64
from parity.compare import check_inputs, check_unwrapped, on_device_of, random_layer_notes, say_notes
from parity.model_kinds import check_pair
from parity.report import GRAD_PREFIX, LOSS_ROW, Report, Row, compared_row
from parity.convert import flax_to_torch, tensor_to_numpy
from parity.policy import DEFAULT_ATOL, FLOAT64_ATOL, check_tolerance
from parity.row_selection import listed
from torch_ref.training import token_cross_entropy as torch_token_cross_entropy

SIGNATURE = "torch_model, flax_model, torch_loss, flax_loss, torch_inputs, flax_inputs, ..."


def next_token_labels(target, pad_id=PAD):
    """Labels (B, T) for inputs ``target`` (B, T): ``labels[:, t] = target[:, t + 1]``, the
    last position padded (it has no next token)."""
    target = np.asarray(target)
    labels = np.full_like(target, pad_id)
    labels[:, :-1] = target[:, 1:]
    return labels


def _torch_loss_and_grads(model, source, target, labels, pad_id):
    # Every name of a tied parameter (tie_embeddings): its one gradient under each key, as
    # flax_to_torch writes the Flax table's under each (named_parameters() lists it once).
    params = dict(model.named_parameters(remove_duplicate=False))
    for p in params.values():
        p.grad = None
    try:
        source, target, labels = on_device_of(model, map(torch.from_numpy, (source, target, labels)))
        loss = torch_token_cross_entropy(model(source, target), labels, pad_id=pad_id)
        loss.backward()
        grads = {name: tensor_to_numpy(p.grad if p.grad is not None else torch.zeros_like(p)).copy()
                 for name, p in params.items()}
    finally:
        for p in params.values():  # leave the model as it was given
            p.grad = None
    return float(loss.item()), grads


def _flax_loss(model, source, target, labels, pad_id):
    return flax_token_cross_entropy(model(source, target), labels, pad_id=pad_id)[0]


# Compiled, as training runs it: one XLA program compiles faster than the hundreds of
# primitives an eager backward pass compiles one by one, and reruns in milliseconds.
_flax_value_and_grad = nnx.jit(nnx.value_and_grad(_flax_loss), static_argnums=4)


def _flax_loss_and_grads(model, source, target, labels, pad_id):
    loss, grads = _flax_value_and_grad(model, *map(jnp.asarray, (source, target, labels)), pad_id)
    # Put the gradients where the parameters were, so the converter names them as torch does
    # and lays them out as torch does (kernels transposed back into weights).
    holder = nnx.clone(model)
    nnx.update(holder, grads)
    return float(loss), {name: tensor_to_numpy(g) for name, g in flax_to_torch(holder).items()}


def gradient_rows(torch_model, flax_model, source, target, atol, pad_id=PAD, float64_reference=False):
    """Rows comparing the loss and every parameter's gradient, in torch's parameter order.

    ``source`` (B, S) and ``target`` (B, T) are int numpy arrays; both models should be in
    eval mode (dropout off), as for the forward comparison. ``float64_reference``: each row is
    also measured against the loss and gradients of the torch twin in float64, and one beyond
    ``atol`` agrees when Flax's errors are as torch's (``float64_reference.judge_row``): a
    gradient sums over every position of the batch, so its float32 rounding grows with the
    batch in torch as in Flax.
    """
    labels = next_token_labels(target, pad_id)
    torch_loss, torch_grads = _torch_loss_and_grads(torch_model, source, target, labels, pad_id)
    flax_loss, flax_grads = _flax_loss_and_grads(flax_model, source, target, labels, pad_id)

    rows = [compared_row(LOSS_ROW, (), flax_loss, torch_loss, atol)]
    rows.extend(_grad_rows(torch_grads, flax_grads, atol))
    if float64_reference:
        from parity.float64_reference import judge_row

        exact_loss, exact_grads = _torch_loss_and_grads(in_float64.torch_in_float64(torch_model, ())[0], source, target,
                                                         labels, pad_id)
        judge_row(rows[0], torch_loss, flax_loss, exact_loss)
        for row in rows[1:]:
            name = row.name[len(GRAD_PREFIX):]
            if name in torch_grads and name in flax_grads:
                judge_row(row, torch_grads[name], flax_grads[name], exact_grads[name])
    return rows


def compare_gradients(torch_model, flax_model, torch_loss, flax_loss, torch_inputs, flax_inputs, atol=None,
                      rename=None, rules=None, channels_last=False, tied=None, float64=False):
    """A Report of the loss and every parameter's gradient, for any pair of models and a loss
    the user gives on each side: ``torch_loss(torch_model, *torch_inputs)`` (a scalar tensor)
    and ``flax_loss(flax_model, *flax_inputs)`` (a scalar); torch inputs are moved to the torch
    model's device first, as in ``compare``. Flax gradients are converted to
    torch names and layout (``flax_to_torch`` with ``rename`` and ``rules``), then compared
    with each ``param.grad`` in torch's parameter order. A torch parameter frozen with
    ``requires_grad=False`` has no gradient to compare (torch's is zero by construction, not
    by computation): it is listed in ``Report.left_out`` instead. ``tied``: as ``torch_to_flax``
    takes it, for the call's symmetry; a tied copy is one torch parameter, with one gradient.
    A gradient of an ``nn.Embedding(padding_idx=P)`` weight that differs in row P alone is
    said in a note: torch gives the padding row no gradient, ``nnx.Embed`` does.

    ``atol``: as in ``compare`` (None: the parity policy's 1e-5, or ``FLOAT64_ATOL``, 1e-10,
    with ``float64``). ``float64``: as in ``compare``, both losses and their gradients are
    computed on float64 copies of the models with the float inputs cast (the caller's models
    stay as they are), where a slip smaller than float32's tolerance still fails. A loss that
    comes back narrower than float64 was computed in that dtype (a cast in the loss, as
    ``flaxformer_mini``'s ``token_cross_entropy`` makes, or in the model): a note says so."""
    if atol is not None:
        check_tolerance(atol, "compare_gradients", float64=float64)
    check_pair(torch_model, flax_model, "compare_gradients", SIGNATURE)
    for side, loss in (("torch_loss", torch_loss), ("flax_loss", flax_loss)):
        if not callable(loss):
            raise TypeError(f"compare_gradients: {side} is a function of the model and its inputs, got a "
                            f"{type(loss).__name__}: the losses come before the inputs, compare_gradients({SIGNATURE})")
    check_unwrapped(torch_model, "compare_gradients")
    check_inputs(torch_inputs, flax_inputs, channels_last, who="compare_gradients")
    notes = random_layer_notes(torch_model, flax_model)
    params = dict(torch_model.named_parameters())
    # Buffers (running statistics) have no gradient, and a tied copy's key is its table's one
    # parameter; any other key is a Flax parameter, matched to torch's or listed as unmatched.
    no_gradient = ({k for k, _ in torch_model.named_buffers(remove_duplicate=False)}
                   | {k for k, _ in torch_model.named_parameters(remove_duplicate=False)} - set(params))
    convert = {"rename": rename, "rules": rules, "tied": tied}
    if float64:
        atol = FLOAT64_ATOL if atol is None else atol
        torch_value, torch_grads = _user_torch_grads(*in_float64.torch_in_float64(torch_model, torch_inputs),
                                                     torch_loss)
        with in_float64.x64():  # the cast, the loss, its gradient and the conversion
            flax_value, flax_grads = _user_flax_grads(*in_float64.flax_in_float64(flax_model, flax_inputs),
                                                      flax_loss, no_gradient, convert)
        notes += in_float64.narrower_loss_note({"torch": torch_value, "Flax": flax_value})
    else:
        torch_value, torch_grads = _user_torch_grads(torch_model, torch_inputs, torch_loss)
        flax_value, flax_grads = _user_flax_grads(flax_model, flax_inputs, flax_loss, no_gradient, convert)
    atol = DEFAULT_ATOL if atol is None else atol
    frozen = [k for k, p in params.items() if not p.requires_grad]
    for k in frozen:
        torch_grads.pop(k), flax_grads.pop(k, None)
    report = Report([compared_row(LOSS_ROW, (), float(flax_value), float(torch_value), atol),
                     *_grad_rows(torch_grads, flax_grads, atol)], atol,
                    left_out=[(GRAD_PREFIX + k, "frozen in torch by requires_grad=False") for k in frozen])
    unmatched = [k for k in torch_grads if k not in flax_grads] + [k for k in flax_grads if k not in torch_grads]
    copies = sorted({k for k, _ in torch_model.named_parameters(remove_duplicate=False)} - set(params))
    if unmatched:  # the usual cause is a port with names of its own, given no rename map here
        notes.append((f"{len(unmatched)} gradient(s) only one side has ({listed(unmatched)}): the Flax parameters' "
                      f"names, converted to torch's, do not meet torch's there; a port whose paths differ from "
                      f"torch's gives compare_gradients the rename map (and rules) it gives torch_to_flax"
                      + (f"; torch ties {listed(copies)} to other parameters: give it the tied= it gives torch_to_flax"
                         if copies and tied is None else ""), False))
    return say_notes(report, notes + _padding_row_notes(torch_model, report, torch_grads, flax_grads, atol))


def _user_torch_grads(model, inputs, loss_fn):
    """(the loss as a numpy scalar, {name: numpy gradient}) of ``loss_fn(model, *inputs)``;
    every ``.grad`` of the model is None afterwards, as it was given."""
    params = dict(model.named_parameters())
    for p in params.values():
        p.grad = None
    try:
        loss = loss_fn(model, *on_device_of(model, inputs))
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
                   else f"a {type(loss).__name__}")
            raise TypeError(f"compare_gradients: torch_loss(torch_model, *torch_inputs) returned {got}: it returns the "
                            f"loss as a one-element tensor (not loss.item(); a batch's losses reduced by .mean() or "
                            f".sum()), whose gradient torch takes")
        loss.backward()
        grads = {k: tensor_to_numpy(p.grad if p.grad is not None else torch.zeros_like(p)).copy()
                 for k, p in params.items()}
    finally:
        for p in params.values():
            p.grad = None
    return tensor_to_numpy(loss), grads


def _user_flax_grads(model, inputs, loss_fn, no_gradient, convert):
    """(the loss, {torch name: numpy gradient}) of ``loss_fn(model, *inputs)``, the gradients
    converted by ``flax_to_torch`` (``convert``: its rename, rules and tied) and those of
    ``no_gradient``'s keys left out."""
    value, grads = nnx.value_and_grad(lambda m: loss_fn(m, *inputs))(model)
    holder = nnx.clone(model)
    nnx.update(holder, grads)
    return value, {k: tensor_to_numpy(g) for k, g in flax_to_torch(holder, **convert).items() if k not in no_gradient}


def _padding_row_notes(torch_model, report, torch_grads, flax_grads, atol):
    """[(note, certain)] for each failed embedding gradient that differs only in its module's
    padding row, which ``nn.Embedding(padding_idx=P)`` never gives a gradient."""
    failed = {row.name for row in report.rows if not row.ok}
    notes = []
    for name, module in torch_model.named_modules():
        key = f"{name}.weight" if name else "weight"
        if (not isinstance(module, torch.nn.Embedding) or module.padding_idx is None
                or GRAD_PREFIX + key not in failed or key not in flax_grads):
            continue
        t, f, pad = torch_grads[key], flax_grads[key], module.padding_idx % module.num_embeddings
        # The row failed, so when every other row is within atol the padding row is what differs
        # (by the lookups' gradient: a tied head still gives that row one in torch).
        if t.shape == f.shape and np.abs(np.delete(t - f, pad, axis=0)).max(initial=0.0) <= atol:
            notes.append((f"{GRAD_PREFIX}{key} differs only in row {pad}, the padding row of torch's "
                          f"nn.Embedding(padding_idx={module.padding_idx}), which torch gives no gradient and "
                          f"nnx.Embed does: a port that must train as torch does stops it after the lookup, "
                          f"x = jnp.where((ids == {pad})[..., None], jax.lax.stop_gradient(x), x)", False))
    return notes


def _grad_rows(torch_grads, flax_grads, atol):
    rows = []
    for name, t in torch_grads.items():
        row_name = GRAD_PREFIX + name
        f = flax_grads.get(name)
        if f is None:
            rows.append(Row(row_name, t.shape, float("inf"), float("inf"), False, "no gradient on the Flax side"))
        elif f.shape != t.shape:
            rows.append(Row(row_name, t.shape, float("inf"), float("inf"), False, f"shape differs: Flax {f.shape}"))
        else:
            rows.append(compared_row(row_name, t.shape, f, t, atol))
    for name, f in flax_grads.items():
        if name not in torch_grads:
            rows.append(Row(GRAD_PREFIX + name, f.shape, float("inf"), float("inf"), False, "no gradient on the torch side"))
    return rows
