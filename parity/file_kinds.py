"""What both file modules share, torch-free: the suffixes, the error for an unusable file, the
first look at a file given as input, and the model config a ``.safetensors`` file carries in
its metadata (str -> str, ignored by every tensor loader):

    format          FLAX_FORMAT (Flax paths and layout) or TORCH_FORMAT (torch keys and layout)
    model_config    JSON of the ModelConfig: the keyword arguments of torch_ref.Transformer
    assumed_config  JSON list of the fields in it that were assumed (the seed's defaults: the
                    weights do not record them and no one gave them), absent when none was
    tokenizers      JSON {file name: sha256} of the tokenizer files of the text run the weights
                    were exported from (``parity convert RUN``), absent otherwise: which token
                    each embedding row belongs to (``train --init-from`` checks a run's against it)
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path

from flaxformer_mini.model.config import ModelConfig

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"
FLAX_FORMAT = "flaxformer_mini.flax_params"
TORCH_FORMAT = "flaxformer_mini.torch_state_dict"
CONFIG_METADATA_KEY = "model_config"
ASSUMED_METADATA_KEY = "assumed_config"
TOKENIZERS_METADATA_KEY = "tokenizers"


class CheckpointError(ValueError):
    """A checkpoint file cannot be used: unknown type, unsafe, truncated or corrupt."""


def readable_file(path, what="checkpoint file"):
    """``path`` as a Path, once it is known to be a file this process can open: CheckpointError
    for nothing there or a directory; the OSError of ``open`` (no permission...), which names
    the file, otherwise. Checked first, so that a reader's own error for these (torch's
    "truncated or corrupt?" guess) never hides the plain cause."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a {what}")
    open(path, "rb").close()
    return path


def actual_kind(path):
    """What the first bytes of the file ``path`` say it is, in words: "a .safetensors file" or
    "a torch checkpoint (torch.save's ...)", or None for neither (or unreadable). For the error
    of a file whose suffix names another kind: its reader's own words (a pickle refused, a
    header too large) would hide that the file is fine under its right name."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    if head[:4] == b"PK\x03\x04":
        return "a torch checkpoint (torch.save's zip format)"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a torch checkpoint (torch.save's legacy pickle format)"
    # safetensors: an 8-byte little-endian header length, then the JSON header itself.
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8:
        return "a .safetensors file"
    return None


def misnamed(path, expected):
    """'; its first bytes say it is KIND: rename it to NAME' when the file
    ``path`` is another kind than its suffix names, else ''."""
    kind = actual_kind(path)
    if kind is None or kind.startswith(expected):
        return ""
    suffix = SAFETENSORS_SUFFIX if kind == "a .safetensors file" else ".pt"
    return f"; its first bytes say it is {kind}: rename it to {Path(path).with_suffix(suffix).name}"


def unreadable(path, expected, error):
    """The CheckpointError for a file its reader refused with ``error``: named for what it is
    when its bytes are another kind than ``expected`` (``misnamed``), else a guess at the cause."""
    wrong_name = misnamed(path, expected)
    if wrong_name:
        return CheckpointError(f"{path}: not {expected}{wrong_name}")
    return CheckpointError(f"{path}: not a readable {expected[2:]} (truncated or corrupt?): {error}")


def safetensors_header(path):
    """({metadata key: str}, [tensor keys]) of a ``.safetensors`` file, without reading its tensors."""
    from safetensors import SafetensorError, safe_open  # late: optional (the [torch] extra), for .safetensors alone

    try:
        with safe_open(path, framework="numpy") as f:
            return dict(f.metadata() or {}), list(f.keys())
    except (SafetensorError, OSError, ValueError) as e:
        raise unreadable(path, "a .safetensors file", e) from None


def as_model_config(config):
    """``config`` as a ModelConfig: one already, or a mapping of its fields (the keyword
    arguments of ``torch_ref.Transformer``, what ``read_recorded_config`` returns), checked as
    the ModelConfig it makes."""
    if isinstance(config, ModelConfig):
        return config
    if not isinstance(config, Mapping):
        raise TypeError(f"config: expected a ModelConfig or a dict of its fields, got {type(config).__name__}")
    try:
        return ModelConfig(**config)
    except TypeError as e:  # a missing or unknown field, as the constructor names it
        raise TypeError(f"config: {e}") from None


def config_metadata(file_format, config, assumed=(), tokenizers=None):
    """The metadata recording ``config`` (``as_model_config``) in a ``.safetensors`` file of
    ``file_format``, and ``tokenizers`` ({file name: sha256}) where given."""
    metadata = {"format": file_format, CONFIG_METADATA_KEY: json.dumps(as_model_config(config).to_dict())}
    if assumed:
        metadata[ASSUMED_METADATA_KEY] = json.dumps(sorted(assumed))
    if tokenizers:
        metadata[TOKENIZERS_METADATA_KEY] = json.dumps(dict(sorted(tokenizers.items())))
    return metadata


def read_recorded_tokenizers(path):
    """{file name: sha256} of the tokenizers a ``.safetensors`` file of this project records
    (``config_metadata``), or None: not recorded (any other file, ``.pt`` included)."""
    path = Path(path)
    if path.suffix.lower() != SAFETENSORS_SUFFIX or not path.is_file():
        return None
    metadata, _ = safetensors_header(path)
    if metadata.get("format") not in (TORCH_FORMAT, FLAX_FORMAT) or TOKENIZERS_METADATA_KEY not in metadata:
        return None
    return tokenizers_from_json(metadata[TOKENIZERS_METADATA_KEY], path)


def tokenizers_from_json(data, path):
    """The {file name: sha256} a ``tokenizers`` entry holds (JSON text, or the dict an orbax
    record holds)."""
    try:
        recorded = json.loads(data) if isinstance(data, str) else data
    except json.JSONDecodeError:
        recorded = None
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        raise CheckpointError(f"{path}: unusable {TOKENIZERS_METADATA_KEY!r} in its metadata")
    return recorded


def recorded_config(metadata, path):
    """(the ModelConfig fields a file's metadata records, or None; the names it marks assumed)."""
    if CONFIG_METADATA_KEY not in metadata:
        return None, ()
    try:
        config = json.loads(metadata[CONFIG_METADATA_KEY])
    except (TypeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unusable {CONFIG_METADATA_KEY!r} in its metadata: {e}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: unusable {CONFIG_METADATA_KEY!r} in its metadata: expected a JSON object")
    return config, assumed_from_json(metadata.get(ASSUMED_METADATA_KEY, "[]"), path)


def assumed_from_json(data, path):
    """The names an ``assumed_config`` entry lists (JSON text, or the list an orbax record holds)."""
    try:
        names = json.loads(data) if isinstance(data, str) else data
    except json.JSONDecodeError:
        names = None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise CheckpointError(f"{path}: unusable {ASSUMED_METADATA_KEY!r} in its metadata: {data!r}")
    return tuple(names)


def read_recorded_config(path):
    """(the ModelConfig fields a torch ``.safetensors`` file records in its metadata, or None;
    the names of those recorded as assumed). None for ``.pt`` files, which cannot say, and for
    metadata written by another tool (its "model_config", if any, may mean something else)."""
    path = Path(path)
    if path.suffix.lower() != SAFETENSORS_SUFFIX:
        return None, ()
    metadata, _ = safetensors_header(path)
    if metadata.get("format") != TORCH_FORMAT:
        return None, ()
    return recorded_config(metadata, path)
