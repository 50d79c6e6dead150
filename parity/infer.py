"""Work out the ``ModelConfig`` of a seed 001 Transformer from its state dict.

Shapes tell most of it (V vocabulary, D width, max_len, depth, F feed-forward width):

    encoder.embedding_layer.weight          (V_source, D)
    decoder.embedding_layer.weight          (V_target, D)
    encoder.positional_encoding.weight      (max_len, D)   the seed names the two tables
    decoder.positional_embedding.weight     (max_len, D)   differently
    encoder.transformer_layers.N.*          num_layers = highest N + 1
    decoder.decoder_layers.N.*              the same depth: one constructor argument
    encoder.transformer_layers.N.fc.0.weight                  (F, D): ffn_dim, the same in
    decoder.decoder_layers.N.transformer_block.fc.0.weight    every block (F = D: None)

Shapes cannot tell the number of heads (every projection is (D, D) whatever H is), the
source padding id, the dropout rate, or which embeddings are tied. Those come from the caller
(options or a config file: a JSON object of ModelConfig fields, or a flaxformer-mini run's
config.json or directory), from the config a file records in its metadata, or else are the
seed's values, a guess that ``resolve_config`` names as assumed (no ties, the seed's model, is
no guess: a tie told nowhere is none). Beware: the weights do not record H, and both twins
agree for any H that divides D, so a parity check cannot catch a wrong H; only the model's own
outputs (and its training run) can.

Every error is a ``ConversionError`` naming the key (or the option) at fault.
"""

import dataclasses
import json
from pathlib import Path

from flaxformer_mini.model.config import PRESETS, ModelConfig
from flaxformer_mini.runs.config import FORMAT as RUN_FORMAT
from flaxformer_mini.runs.config import RunConfig
from flaxformer_mini.runs.directory import RunDir, check_config_sha256
from parity.convert import ConversionError, layer_depths
from parity.engine import did_you_mean
from parity.wrapper_prefix import WRAPPERS, strip_advice

SOURCE_EMBEDDING = "encoder.embedding_layer.weight"
TARGET_EMBEDDING = "decoder.embedding_layer.weight"
SOURCE_POSITIONS = "encoder.positional_encoding.weight"
TARGET_POSITIONS = "decoder.positional_embedding.weight"
OUTPUT_PROJECTION = "decoder.fc.weight"
ENCODER_LAYERS = "encoder.transformer_layers"
DECODER_LAYERS = "decoder.decoder_layers"
# The feed-forward's first Linear inside each block, (F, D) in torch's (out, in) layout.
ENCODER_FFN = "fc.0.weight"
DECODER_FFN = "transformer_block.fc.0.weight"

# What the shapes cannot tell defaults to seed 001's example (8 heads, padding id 0).
_SEED = PRESETS["seed"]
DEFAULTS = {"heads": _SEED.heads, "src_pad_idx": _SEED.src_pad_idx, "dropout": _SEED.dropout}
CONFIG_KEYS = tuple(f.name for f in dataclasses.fields(ModelConfig))

# The keys that hold one tensor in torch_ref.Transformer, per tie_embeddings value.
TIED_GROUPS = {"decoder": (TARGET_EMBEDDING, OUTPUT_PROJECTION),
               "all": (TARGET_EMBEDDING, OUTPUT_PROJECTION, SOURCE_EMBEDDING)}


def _tie_hint(tie):
    """What a file missing the keys a tie of ``tie`` drops most likely is, and the remedy."""
    return ("a tied model (torch_ref.Transformer with tie_embeddings) saved by safetensors' save_model keeps one "
            f"name of its tied tables: say the tie in --config, {json.dumps({'tie_embeddings': tie})}")


def with_tie_hint(error, config):
    """``error`` (a ConversionError of the strict check against ``config``'s model) with
    the tie hint added when the one key wrong is the output projection that an untied model
    holds and a tied model's save_model file lacks; ``error`` itself otherwise."""
    if (config.tie_embeddings is not None or error.missing != [OUTPUT_PROJECTION] or error.unexpected
            or error.mismatched or error.invalid):
        return error
    return ConversionError(f"{error}\n{_tie_hint('decoder')} (or \"all\" for a source table shared too)",
                           missing=error.missing)


