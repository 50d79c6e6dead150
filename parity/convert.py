"""torch <-> Flax weight conversion for models in memory: torch tensors in, Flax variables set.

The work is ``parity.engine``'s (one plan from the Flax model and ``parity.rules``, one numpy
layout function both ways); this module adds what needs torch: reading tensors (bfloat16
included) and making them, and the user-facing ``torch_to_flax`` / ``flax_to_torch``.

torch key                                   Flax path                                       rule
encoder.transformer_layers.0.attention.W_q.weight  encoder/transformer_layers/0/attention/W_q/kernel  transpose
encoder.embedding_layer.weight              encoder/embedding_layer/embedding               copy
encoder.transformer_layers.0.norm1.weight   encoder/transformer_layers/0/norm1/scale        copy

A scanned model (``Transformer(..., scan_layers=True)``) holds each side's layers stacked: the
same torch keys then read and write slice i of one variable (``parity.rules.STACKS``):

encoder.transformer_layers.2.norm1.weight   encoder/transformer_layers/norm1/scale[2]       copy
"""

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

import torch_ref
from flaxformer_mini.runs.directory import RunDir, best_of, sha256
from parity import engine, flax_io
from parity.engine import ConversionError, layer_depths  # noqa: F401 - public names
from parity.model_kinds import check_flax_model
from parity.rename import Rename
from parity.rules import RULES, Rule, register_rule  # noqa: F401 - public names
from parity.tied import Tied, model_ties


def _plan(model, rules=None):
    return engine.plan(model, rules)


def _tie(tied, the_plan, rename, model):
    """``tied`` ({copy key: the key it is tied to}, the user's torch names) checked against the
    plan's keys as the user names them (after ``rename`` backward), or None for no ties. None
    stands for the model's own ties (``parity.tied.model_ties``: a Transformer built with
    ``tie_embeddings``), named as ``rename`` names their keys; ``{}`` for none at all."""
    what = type(model).__name__
    if tied is None:
        tied = model_ties(model)
        if rename is not None:
            names = Rename(rename)
            tied = {names.user_name(copy): names.user_name(source) for copy, source in tied.items()}
    if isinstance(tied, dict) and not tied:
        return None
    tie = Tied(tied)
    keys = {key: None for key in the_plan}
    if rename is not None:
        keys = Rename(rename).backward(keys, concat=lambda chunks: None)
    tie.check_keys(keys, what)
    return tie


def _concatenated_shape(shapes):
    return (sum(shape[0] for shape in shapes), *shapes[0][1:])


def torch_key_shapes(model, rules=None, rename=None, tied=None):
    """{torch key: torch-layout shape} that ``torch_to_flax`` expects for ``model``.

    ``rename`` / ``tied``: as ``torch_to_flax`` takes them; the keys are then the user's torch
    names (a chunked key's shape is its chunks' concatenated), tied copies included: the torch
    model's ``state_dict()`` keys but those with no Flax variable (a BatchNorm's
    ``num_batches_tracked``, which ``torch_to_flax`` reads nothing from and ``flax_to_torch``
    writes). Without them, the plan's names.
    """
    the_plan = _plan(model, rules)
    tie = _tie(tied, the_plan, rename, model)
    shapes = {key: the_plan.torch_shape(key) for key, links in the_plan.items() if links[0].flax_path is not None}
    if rename is not None:
        shapes = Rename(rename).backward(shapes, concat=_concatenated_shape)
    return shapes if tie is None else tie.backward(shapes)


@dataclasses.dataclass(frozen=True)
class ParamLink:
    """One parameter as both frameworks name and lay it out."""

    torch_key: str  # 'encoder.transformer_layers.0.attention.W_q.weight'
    flax_path: str  # 'encoder/transformer_layers/0/attention/W_q/kernel'
    rule: Rule
    torch_shape: tuple
    flax_shape: tuple  # of the slice ``layer``, for a stacked variable
    layer: int | None = None  # scanned layers: the slice of the stacked Flax variable's axis 0


def param_links(model, rules=None):
    """A ``ParamLink`` for every variable of the Flax model ``model`` (which may be abstract,
    from ``nnx.eval_shape``), in the model's order; ``rule.op_names`` says the layout change.
    A stacked variable (scanned layers) has one ParamLink per layer."""
    return [ParamLink(link.torch_key, link.flax_path, link.rule, link.torch_shape, link.flax_shape, link.layer)
            for link in _plan(model, rules).links if link.flax_path is not None]


