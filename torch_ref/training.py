"""Loss, optimizer, schedule and one training step in plain PyTorch.

The twin of ``flaxformer_mini.train``: same loss (cross-entropy over the non-padding
target tokens), same optimizer (Adam, or AdamW with decoupled weight decay), same learning-
rate schedules and the same global-norm clipping, so that the parity suite can run both for
N steps from the same weights and compare the parameters at the end.

Batches hold ``source`` (B, S), ``target_in`` (B, T) and ``target_out`` (B, T) token ids
(``flaxformer_mini.data.Batch``, or anything with those attributes), as numpy arrays or
torch tensors. This module never imports JAX or Flax.
"""

import math

import torch
import torch.nn.functional as F

PAD = 0  # the padding id; flaxformer_mini.data.PAD (not imported: torch_ref stands alone)

SCHEDULES = ("rsqrt", "constant", "cosine")


def token_cross_entropy(logits, labels, label_smoothing=0.0, pad_id=PAD):
    """Cross-entropy averaged over the non-padding target tokens.

    ``logits`` (B, T, V), ``labels`` (B, T). The log-softmax runs in float32 at least:
    bfloat16 and float16 logits are widened, float64 ones (a twin run in float64 as a
    reference) stay float64. Equals ``F.cross_entropy(..., ignore_index=pad_id, reduction="mean")``,
    except for a batch without any label: that gives 0 here, as in the Flax twin (which
    divides by max(count, 1)), where the mean reduction gives NaN (0 / 0).
    """
    labels = labels.long()
    total = F.cross_entropy(
        logits.to(torch.promote_types(logits.dtype, torch.float32)).flatten(0, 1),
        labels.flatten(),
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
    count = (labels != pad_id).sum().clamp(min=1)
    return total / count


def rsqrt_learning_rate(step, d_model, lr_factor=1.0, warmup_steps=4000):
    """The warm-up + inverse square root schedule of "Attention Is All You Need":
    factor * D^-0.5 * min(n^-0.5, n * warmup^-1.5), n = step + 1 (``step`` counts from 0,
    like optax's update count and LambdaLR's epoch; the paper counts from 1).

    Computed in Python floats (float64); the Flax twin evaluates it in float32, so the two
    agree to float32 rounding (~1e-7 relative).
    """
    n = step + 1
    return lr_factor * d_model**-0.5 * min(n**-0.5, n * warmup_steps**-1.5)


def cosine_learning_rate(step, peak, warmup_steps, decay_steps):
    """Linear warm-up from ``peak / warmup_steps`` (update 0) to ``peak`` (update
    ``warmup_steps``), then a half cosine to 0 at update ``decay_steps``, then 0: the values of
    ``optax.warmup_cosine_decay_schedule(peak / warmup_steps, peak, warmup_steps, decay_steps)``.
    Written out because torch's CosineAnnealingLR updates its rate recursively (a product of
    ratios), which drifts from the closed form the Flax twin evaluates."""
    if step < warmup_steps:
        start = peak / warmup_steps
        return start + (peak - start) * step / warmup_steps
    done = min(step - warmup_steps, decay_steps - warmup_steps) / (decay_steps - warmup_steps)
    return peak * 0.5 * (1.0 + math.cos(math.pi * done))


def _model_width(model):
    try:
        return model.encoder.embedding_layer.embedding_dim
    except AttributeError:
        raise ValueError(
            f"cannot read the model width from {type(model).__name__}; pass d_model= for schedule='rsqrt'"
        ) from None


def make_optimizer(
    model,
    *,
    schedule="rsqrt",
    learning_rate=1e-3,
    lr_factor=1.0,
    warmup_steps=4000,
    decay_steps=None,
    d_model=None,
    b1=0.9,
    b2=0.98,
    eps=1e-9,
    weight_decay=0.0,
):
    """``(optimizer, lr_scheduler)`` with the semantics of ``flaxformer_mini.train.optimizer.TrainConfig``.

    ``schedule='rsqrt'``: ``rsqrt_learning_rate`` with ``lr_factor``, ``warmup_steps`` and
    ``d_model`` (default: the model's embedding width). ``schedule='constant'``:
    ``learning_rate`` throughout. ``schedule='cosine'``: ``cosine_learning_rate`` to
    ``learning_rate`` and 0 at ``decay_steps``. Adam with the paper's betas and epsilon by default;
    ``weight_decay > 0`` switches to AdamW (decoupled decay, as ``optax.adamw``).

    Call ``scheduler.step()`` after every ``optimizer.step()`` (``train_step`` does): the
    learning rate of update ``i`` (from 0) is then the schedule at ``i``, as in optax, where
    the schedule reads the update count before it is incremented.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
    if schedule == "cosine" and not (isinstance(decay_steps, int) and decay_steps > warmup_steps):
        raise ValueError(f"schedule 'cosine' needs decay_steps above warmup_steps {warmup_steps}, got {decay_steps!r}")
    if schedule == "rsqrt":
        width = _model_width(model) if d_model is None else d_model

        def lr_at(step):
            return rsqrt_learning_rate(step, width, lr_factor, warmup_steps)
    elif schedule == "cosine":

        def lr_at(step):
            return cosine_learning_rate(step, learning_rate, warmup_steps, decay_steps)
    else:

        def lr_at(step):
            return learning_rate

    params = [p for p in model.parameters() if p.requires_grad]
    # Base lr 1.0, so LambdaLR's lr (base * lambda) is exactly the schedule's value.
    # torch.optim.Adam's own weight_decay is an L2 term added to the gradient (coupled); the
    # decoupled decay of optax.adamw is torch.optim.AdamW. Mind AdamW's default decay of
    # 0.01: it is always passed explicitly here.
    if weight_decay > 0:
        optimizer = torch.optim.AdamW(params, lr=1.0, betas=(b1, b2), eps=eps, weight_decay=weight_decay)
    else:
        optimizer = torch.optim.Adam(params, lr=1.0, betas=(b1, b2), eps=eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    return optimizer, scheduler


@torch.no_grad()
def global_norm(tensors):
    """sqrt of the sum of squares of every entry, in float32 (``optax.global_norm``)."""
    tensors = list(tensors)
    total = torch.zeros((), device=tensors[0].device if tensors else None)
    for t in tensors:
        total = total + t.float().square().sum()
    return torch.sqrt(total)


@torch.no_grad()
def clip_grad_norm(parameters, max_norm):
    """Scale the gradients by ``max_norm / norm`` when their global L2 norm exceeds
    ``max_norm``; return the norm (before clipping) as a float32 tensor.

    This is ``optax.clip_by_global_norm``'s formula, not ``torch.nn.utils.clip_grad_norm_``'s.
    torch scales by ``max_norm / (norm + 1e-6)`` (clamped to 1), so it also shrinks a gradient
    whose norm is just below ``max_norm``, and a clipped gradient ends up with norm slightly
    under ``max_norm``; optax leaves a norm < max_norm untouched and scales a larger one to
    exactly ``max_norm``. The difference is ~1e-6 relative: small, but a systematic departure
    that the parity suite should not have to absorb in its tolerances.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = global_norm(grads)
    if norm >= max_norm:  # optax keeps the gradient only when norm < max_norm
        # (g / norm) * max_norm, in that order, as optax computes it.
        for g in grads:
            g.div_(norm.to(g.dtype)).mul_(max_norm)
    return norm


def _tokens(x):
    return torch.as_tensor(x, dtype=torch.int64)


def train_step(model, optimizer, scheduler, batch, clip_norm=1.0, label_smoothing=0.0):
    """One update: forward ``(source, target_in)``, loss against ``target_out``, backward,
    clip (``clip_norm=None`` turns clipping off), ``optimizer.step()``, ``scheduler.step()``.

    The model's mode (``model.train()`` / ``eval()``) is the caller's business. Returns
    ``{"loss": float, "grad_norm": float, "learning_rate": float}``: the loss before the
    update, the global gradient norm before clipping, and the learning rate this update used.
    """
    device = next(model.parameters()).device
    source, target_in, target_out = (_tokens(x).to(device) for x in (batch.source, batch.target_in, batch.target_out))
    learning_rate = scheduler.get_last_lr()[0]

    optimizer.zero_grad(set_to_none=True)
    logits = model(source, target_in)
    loss = token_cross_entropy(logits, target_out, label_smoothing)
    loss.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if clip_norm is not None:
        grad_norm = clip_grad_norm(params, clip_norm)
    else:
        grad_norm = global_norm([p.grad for p in params if p.grad is not None])
    optimizer.step()
    scheduler.step()
    return {"loss": loss.item(), "grad_norm": grad_norm.item(), "learning_rate": learning_rate}


__all__ = ["PAD", "token_cross_entropy", "rsqrt_learning_rate", "cosine_learning_rate", "make_optimizer", "global_norm", "clip_grad_norm", "train_step"]