def with_tied_keys(state_dict, tie_embeddings):
    """``state_dict`` with each key of ``tie_embeddings``' group (``TIED_GROUPS``) that it lacks
    filled with the group's tensor it holds; as it is for None or a value ModelConfig refuses.
    safetensors' ``save_model`` keeps one name of tensors that share memory, and torch's strict
    load wants every name. Keys present stay as they are: the conversion checks that tied
    copies are equal bit for bit."""
    group = TIED_GROUPS.get(tie_embeddings) if isinstance(tie_embeddings, str) else None
    if group is None or not hasattr(state_dict, "keys"):
        return state_dict
    out = dict(state_dict)
    held = next((key for key in group if key in out), None)
    if held is not None:
        for key in group:
            out.setdefault(key, out[held])
    return out


_OUR_LAYER_LISTS = ("encoder.transformer_layers.", "decoder.decoder_layers.")


def _shape(state_dict, key, ndim=2):
    if key not in state_dict:
        prefixed = next((str(k) for k in state_dict if str(k).endswith("." + key)), None)
        if prefixed is not None:  # a wrapped model's checkpoint (DDP's "module.", torch.compile's "_orig_mod.")
            prefix = prefixed[: -len(key)]
            whose = f" ({WRAPPERS[prefix]})" if prefix in WRAPPERS else ""
            raise ConversionError(
                f"cannot infer the model config: missing key {key!r}, which the state dict holds as {prefixed!r}: "
                f"its keys have {prefix!r} before them{whose}; {strip_advice(prefix)}, and save the state dict "
                f"again", missing=[key])
        # A near key helps only in this project's Transformer with a key renamed or dropped (its
        # layer lists are there); in another model any "encoder.*" key is near and means nothing.
        ours = any(str(k).startswith(_OUR_LAYER_LISTS) for k in state_dict)
        hint = did_you_mean(key, [str(k) for k in state_dict]) if ours else ""
        if ours and key == SOURCE_EMBEDDING and TARGET_EMBEDDING in state_dict and OUTPUT_PROJECTION not in state_dict:
            # Both keys that a tie to the target embedding drops are missing: most likely a tie.
            raise ConversionError(f"cannot infer the model config: missing key {key!r}{hint}; {_tie_hint('all')}",
                                  missing=[key])
        # Most likely a porter's own model, which the command line cannot build; the library can.
        own = "" if ours else (" `parity check` and `parity convert` build that architecture only; a model of your own "
                               "converts and compares through the library (parity.torch_to_flax, parity.compare: "
                               "docs/porting.md)")
        raise ConversionError(
            f"cannot infer the model config: missing key {key!r}{hint}; is this a state dict of this project's "
            f"Transformer (torch_ref.Transformer, the seed tutorials' model)?{own}",
            missing=[key],
        )
    shape = tuple(getattr(state_dict[key], "shape", ()))
    if len(shape) != ndim:
        raise ConversionError(f"cannot infer the model config: {key!r} has shape {shape}, expected {ndim} dimensions",
                              mismatched={key: (shape, None)})
    return shape


def _depth(state_dict, prefix):
    """Number of blocks under ``prefix`` (``prefix.N.*``): highest N + 1."""
    depth = layer_depths(state_dict).get(prefix)
    if depth is None:
        raise ConversionError(f"cannot infer num_layers: no {prefix}.N.* keys in the state dict", missing=[f"{prefix}.0.*"])
    # A gap (blocks 0 and 2 but no 1) is reported by the strict load as missing keys.
    return depth


def _ffn_width(state_dict, D, depths):
    """F read from every block's ``fc.0.weight`` (F, D); every block must agree (the twins
    take one ``ffn_dim``). A block without the key is left to the strict load, which names
    every missing key at once."""
    widths = {}  # key -> F
    for prefix, suffix in ((ENCODER_LAYERS, ENCODER_FFN), (DECODER_LAYERS, DECODER_FFN)):
        for i in range(depths[prefix]):
            key = f"{prefix}.{i}.{suffix}"
            if key not in state_dict:
                continue
            F, in_width = _shape(state_dict, key)
            if in_width != D:
                raise ConversionError(f"feed-forward input width disagrees: {key!r} has shape {(F, in_width)}, "
                                      f"expected (F, {D}) with D={D}", mismatched={key: ((F, in_width), (F, D))})
            widths[key] = F
    if not widths:
        _shape(state_dict, f"{ENCODER_LAYERS}.0.{ENCODER_FFN}")  # raises, naming the key
    first_key, F = next(iter(widths.items()))
    odd = {key: width for key, width in widths.items() if width != F}
    if odd:
        raise ConversionError(
            f"feed-forward widths disagree: {first_key!r} has F={F} but "
            + ", ".join(f"{key!r} has {width}" for key, width in odd.items())
            + " (the twins take one ffn_dim for every block)",
            mismatched={key: (width, F) for key, width in odd.items()},
        )
    return F


