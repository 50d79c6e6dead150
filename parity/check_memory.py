"""The memory ``parity check`` holds at once, estimated before it runs: both twins' parameters
(``model_bytes``), and every submodule output of both twins for the whole batch, which the
comparison keeps until it has compared them all (``check_bytes``).

Each output is recorded as a float32 copy per twin; ``--float64-reference`` adds the torch
twin's float64 copy, and ``--grads`` the activations each twin's backward pass keeps. Every
output's leading axis is the batch, so one row's outputs, counted on a forward of one row,
scale to the whole batch.
"""

import torch

from flaxformer_mini.model import memory
from parity.compare import torch_intermediates
from parity.twins import as_inputs, sample_batch

FLOAT32_RECORDS = 4 + 4  # bytes per output element: each twin's float32 copy
FLOAT64_RECORD = 8  # --float64-reference: the torch twin's float64 copy
GRADIENT_ACTIVATIONS = 4 + 4  # --grads: the activations each twin's backward keeps
FLOAT32_PARAMETERS = 4 + 4  # bytes per parameter: each twin's float32 copy
FLOAT64_PARAMETERS = 8  # --float64-reference: the torch twin's float64 copy


def model_bytes(config, *, float64_reference=False, grads=False, float64=False):
    """The bytes of both twins' parameters, the torch twin's float64 copy with
    ``float64_reference``, and with ``grads`` a gradient of each of them. ``float64``: both
    twins' float64 copies beside the float32 twins, the gradients of the copies alone."""
    if float64:
        per_parameter = FLOAT32_PARAMETERS + 2 * FLOAT64_PARAMETERS * (1 + grads)
    else:
        per_parameter = (FLOAT32_PARAMETERS + FLOAT64_PARAMETERS * float64_reference) * (1 + grads)
    return per_parameter * memory.param_count(config)


def bytes_per_element(float64_reference=False, grads=False, float64=False):
    """``float64``: both twins' records and activations in float64, twice float32's."""
    return ((FLOAT32_RECORDS + GRADIENT_ACTIVATIONS * grads) * (1 + float64)
            + FLOAT64_RECORD * float64_reference)


def elements_per_row(torch_model, config):
    """Elements of the submodule outputs the check records for one row of its batch: a
    forward of one seeded row through the torch twin (no grad; a fraction of the check's own)."""
    (inputs, _) = as_inputs(*sample_batch(config, batch=1))
    _, named = torch_intermediates(torch_model, *inputs)
    return sum(value.size for value in named.values())


def elements_per_row_bound(torch_model, config):
    """At least ``elements_per_row``, from the module count and the widest output a module of
    the seed's Transformer gives (model width, feed-forward width, vocabularies, attention
    scores over the sequence per head), without running the model."""
    c = config
    modules = sum(1 for m in torch_model.modules() if not isinstance(m, torch.nn.Sequential))
    width = max(c.embed_size, c.feed_forward_width, c.source_vocab_size, c.target_vocab_size, c.heads * c.max_len)
    return modules * c.max_len * width


def check_bytes(torch_model, config, batch, *, float64_reference=False, grads=False, float64=False, bound=False):
    """The bytes the check's records of ``batch`` rows take (``bound``: an upper bound without a forward)."""
    per_row = (elements_per_row_bound if bound else elements_per_row)(torch_model, config)
    return batch * per_row * bytes_per_element(float64_reference, grads, float64)