def tensor_to_numpy(value):
    """A torch tensor (any float dtype, bfloat16 included) or array-like -> numpy array."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:  # numpy has no bfloat16; ml_dtypes' is bit-identical
            return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return value.numpy()
    return np.asarray(value)


def numpy_to_tensor(array):
    """``array`` as a torch tensor on torch's default device (the CPU unless
    ``torch.set_default_device`` chose another), as torch's own factories make theirs:
    ``torch.from_numpy`` alone would leave it on the CPU beside a model on CUDA."""
    # order="C", not np.ascontiguousarray: that makes a 0-d array (a scalar parameter) 1-d.
    array = np.asarray(array, order="C")
    if array.dtype == ml_dtypes.bfloat16:
        # .copy(), as below: np.asarray of a jax array is a read-only view of its buffer, and a
        # tensor wrapping it would let in-place torch ops write into the Flax parameter.
        tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array.copy())
    return tensor.to(torch.get_default_device())


def _renamed(state_dict, rename):
    if rename is None:
        return state_dict
    if not hasattr(state_dict, "keys"):
        raise ConversionError(f"expected a mapping of torch key -> tensor, got {type(state_dict).__name__}")
    return Rename(rename).forward(state_dict, split=lambda v, n: np.split(tensor_to_numpy(v), n, axis=0))


def check_state_dict(state_dict, model, rules=None, rename=None, tied=None):
    """Everything wrong with loading ``state_dict`` into ``model``, as one ConversionError, or
    (plan, {Flax path: numpy array in Flax layout, the state dict's dtype})."""
    the_plan = _plan(model, rules)
    tie, untied = _tie(tied, the_plan, rename, model), {}
    if tie is not None:  # ties are in the user's names: before the rename map
        state_dict, untied = tie.forward(state_dict, read=tensor_to_numpy)
    try:
        arrays = engine.check_torch(the_plan, _renamed(state_dict, rename), type(model).__name__, read=tensor_to_numpy,
                                    invalid=untied, user_name=None if rename is None else Rename(rename).user_name)
    except ConversionError as e:
        if rename is None or not (e.missing or e.mismatched):
            raise
        # Keys are the Flax model's names; say what each is called in the user's state dict.
        names = {key: Rename(rename).user_name(key) for key in (*e.missing, *e.mismatched)}
        lines = [f"  {key!r} is {user!r} under the rename map" for key, user in names.items() if user != key]
        if not lines:
            raise
        e.args = ("\n".join([str(e), *lines]),)
        raise
    return the_plan, engine.to_flax(the_plan, arrays)


def torch_to_flax(state_dict, model, rename=None, rules=None, tied=None):
    """Load a torch state dict (key -> tensor or array) into the Flax ``model``, in place.

    ``rename``: a rename map (``parity.rename``) for torch names that differ from the Flax
    model's; ``rules``: a rule table in place of ``parity.RULES``; ``tied``: {copy key: the key
    it is tied to} for weights torch ties and the Flax model holds once (``parity.tied``; the
    user's torch names, before ``rename``): each copy must equal its source bit for bit. None:
    the ties the model declares itself (a Transformer built with ``tie_embeddings``; none for
    any other model); ``{}``: none.
    Strict: any missing key, unexpected key, shape mismatch or value of the wrong dtype kind
    raises ConversionError naming all of them, and ``model`` is left exactly as it was. Values
    are cast to each variable's dtype, as torch's load_state_dict copies into its own (an
    integer buffer only from integers that fit it). Returns ``model``.
    """
    check_flax_model(model, "torch_to_flax", "model", swapped="load a torch model's weights with "
                     "torch_model.load_state_dict(state_dict); torch_to_flax loads them into a Flax model")
    _, converted = check_state_dict(state_dict, model, rules, rename, tied)
    variables = engine.flax_variables(model)
    # copy=True: on CPU jnp.asarray may wrap the numpy buffer, which may be the torch tensor's
    # own memory; an in-place torch update after loading would silently change the Flax params.
    values = {path: jnp.array(a, dtype=variables[path].get_value().dtype, copy=True) for path, a in converted.items()}
    # Every value is converted before the first assignment, so nothing is half-loaded.
    for path, value in values.items():
        variables[path].set_value(value)
    return model


def flax_to_torch(model, rename=None, rules=None, tied=None):
    """The torch state dict of the Flax ``model`` (torch keys, torch layout; renamed back by
    ``rename``; each ``tied`` copy written as a tensor of its own, equal to its source; ``tied``
    as ``torch_to_flax`` takes it, None for the model's own ties); the
    torch model loads it with strict=True. Dtypes are the Flax variables' (an int32 buffer
    comes back int32; torch's load_state_dict copies it into its int64 buffer)."""
    check_flax_model(model, "flax_to_torch", "model", swapped="a torch model's state dict is torch_model.state_dict(); "
                     "flax_to_torch converts a Flax model's weights to one")
    the_plan = _plan(model, rules)
    tie = _tie(tied, the_plan, rename, model)
    arrays = engine.to_torch(the_plan, engine.flax_arrays(model))
    if rename is not None:
        arrays = Rename(rename).backward(arrays)
    if tie is not None:
        arrays = tie.backward(arrays)
    return {key: numpy_to_tensor(a) for key, a in arrays.items()}


def flax_params_from_state_dict(state_dict, config):
    """{Flax path: numpy array, Flax layout} from a seed Transformer's torch state dict
    (``parity.flax_io``'s, reading tensors of any dtype, bfloat16 included)."""
    return flax_io.flax_params_from_state_dict(state_dict, config, read=tensor_to_numpy)


def _in_torch_order(arrays, config):
    """{torch key: tensor} of ``arrays`` ({torch key: numpy array}) in the torch twin's own key order, as the seed would
    have saved it."""
    with torch.device("meta"):  # the keys without storage
        torch_order = list(torch_ref.Transformer(**config.to_dict()).state_dict())
    assert set(torch_order) == set(arrays), "torch_ref and the conversion plan disagree on the keys"
    return {key: numpy_to_tensor(arrays[key]) for key in torch_order}


def state_dict_from_flax_params(params, config):
    """The torch state dict (torch keys, torch layout, tensors) of Flax parameters {Flax path:
    array}, in the torch twin's own order, as the seed would have saved it."""
    return _in_torch_order(flax_io.torch_arrays_from_flax_params(params, config), config)


def is_training_run(path):
    """A directory written by ``flaxformer-mini train --out PATH`` (it holds the run's config.json),
    or ``PATH/best``: its best checkpoint (``train --best-metric``)."""
    return Path(path).is_dir() and RunDir(path).exists() or best_of(path) is not None


def run_tokenizer_checksums(path):
    """{file name: sha256} of a text run's tokenizer files (each checked against what the run
    recorded), for the metadata of its exported weights; None for a synthetic run."""
    from flaxformer_mini.runs.run import Run  # late: it loads orbax and the trainer; torch_to_flax needs neither

    run = Run.open(path)
    if run.config.data.kind != "tsv":
        return None
    run.codec  # reads (and checks) the run's tokenizer files: a missing or edited one is named
    return {p.name: sha256(p.read_bytes()) for _, p in run.dir.tokenizer_files(run.config.data)}


def state_dict_from_run(path):
    """(torch state dict, ModelConfig, step) of a training run's newest readable checkpoint
    (damaged newer ones are skipped with a warning, as ``evaluate`` does), or of ``RUN/best`` its
    best checkpoint: the weights of the
    model ``flaxformer-mini generate`` would use, in the torch twin's keys, layout and order, so
    ``torch_ref.Transformer(**config.to_dict())`` loads them with ``strict=True``. A run trained
    with ``--scan-layers`` (its layers stacked) comes out per layer, as torch keys them; the
    compute dtype is the run's business, the parameters are float32 either way. A tied run's
    (``--tie-embeddings``) holds every key of its torch twin's state dict, each tied copy a
    tensor of its own equal to the table it is tied to, as ``flax_to_torch`` writes it."""
    from flaxformer_mini.runs.run import Run  # late: orbax and the trainer, as in run_tokenizer_checksums

    run = Run.open(path)
    state = run.latest_state()  # FileNotFoundError naming the run when it has no checkpoint
    model = run.trainer.model(state.for_inference())  # with --ema: the moving average, as generate decodes
    the_plan = _plan(model, None)
    arrays = engine.to_torch(the_plan, engine.flax_arrays(model))
    tie = _tie(None, the_plan, None, model)  # a run with --tie-embeddings: each tied key, as torch lists it
    if tie is not None:
        arrays = tie.backward(arrays)
    return _in_torch_order(arrays, run.config.model), run.config.model, int(state.step)