def infer_config(state_dict, heads=None, src_pad_idx=None, overrides=None) -> ModelConfig:
    """The ``ModelConfig`` of the seed 001 Transformer whose state dict is ``state_dict``
    (a mapping of torch key -> tensor or array).

    Sizes come from the shapes. ``heads``, ``src_pad_idx`` and ``dropout`` come from, in order
    of precedence: the ``heads``/``src_pad_idx`` arguments, ``overrides`` (a dict of ModelConfig
    fields, e.g. read from a JSON file), the seed's defaults. A size given in ``overrides`` must
    agree with the shapes.
    """
    overrides = dict(overrides or {})
    unknown = [k for k in overrides if k not in CONFIG_KEYS]
    if unknown:
        hints = [f"{k!r}{did_you_mean(str(k), CONFIG_KEYS)}" for k in unknown]
        raise ConversionError(f"unknown config key {', '.join(hints)}; the keys are those of ModelConfig: "
                              f"{', '.join(CONFIG_KEYS)}")

    source_vocab_size, D = _shape(state_dict, SOURCE_EMBEDDING)
    target_vocab_size, target_D = _shape(state_dict, TARGET_EMBEDDING)
    max_len, source_pos_D = _shape(state_dict, SOURCE_POSITIONS)
    target_max_len, target_pos_D = _shape(state_dict, TARGET_POSITIONS)
    for key, width in ((TARGET_EMBEDDING, target_D), (SOURCE_POSITIONS, source_pos_D), (TARGET_POSITIONS, target_pos_D)):
        if width != D:
            raise ConversionError(f"embedding widths disagree: {SOURCE_EMBEDDING!r} has D={D}, {key!r} has {width}",
                                  mismatched={key: (width, D)})
    if target_max_len != max_len:
        raise ConversionError(
            f"max_len disagrees: {SOURCE_POSITIONS!r} has {max_len} positions, {TARGET_POSITIONS!r} has "
            f"{target_max_len} (the seed's Transformer takes one max_len for both)",
            mismatched={TARGET_POSITIONS: (target_max_len, max_len)},
        )
    encoder_depth, decoder_depth = _depth(state_dict, ENCODER_LAYERS), _depth(state_dict, DECODER_LAYERS)
    if encoder_depth != decoder_depth:
        raise ConversionError(
            f"encoder and decoder depths disagree: {ENCODER_LAYERS} has {encoder_depth} blocks, {DECODER_LAYERS} "
            f"has {decoder_depth} (the seed's Transformer takes one num_layers for both)"
        )
    F = _ffn_width(state_dict, D, {ENCODER_LAYERS: encoder_depth, DECODER_LAYERS: decoder_depth})
    if "ffn_dim" in overrides and (D if overrides["ffn_dim"] is None else overrides["ffn_dim"]) != F:
        raise ConversionError(f"config says ffn_dim={overrides['ffn_dim']!r} but the checkpoint has F={F} "
                              f"({ENCODER_LAYERS}.0.{ENCODER_FFN!r})")

    from_shapes = {
        "source_vocab_size": (source_vocab_size, SOURCE_EMBEDDING),
        "target_vocab_size": (target_vocab_size, TARGET_EMBEDDING),
        "max_len": (max_len, SOURCE_POSITIONS),
        "embed_size": (D, SOURCE_EMBEDDING),
        "num_layers": (encoder_depth, f"{ENCODER_LAYERS}.{encoder_depth - 1}"),
    }
    for name, (value, key) in from_shapes.items():
        if name in overrides and overrides[name] != value:
            raise ConversionError(f"config says {name}={overrides[name]!r} but the checkpoint has {value} ({key!r})")

    chosen = {**DEFAULTS, **{k: v for k, v in overrides.items() if k in DEFAULTS}}
    if heads is not None:
        chosen["heads"] = heads
    if src_pad_idx is not None:
        chosen["src_pad_idx"] = src_pad_idx
    for name in ("heads", "src_pad_idx"):
        if isinstance(chosen[name], bool) or not isinstance(chosen[name], int):
            raise ConversionError(f"{name} must be an integer, got {chosen[name]!r}")
    if chosen["heads"] < 1 or D % chosen["heads"]:
        # The seed's 8, taken because nothing said the heads: say so, and what says them.
        assumed = heads is None and "heads" not in overrides
        said = " (the seed value, assumed: no --heads, config or metadata gave it)" if assumed else ""
        raise ConversionError(
            f"heads={chosen['heads']}{said} does not divide the model width D={D} ({SOURCE_EMBEDDING!r} has shape "
            f"{(source_vocab_size, D)}); heads must be a divisor of {D}: "
            f"{', '.join(str(h) for h in range(1, D + 1) if D % h == 0)}"
            + ("; give the model's with --heads" if assumed else "")
        )
    if not 0 <= chosen["src_pad_idx"] < source_vocab_size:
        raise ConversionError(
            f"src_pad_idx={chosen['src_pad_idx']} is outside the source vocabulary [0, {source_vocab_size}) "
            f"({SOURCE_EMBEDDING!r} has shape {(source_vocab_size, D)})"
        )
    try:
        # F = D is the seed's model: ffn_dim None, so a seed checkpoint infers the seed's config.
        # The ties come from the caller alone (a run's config, file metadata, a config file):
        # shapes cannot tell them, and equal values are no proof of a tie (the conversion then
        # checks each tied copy against its table, bit for bit).
        return ModelConfig(**{name: value for name, (value, _) in from_shapes.items()}, **chosen,
                           ffn_dim=None if F == D else F, tie_embeddings=overrides.get("tie_embeddings"))
    except (TypeError, ValueError) as e:  # e.g. a dropout of 1.5 in the config file
        raise ConversionError(str(e)) from None


