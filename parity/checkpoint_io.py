"""Reading and writing torch state dicts: ``.safetensors`` (preferred) and ``.pt``/``.pth``.

A pickle can run arbitrary code when it is loaded. ``.pt`` files are therefore read with
``torch.load(..., weights_only=True)``, whose unpickler accepts tensors and plain
containers only and refuses anything else before it runs. ``.safetensors`` holds no code
at all, which is why it is preferred.

A ``.safetensors`` file written here from a known config (``parity convert`` of a training run
or of Flax parameters) carries that config in its metadata (``parity.file_kinds``:
``format`` TORCH_FORMAT, ``model_config``), which torch's loaders ignore; a ``.pt`` file holds
the state dict alone, so that ``load_state_dict(torch.load(...), strict=True)`` keeps working.
safetensors (in the optional ``[torch]`` extra, beside torch) is imported where a
``.safetensors`` file is read or written, so ``.pt`` files need torch alone.
"""

import io
import pickle
from pathlib import Path

import torch

from flaxformer_mini import files
from parity.file_kinds import (  # noqa: F401 - public names
    SAFETENSORS_SUFFIX, TORCH_FORMAT, TORCH_SUFFIXES, CheckpointError, as_model_config, config_metadata,
    misnamed, read_recorded_config, readable_file, recorded_config, safetensors_header, unreadable)

# Common wrappers: torch.save({"epoch": 3, "model_state_dict": model.state_dict()}, ...).
_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")



def _read_torch(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if misnamed(path, "a torch checkpoint"):  # a .safetensors file under a torch suffix: no pickle at all
            raise unreadable(path, "a torch checkpoint", e) from None
        # torch raises this for a refused global and for garbage bytes alike, and its first
        # line is boilerplate; the line naming the cause starts with "WeightsUnpickler error".
        text = str(e)
        detail = text[text.find("WeightsUnpickler error"):] if "WeightsUnpickler error" in text else text
        detail = " ".join(detail.split("Check the documentation")[0].split())
        raise CheckpointError(
            f"{path}: refused to load: the pickle asks for objects other than tensors, which could "
            f"run code, or is not a torch checkpoint at all (read with weights_only=True). Re-save it "
            f"as a plain state dict or as .safetensors. Detail: {detail}"
        ) from None
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError, EOFError, ... for bad files
        raise unreadable(path, "a torch checkpoint", e) from None


def _read_safetensors(path):
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise unreadable(path, "a .safetensors file", e) from None


def load_state_dict(path):
    """Read a torch state dict {key: tensor} from ``.pt``/``.pth``/``.bin`` or ``.safetensors``."""
    path = readable_file(path)
    suffix = path.suffix.lower()
    if suffix == SAFETENSORS_SUFFIX:
        obj = _read_safetensors(path)
    elif suffix in TORCH_SUFFIXES:
        obj = _read_torch(path)
    else:
        raise CheckpointError(
            f"{path}: unknown checkpoint type {suffix or '(no suffix)'!r}; "
            f"expected one of {', '.join((SAFETENSORS_SUFFIX, *TORCH_SUFFIXES))}"
        )
    if isinstance(obj, dict) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        for key in _WRAPPER_KEYS:
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a state dict (a mapping of name -> tensor), got {type(obj).__name__}")
    # key=str: a pickle may mix int and str keys, which plain sorted() cannot compare.
    not_tensors = sorted((k for k, v in obj.items() if not isinstance(v, torch.Tensor)), key=str)
    if not_tensors:
        raise CheckpointError(f"{path}: these entries are not tensors: {', '.join(map(str, not_tensors))}")
    return dict(obj)


def save_state_dict(state_dict, path, config=None, assumed=(), tokenizers=None, replace=True):
    """Write {key: tensor} as ``.safetensors`` or ``.pt``, chosen by the suffix; atomically
    (``parity.output``), so a failed write never leaves a truncated file under the final name
    nor a temporary file beside it. ``config`` (a ModelConfig, or a dict of its fields: the
    keyword arguments of ``torch_ref.Transformer``) goes into a ``.safetensors`` file's
    metadata, with ``assumed`` (the names of its fields that are a guess) and ``tokenizers``
    (the {file name: sha256} of the text run the weights come from); a ``.pt`` file holds the
    tensors alone.

    A tied model's state dict holds one tensor under two keys (``lm_head.weight`` is
    ``tok.weight``). ``torch.save`` keeps them one tensor; safetensors cannot, and refuses
    them, so a ``.safetensors`` file holds each later key's copy as a tensor of its own, equal
    to the first, as ``flax_to_torch`` writes a tie: the file loads with
    ``load_state_dict(strict=True)`` and ``torch_to_flax(..., tied=...)`` as the model's own
    state dict does (safetensors' ``save_model`` would keep one name instead).

    ``replace=False``: never replace a file at ``path``, even one created while this wrote
    (``flaxformer_mini.files.write_atomic``)."""
    config = None if config is None else as_model_config(config)
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.absolute().parent.is_dir():  # torch.save would say so as a RuntimeError
        raise CheckpointError(f"{path}: the directory {path.absolute().parent} does not exist")
    # On the CPU: a .pt of CUDA tensors (flax_to_torch makes them on torch's default device)
    # would need a GPU, or map_location, to load.
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    if suffix == SAFETENSORS_SUFFIX:
        from safetensors.torch import save

        tensors = _untied(tensors)
        data = save(tensors, metadata=None if config is None else config_metadata(TORCH_FORMAT, config, assumed,
                                                                                   tokenizers))
    elif suffix in TORCH_SUFFIXES:
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        data = buffer.getvalue()
    else:
        raise CheckpointError(f"{path}: unknown checkpoint type {suffix!r}; use .safetensors or .pt")
    files.write_atomic(path, data, replace=replace)
    return path


def _untied(tensors):
    """{key: tensor} with each tensor that shares memory with an earlier one copied."""
    seen, out = set(), {}
    for key, tensor in tensors.items():
        storage = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        out[key] = tensor.clone() if storage in seen else tensor
        seen.add(storage)
    return out