# Where each setting the shapes cannot tell came from (``resolve_config``), and the option
# that sets it (dropout has none of its own: a config file does).
OPTIONS = {"heads": "--heads", "src_pad_idx": "--pad-idx", "dropout": '"dropout" in --config'}
DEFAULT_SOURCE, CONFIG_FILE_SOURCE, METADATA_SOURCE = "default", "config file", "file metadata"


def resolve_config(state_dict, heads=None, src_pad_idx=None, config_file=None, recorded=None, recorded_assumed=()):
    """(ModelConfig, {setting: where it came from}, the settings that are assumed) for the
    state dict, as ``infer_config`` works it out, with ``config_file`` (read_config_file's
    dict) over ``recorded`` (the ModelConfig fields the file's own metadata records, which
    must agree with the shapes) over the seed's defaults. ``heads``/``src_pad_idx`` override
    both. A setting is assumed when it is the seed's default, or when the file's metadata
    records it as assumed."""
    config_file, recorded = dict(config_file or {}), dict(recorded or {})
    if recorded:
        try:
            infer_config(state_dict, overrides=recorded)
        except ConversionError as e:
            raise ConversionError(f"the config in the file's metadata does not fit its weights: {e}") from None
    config = infer_config(state_dict, heads=heads, src_pad_idx=src_pad_idx, overrides={**recorded, **config_file})
    given = {"heads": heads, "src_pad_idx": src_pad_idx, "dropout": None}
    sources, assumed = {}, []
    for name in DEFAULTS:
        if given[name] is not None:
            sources[name] = OPTIONS[name]
        elif name in config_file:
            sources[name] = CONFIG_FILE_SOURCE
        elif name in recorded:
            sources[name] = METADATA_SOURCE + (", assumed there" if name in recorded_assumed else "")
            if name in recorded_assumed:
                assumed.append(name)
        else:
            sources[name] = DEFAULT_SOURCE
            assumed.append(name)
    return config, sources, tuple(assumed)


def describe_assumed(config, names, options=True):
    """'heads 8 (set with --heads), ...' for the assumed settings ``names`` of ``config``."""
    return ", ".join(f"{name} {getattr(config, name)!r}" + (f" (set with {OPTIONS[name]})" if options else "")
                     for name in names)


def read_config_file(path):
    """The ModelConfig fields (any subset) in a JSON config file: an object of them, or a
    flaxformer-mini run's config.json (its ``"model"``), or a run directory (its config.json)."""
    path = Path(path)
    if path.is_dir():
        if not RunDir(path).exists():
            raise ConversionError(f"config {path}: is a directory without a config.json; give a JSON file of "
                                  f"ModelConfig fields, or a flaxformer-mini run (its directory or config.json)")
        path = RunDir(path).config_path
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ConversionError(f"config file {path}: cannot read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConversionError(f"config file {path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConversionError(f"config file {path}: expected a JSON object of ModelConfig fields, got {type(data).__name__}")
    if data.get("format") == RUN_FORMAT:  # a training run's config.json: its model, as the run built it
        try:
            model = RunConfig.from_dict(data, source=str(path)).model.to_dict()
            check_config_sha256(data, path)  # a heads edited by hand would check another model
            return model
        except (TypeError, ValueError) as e:
            raise ConversionError(f"config file {path}: a flaxformer-mini run's config.json that cannot be read: "
                                  f"{e}") from None
    return data
