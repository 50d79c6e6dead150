"""``parity`` command line.

    parity check --preset seed
    parity check --torch-checkpoint model.pt --heads 5 [--grads] [--json OUT] [--plot OUT.png]
    parity check --torch-checkpoint model.pt --config runs/reverse   # heads, padding, ... from a run's config.json
    parity check --torch-checkpoint runs/reverse  # a training run's newest checkpoint, with the run's config
    parity check --preset seed --grads --torch-device cuda   # torch on the GPU, JAX on its default device
    parity check --preset seed --decode 10        # also greedy-decode 10 tokens on both twins, id for id
    parity convert model.pt model.safetensors     # torch state dict -> Flax parameters
    parity convert model.safetensors back.pt      # and back, bit for bit
    parity convert runs/reverse model.pt          # a training run's newest checkpoint -> torch state dict
    parity convert model.pt model.safetensors --force   # replace an earlier conversion

Exit codes: 0 every compared tensor within tolerance (``convert``: written), 1 some
difference beyond it (with ``--decode``, also a decoded token the twins disagree on where
either side's logit of its token exceeds its logit of the other side's by more than
NEAR_TIE_FACTOR x --atol; a near-tie within that is reported, not failed), 2 the options, inputs or output are unusable (the message says which
key, file or option; nothing was written), 130 stopped by Ctrl-C or SIGTERM (an output is there
whole or not at all; a second signal while orbax writes ends the process at once, parity.output), 141 stdout was closed before the report was
written (``parity check | head -1``), quietly, as a process ended by SIGPIPE. A user's mistake prints one line; ``--debug`` (or
PARITY_DEBUG=1) shows the traceback. Outputs are written all at once or not at all, and an
existing OUT is replaced only with ``--force`` (``parity.output``).

torch, JAX and numpy, and the modules of this project that load them, are imported inside the
functions that need them, so that ``--help`` and a refused option answer before any of them
starts (tests/test_import_isolation.py); only modules that load none of them are imported above.
"""

import argparse
import errno
import json
import math
import os
import signal
import sys
import threading
from pathlib import Path

from flaxformer_mini.cli.errors import describe_missing_dependency
from flaxformer_mini.files import check_parent_writable, check_writable, describe_os_error, same_file
from flaxformer_mini.model.config import get_preset
from parity.output import refuse_existing, write_files_atomic
from parity.plot import PLOT_SUFFIXES, render_report

EXIT_OK, EXIT_DIVERGED, EXIT_UNUSABLE = 0, 1, 2
# Ctrl-C or SIGTERM: the shell's code for a process ended by SIGINT (128 + 2), as
# flaxformer-mini's commands exit; not 1, which means "the twins differ".
EXIT_INTERRUPTED = 130
# stdout closed early (`parity check | head -1`): the shell's code for a process ended by
# SIGPIPE (128 + 13), as `yes | head -1` reports it; not 1, which means "the twins differ".
EXIT_BROKEN_PIPE = 141
# --batch: a parity check needs a few rows, and holds every intermediate of both twins for
# the whole batch; a training-sized (or mistyped) batch would exhaust memory before any work.
MAX_BATCH = 1024
# --seed: JAX's PRNG keys take an int64 (torch's and numpy's take more), and none a negative.
MAX_SEED = 2**63 - 1
from parity.policy import (DEFAULT_ATOL, FLOAT64_ATOL, FLOAT64_FACTOR, FLOAT64_LARGEST_FACTOR, FLOAT64_MAX_ATOL,
                           NEAR_TIE_FACTOR)

DEBUG_ENV = "PARITY_DEBUG"  # set (to anything) for full tracebacks, as --debug


class UsageError(ValueError):
    """An option or a combination of options that cannot be used."""


# ----------------------------------------------------------------------------- check


def _same_path(a, b):
    """Whether paths ``a`` and ``b`` name one file or directory: spelt alike once resolved
    (``d/../x``, a symlink) or one file under two names (a hard link)."""
    return Path(a).resolve() == Path(b).resolve() or same_file(a, b)


def _run_of(path):
    """The training run directory that ``path`` (a run, or RUN/best) reads, or None."""
    from flaxformer_mini.runs.directory import best_of
    from parity.convert import is_training_run

    return (best_of(path) or Path(path)) if is_training_run(path) else None


def _check_output_paths(args):
    """Before the work: each output can be written, replaces nothing unasked (``--force``), and
    is neither an input (the checkpoint, a file of the run being checked, the --config file or
    run) nor the other output."""
    from flaxformer_mini.runs.directory import RunDir

    outputs = [(option, path) for option, path in (("--json", args.json), ("--plot", args.plot)) if path]
    if len(outputs) == 2 and _same_path(args.json, args.plot):
        raise UsageError(f"--json and --plot are the same path ({args.json}); give each its own file")
    run = _run_of(args.torch_checkpoint) if args.torch_checkpoint else None
    for option, path in outputs:
        check_writable(path, option)  # before the work, not after it
        if args.torch_checkpoint and _same_path(path, args.torch_checkpoint):
            raise UsageError(f"{option} {path}: is the checkpoint being checked; write the {option[2:]} elsewhere")
        # --force replaces a file of one's own; a run's config.json or metrics.jsonl replaced
        # by a report would leave a run no command can open.
        if run is not None and RunDir(run).own_file(path):
            raise UsageError(f"{option} {path}: is one of the files of the training run being checked ({run}), "
                             f"which --force would replace too; write the {option[2:]} elsewhere")
        config_input = (None if not args.config else "the --config file" if _same_path(path, args.config) else
                        "one of the files of the --config run" if RunDir(args.config).own_file(path) else None)
        if config_input:
            raise UsageError(f"{option} {path}: is {config_input} ({args.config}), which --force would replace "
                             f"too; write the {option[2:]} elsewhere")
        if not args.force:
            refuse_existing(path, option)
    if args.plot and Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {args.plot}: unknown image type {Path(args.plot).suffix or '(no suffix)'!r}; "
                         f"use one of {', '.join(PLOT_SUFFIXES)}")


def warn(command, message):
    print(f"parity {command}: warning: {message}", file=sys.stderr)


def _torch_config(args, path, state_dict):
    """(state dict, ModelConfig, {setting: where it came from}, the settings assumed, warnings)
    of a torch state dict read from ``path`` (the state dict with the tied keys it lacks
    restored, ``parity.infer.with_tied_keys``): options, then --config, then the config the file records (a
    .safetensors written by `parity convert`), then the seed's defaults. The warnings name each
    default with the option that sets it, and each option overriding the file's record; the
    caller prints them once the work goes ahead (an error stays one line)."""
    from parity.checkpoint_io import read_recorded_config
    from parity.infer import OPTIONS, describe_assumed, read_config_file, resolve_config, with_tied_keys

    recorded, recorded_assumed = read_recorded_config(path)
    config_file = read_config_file(args.config) if args.config else {}
    state_dict = with_tied_keys(state_dict, {**(recorded or {}), **config_file}.get("tie_embeddings"))
    config, sources, assumed = resolve_config(state_dict, heads=args.heads, src_pad_idx=args.pad_idx,
                                              config_file=config_file, recorded=recorded,
                                              recorded_assumed=recorded_assumed)
    warnings = []
    for name in OPTIONS:  # a deliberate override of what the file says it is: say so, go on
        if recorded and name in recorded and name not in recorded_assumed and getattr(config, name) != recorded[name]:
            warnings.append(f"{name} {getattr(config, name)!r} ({sources[name]}) overrides {name} "
                            f"{recorded[name]!r} recorded in {path}'s metadata")
    # A check runs both twins in eval mode: dropout changes nothing it compares.
    unknown = assumed if args.command == "convert" else tuple(name for name in assumed if name != "dropout")
    if unknown:
        sayers = ("the weights, the options nor its metadata" if Path(path).suffix.lower() == ".safetensors" else
                  "the weights nor the options")
        warnings.append(f"neither {sayers} say "
                        f"{'this setting' if len(unknown) == 1 else 'these settings'}, so "
                        f"{'it is' if len(unknown) == 1 else 'they are'} assumed (the seed's): "
                        f"{describe_assumed(config, unknown)}"
                        + ("; OUT's metadata marks them assumed" if args.command == "convert" else ""))
    return state_dict, config, sources, assumed, warnings


def _refuse_config_options(args, why):
    """UsageError naming the first of --heads, --pad-idx and --config given where the input
    says the whole config itself (``why`` completes "--heads ...")."""
    for option, value in (("--heads", args.heads), ("--pad-idx", args.pad_idx), ("--config", args.config)):
        if value is not None:
            raise UsageError(f"{option} {why}")


def _training_run_state_dict(args, path):
    """(state dict, ModelConfig, step) of a training run's newest checkpoint; its config.json
    says everything, so no option may contradict it."""
    from parity.convert import state_dict_from_run

    _refuse_config_options(args, f"applies to a torch checkpoint only; {path} is a training run, and its "
                                 f"config.json says the whole config")
    return state_dict_from_run(path)


def _which_checkpoint(path):
    """Which checkpoint of the training run ``path`` is read, in words."""
    from flaxformer_mini.runs.run import Run

    run = Run.open(path)
    if run.best:
        which = f"best checkpoint (--best-metric {run.config.evaluation.best_metric})"
    elif run.config.averaged is not None:  # flaxformer-mini average's
        which = f"checkpoint averaged from steps {', '.join(map(str, run.config.averaged.steps))}"
    else:
        which = "newest checkpoint"
    # A run trained with --ema is read, as generate decodes it, as its moving average: say so,
    # since its raw parameters are in the checkpoint too.
    decay = run.config.train.ema_decay
    return which + ("" if decay is None else f", its moving average (--ema {decay:g})")


def _seed_keys(state_dict, path):
    """A state dict of PyTorch's nn.Transformer (parity.nn_transformer's keys, detected by its
    keys) renamed to the seed's; any other state dict as it is."""
    from parity.nn_transformer import is_nn_transformer, to_seed_state_dict

    if not is_nn_transformer(state_dict):
        return state_dict
    print(f"{path}: an nn.Transformer state dict (parity.nn_transformer's keys), renamed to the seed model's")
    return to_seed_state_dict(state_dict)


def _load_checkpoint(args):
    """(state dict, config, description of where heads and padding came from, what it is)."""
    from flaxformer_mini.runs.directory import run_holding
    from parity.check import refuse_unusable_weights
    from parity.checkpoint_io import SAFETENSORS_SUFFIX, TORCH_SUFFIXES, CheckpointError, load_state_dict
    from parity.convert import ConversionError, is_training_run
    from parity.flax_io import checkpoint_kind
    from parity.infer import with_tie_hint

    path = args.torch_checkpoint
    if is_training_run(path):
        state_dict, config, step = _training_run_state_dict(args, path)
        sources = dict.fromkeys(("heads", "src_pad_idx"), "the run's config.json")
        return state_dict, config, sources, f"training run {path}, its {_which_checkpoint(path)} (step {step})"
    if Path(path).is_dir():
        run = run_holding(path)
        if run is not None:
            what = "the checkpoints directory" if Path(path).parent == run else "one checkpoint"
            raise UsageError(f"{path}: this is {what} of a training run; give the run directory ({run}) "
                             f"to check its newest checkpoint")
        raise CheckpointError(f"{path}: is a directory, not a torch checkpoint file ({', '.join(TORCH_SUFFIXES)} "
                              f"or {SAFETENSORS_SUFFIX}) nor a training run; if it holds Flax parameters (an orbax "
                              f"directory), `parity convert {path} OUT.pt` turns them back into one")
    if Path(path).suffix.lower() == SAFETENSORS_SUFFIX and checkpoint_kind(path) != "torch":
        raise CheckpointError(f"{path}: holds Flax parameters, not a torch state dict; "
                              f"`parity convert {path} OUT.pt` turns it back into one")
    state_dict = _seed_keys(load_state_dict(path), path)
    state_dict, config, sources, _, warnings = _torch_config(args, path, state_dict)
    try:
        refuse_unusable_weights(state_dict, config)  # int64 or NaN weights are the file's fault, not the port's
    except ConversionError as e:
        raise with_tie_hint(e, config) from None
    for message in warnings:
        warn(args.command, message)
    return state_dict, config, sources, f"checkpoint {path}"


def _check(args):
    import jax

    from parity.check import check_twins
    from parity.twins import parity_numerics, torch_device, transformer_pair, twins_from_state_dict

    if args.torch_checkpoint is None:
        _refuse_config_options(args, "applies to --torch-checkpoint only; a preset fixes the whole config")
    _check_output_paths(args)
    device = torch_device(args.torch_device)  # refused before any work
    parity_numerics()

    if args.torch_checkpoint is None:
        preset = args.preset or "seed"
        config = get_preset(preset)
        what = f"preset {preset}"
        _refuse_a_model_beyond_memory(config, args, what)
        torch_model, flax_model = transformer_pair(config, seed=args.seed)
        heads, pad = f"{config.heads} heads", ""
    else:
        state_dict, config, sources, what = _load_checkpoint(args)
        _refuse_a_model_beyond_memory(config, args, what)
        torch_model, flax_model = twins_from_state_dict(state_dict, config, seed=args.seed)
        # The weights do not record H, and the twins agree for any H dividing D: say where it came from.
        heads = f"{config.heads} heads ({sources['heads']}; not in the weights)"
        pad = f", src_pad_idx {config.src_pad_idx} ({sources['src_pad_idx']})"
    if args.decode is not None and args.decode > config.max_len:  # before the comparisons
        raise UsageError(f"--decode {args.decode} exceeds the model's max_len {config.max_len}: the decoder's "
                         f"positional table holds {config.max_len} positions (BOS + {config.max_len - 1} "
                         f"fed-back tokens)")
    _refuse_a_batch_beyond_memory(torch_model, config, args, what)
    torch_model.to(device)  # built on the CPU, so that a seed's weights are the same on any device
    report = check_twins(torch_model, flax_model, config, batch=args.batch, seed=args.seed, atol=args.atol,
                         grads=args.grads, float64_reference=args.float64_reference, float64=args.float64)
    decoded = None
    if args.decode is not None:
        from parity.decode_check import check_decoding

        decoded = check_decoding(torch_model, flax_model, config, args.decode, batch=args.batch, seed=args.seed,
                                 atol=args.atol)

    passed = report.ok and (decoded is None or decoded.ok)
    c = config
    print(f"{what}: vocab {c.source_vocab_size}/{c.target_vocab_size}, max_len {c.max_len}, "
          f"embed {c.embed_size}, ffn {c.feed_forward_width}, {heads}, {c.num_layers}+{c.num_layers} layers{pad}"
          f"{_tied(c)}; "
          f"batch {args.batch} with padding, {'float64 copies of both twins' if args.float64 else 'float32'}, "
          f"highest matmul precision (TF32 off), seed {args.seed}; "
          f"torch on {device}, JAX on {jax.devices()[0].platform}"
          + ("; gradients of the token cross-entropy (next-token labels, padding ignored)" if args.grads else ""))
    print(report.format_table(show_all=args.all, all_hint="--all"))
    first = report.first_divergence
    if first is not None and not first.note and not (args.float64_reference or args.float64):
        # A trained model's float32 rounding alone can pass 1e-5, and a gradient's grows with the
        # batch it sums over (parity/float64_reference.py).
        print(f"hint: a trained model's large activations, or a gradient summed over a large batch, can take float32 "
              f"rounding past {args.atol:g} in torch as much as in Flax; --float64-reference measures both against "
              f"the torch twin in float64")
    if decoded is not None:
        print(decoded.format())
    outputs = []  # drawn and serialised first, then written together: all of them or none
    if args.json:
        # "decode" is added beside the report's own keys, which keep their meaning ("ok" is
        # the tensors' verdict); null when --decode was not given. "passed": the exit code's
        # verdict, tensors and decoding together, for a script that reads one key.
        data = dict(report.to_dict(), decode=decoded.to_dict() if decoded is not None else None, passed=passed)
        outputs.append((args.json, json.dumps(data, allow_nan=False, indent=2) + "\n", "report"))
    if args.plot:
        outputs.append((args.plot, render_report(report, args.plot, title=f"torch vs Flax, {what}"), "plot"))
    if outputs:
        def say_written():  # before a Ctrl-C that came while they were written stops the command
            for path, _, kind in outputs:
                print(f"{kind} written to {path}")

        # replace: each was refused before the work unless --force; a file that appeared since is kept.
        write_files_atomic([(path, data) for path, data, _ in outputs], replace=args.force, on_written=say_written)
    return EXIT_OK if passed else EXIT_DIVERGED


def _refuse_a_model_beyond_memory(config, args, what):
    """UsageError, before the twins are built, when the parameters of ``config`` in both twins
    (with --grads their gradients, with --float64-reference the torch twin's float64 copy;
    parity/check_memory.py) alone need more memory than is free: no --batch helps."""
    from flaxformer_mini.model import memory
    from parity.check_memory import model_bytes

    model = model_bytes(config, float64_reference=args.float64_reference, grads=args.grads, float64=args.float64)
    short = memory.shortfall(model)
    if short is not None:
        held = (" and their float64 copies" if args.float64 else
                " and the torch twin's float64 copy" if args.float64_reference else "")
        held += ", with their gradients" if args.grads else ""
        raise UsageError(f"{what}: its {memory.param_count(config):,} parameters in both twins{held} take at least "
                         f"{memory.gib(model)}, more than the {short} free: check it on a machine with more memory")


def _refuse_a_batch_beyond_memory(torch_model, config, args, what):
    """UsageError, before the comparison, when the check's records of every submodule output
    of both twins for ``--batch`` rows (parity/check_memory.py) need more memory than is free.
    The bound needs no forward; the count, a forward of one row, runs only past it."""
    from flaxformer_mini.model import memory
    from parity.check_memory import check_bytes

    options = dict(float64_reference=args.float64_reference, grads=args.grads, float64=args.float64)
    if _records_shortfall(check_bytes(torch_model, config, args.batch, bound=True, **options)) is None:
        return
    needed = check_bytes(torch_model, config, args.batch, **options)
    short = _records_shortfall(needed)
    if short is not None:
        raise UsageError(f"--batch {args.batch} of {what} (max_len {config.max_len}, width {config.embed_size}, "
                         f"{config.num_layers}+{config.num_layers} layers) records every submodule output of both "
                         f"twins, {memory.gib(needed)}, more than the {short} free: give a smaller --batch")


def _records_shortfall(needed):
    """``memory.shortfall`` of the check's records on the host and, where JAX computes on an
    accelerator, on that device too: the records are numpy arrays in the host's memory, and the
    accelerator holds the twins' outputs as they are computed. The first shortfall, or None."""
    import jax

    from flaxformer_mini.model import memory

    try:
        devices = [jax.devices("cpu")[0]]
    except RuntimeError:  # JAX_PLATFORMS without cpu: the accelerator's alone can be read
        devices = []
    if jax.local_devices()[0].platform != "cpu":
        devices.append(jax.local_devices()[0])
    return next((short for short in (memory.shortfall(needed, device) for device in devices) if short), None)


def _float64_problem(args):
    """What --float64 cannot go with, in words, or None."""
    if not args.float64:
        return None
    if args.float64_reference:
        return ("--float64 and --float64-reference answer one question two ways: --float64 runs both twins in "
                "float64, --float64-reference judges the float32 twins against torch's in float64; give one")
    if args.decode is not None:
        return "--decode compares the float32 twins' greedy tokens; give it without --float64"
    if args.atol is not None and args.atol > FLOAT64_MAX_ATOL:
        return (f"--atol {args.atol:g} with --float64 keeps a float32-sized tolerance, which passes the slips "
                f"float64 exists to catch; leave --atol out (--float64's {FLOAT64_ATOL:g}) or give at most "
                f"{FLOAT64_MAX_ATOL:g}")
    return None


# ----------------------------------------------------------------------------- convert


def _convert(args):
    from flaxformer_mini.runs.directory import run_holding
    from parity.checkpoint_io import SAFETENSORS_SUFFIX, TORCH_SUFFIXES, load_state_dict, save_state_dict
    from parity.convert import (ConversionError, flax_params_from_state_dict, is_training_run,
                                state_dict_from_flax_params)
    from parity.flax_io import checkpoint_kind, is_orbax_path, read_flax_params, recorded_tokenizers, save_flax_params
    from parity.infer import describe_assumed, with_tie_hint

    source, out = args.input, args.output
    if _same_path(source, out):  # another spelling or a link too: --force would replace IN with its conversion
        raise UsageError(f"IN and OUT are the same path ({source}); write the conversion elsewhere")
    out_suffix = "" if is_orbax_path(out) else Path(out).suffix.lower()
    if is_training_run(source):
        kind = "run"
    else:
        run = run_holding(source)
        if run is not None:  # orbax would say only that the item 'config' is missing
            what = "the checkpoints directory" if Path(source).parent == run else "one checkpoint"
            raise UsageError(f"{source}: this is {what} of a training run; give the run directory ({run}) "
                             f"to export its newest checkpoint")
        kind = checkpoint_kind(source)
    check_parent_writable(Path(out.rstrip("/") or out), "OUT")  # OUT may be an orbax directory
    if not args.force:
        refuse_existing(out)  # before the work: a conversion never replaces a file unasked

    if kind == "torch":
        if out_suffix not in ("", SAFETENSORS_SUFFIX):
            raise UsageError(f"OUT {out}: a torch checkpoint converts to Flax parameters, written as "
                             f"{SAFETENSORS_SUFFIX} or an orbax directory (a path without a suffix, or ending "
                             f"in '/'), not {out_suffix!r}")
        state_dict = _seed_keys(load_state_dict(source), source)
        held = len(state_dict)  # the file's tensors, before the tied keys it lacks are restored
        state_dict, config, sources, assumed, warnings = _torch_config(args, source, state_dict)
        try:
            params = flax_params_from_state_dict(state_dict, config)
        except ConversionError as e:
            raise with_tie_hint(e, config) from None
        # replace_file: OUT was refused above unless --force; one that appeared during the work is kept.
        written = save_flax_params(params, config, out, overwrite=args.force, assumed=assumed,
                                   tokenizers=recorded_tokenizers(source),  # carried on, as `assumed` is
                                   replace_file=args.force)
        for message in warnings:
            warn(args.command, message)
        form = "an orbax directory" if out_suffix == "" else SAFETENSORS_SUFFIX
        print(f"{source} (torch state dict, {held} tensors) -> {written} "
              f"(Flax parameters, {len(params)} arrays in Flax layout, {form}; the config in its metadata"
              + (f", {', '.join(assumed)} marked assumed" if assumed else "") + ")")
    else:
        holds = "a training run and its config" if kind == "run" else "Flax parameters and its config"
        _refuse_config_options(args, f"applies to a torch IN only; {source} holds {holds}")
        sources, assumed = {}, ()
        if out_suffix not in (SAFETENSORS_SUFFIX, *TORCH_SUFFIXES):
            raise UsageError(f"OUT {out}: {'a training run converts' if kind == 'run' else 'Flax parameters convert'} "
                             f"to a torch state dict, written as "
                             f"{', '.join((SAFETENSORS_SUFFIX, *TORCH_SUFFIXES))}, not "
                             f"{out_suffix or 'a directory'!r}")
        tokenizers = None
        if kind == "run":
            from parity.convert import run_tokenizer_checksums

            state_dict, config, step = _training_run_state_dict(args, source)
            what = f"training run, its {_which_checkpoint(source)}: step {step}"
            try:
                tokenizers = run_tokenizer_checksums(source)  # which token each embedding row is
            except (OSError, ValueError) as e:  # a missing, unreadable or edited tokenizer file: the weights still export
                warn(args.command, f"{source}: its tokenizers cannot be read ({e}); OUT records none, so "
                                   f"`train --init-from OUT` cannot check a run's tokenizers against them")
        else:
            params, config, assumed = read_flax_params(source)
            state_dict = state_dict_from_flax_params(params, config)
            what = f"Flax parameters, {len(params)} arrays"
            tokenizers = recorded_tokenizers(source)  # carried on, as `assumed` is
        save_state_dict(state_dict, out, config=config, assumed=assumed, tokenizers=tokenizers, replace=args.force)
        if assumed:
            warn(args.command, f"{source} records these settings as assumed, not known (the seed's defaults "
                               f"when it was converted from torch): {describe_assumed(config, assumed, options=False)}; "
                               f"OUT records them as assumed too")
        carries = ("the config" + (" and the sha256 of the run's tokenizer files" if tokenizers else "")
                   + " in its metadata" if out_suffix == SAFETENSORS_SUFFIX else
                   f"the state dict alone, for strict loading; write {SAFETENSORS_SUFFIX} to carry the config in "
                   f"the file")
        print(f"{source} ({what}) -> {out} (torch state dict, {len(state_dict)} tensors, torch layout; {carries})")
        if kind == "run":
            _note_compute_dtype(args, source)
    c = config
    settings = {"heads": f"{c.heads} heads", "src_pad_idx": f"src_pad_idx {c.src_pad_idx}", "dropout": f"dropout {c.dropout:g}"}
    said = {name: text + (f" ({sources[name]})" if name in sources else "") for name, text in settings.items()}
    print(f"config: {said['src_pad_idx']}, vocab {c.source_vocab_size}/{c.target_vocab_size}, "
          f"max_len {c.max_len}, embed {c.embed_size}, ffn {c.feed_forward_width}, {said['heads']}, "
          f"{c.num_layers}+{c.num_layers} layers, {said['dropout']}{_tied(c)}")
    if kind != "torch":  # what a PyTorch user types, .pt or not
        arguments = ", ".join(f"{k}={v!r}" for k, v in c.to_dict().items())
        print(f"load it with: torch_ref.Transformer({arguments}).load_state_dict(<the state dict>, strict=True)")
    return EXIT_OK


def _tied(config):
    """', embeddings tied ('all')' for a config with tie_embeddings; nothing for the seed's untied model."""
    return f", embeddings tied ({config.tie_embeddings!r})" if config.tie_embeddings else ""


def _note_compute_dtype(args, run):
    """A run that computes in bfloat16 decodes with bfloat16 logits; torch_ref in float32 picks
    other tokens on some inputs (the parameters are float32 either way)."""
    from flaxformer_mini.runs.run import Run

    dtype = Run.open(run).config.dtype  # RUN/best too
    if dtype != "float32":
        print(f"note: {run} computes in {dtype}; the exported parameters are float32, and torch_ref run in "
              f"float32 gives the run's logits only to {dtype}'s precision, so greedy and beam search may pick "
              f"other tokens on some inputs (run torch under torch.autocast(..., dtype=torch.{dtype}) to come "
              f"closer)")


# ----------------------------------------------------------------------------- parser


def _config_options(parser, what):
    group = parser.add_argument_group(
        "what the weights cannot tell",
        f"Sizes (vocabularies, max_len, width, depth) are read from the {what}'s shapes; these are not."
    )
    group.add_argument("--heads", type=int, metavar="H",
                       help="attention heads; must divide the width (default: the file's recorded config, else 8, "
                            "the seed's, with a warning)")
    group.add_argument("--pad-idx", type=int, metavar="P",
                       help="source padding id, masked out by the encoder (default: the file's recorded config, "
                            "else 0, with a warning)")
    group.add_argument("--config", metavar="FILE.json|RUN",
                       help="JSON object of ModelConfig fields (heads, src_pad_idx, dropout, ...), or a flaxformer-mini "
                            "run's config.json or directory (its model); options override it, and it overrides the "
                            "config a .safetensors file records")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="parity", description="Prove the torch and Flax twins of this project's Transformer (torch_ref and "
        "flaxformer_mini) compute the same numbers, and convert its weights. A model of your own converts and "
        "compares through the library: parity.torch_to_flax, parity.compare (docs/porting.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help=f"show the full traceback of an error (or set {DEBUG_ENV}=1)")

    check = sub.add_parser(
        "check", parents=[common], help="run both twins with the same weights and compare every intermediate",
        description="Run the torch and Flax twins with the same weights on seeded, padded inputs and compare "
                    "every intermediate; name the first one that diverges.",
    )
    source = check.add_mutually_exclusive_group()
    source.add_argument("--preset", help="model preset with torch's initialisation (default: seed, the seed tutorial's config)")
    source.add_argument("--torch-checkpoint", metavar="FILE|RUN",
                        help="a seed 001 Transformer state dict (.pt/.pth/.bin, read with weights_only=True, or "
                             ".safetensors), or a training run's directory (its newest checkpoint and config; with --ema, "
                             "its moving average), or RUN/best (its best checkpoint, train --best-metric)")
    _config_options(check, "checkpoint")
    check.add_argument("--atol", type=float, default=None,
                       help=f"max absolute difference allowed (default {DEFAULT_ATOL:g}; {FLOAT64_ATOL:g} with --float64)")
    check.add_argument("--batch", type=int, default=4,
                       help=f"batch size of the seeded inputs, 1 to {MAX_BATCH} (default 4); refused when the check's records "
                            "of every submodule output of both twins at this batch need more memory than is free")
    check.add_argument("--seed", type=int, default=0,
                       help="seed for the inputs (and a preset's weights), 0 to 2**63-1 (default 0)")
    check.add_argument("--grads", action="store_true",
                       help="also compare the loss and every parameter's gradient (token cross-entropy, next-token labels)")
    check.add_argument("--float64-reference", action="store_true",
                       help="also run the torch twin in float64 and measure both float32 twins against it: an output "
                            f"beyond --atol agrees when Flax's error there is at most {FLOAT64_FACTOR}x torch's own "
                            f"in root mean square and {FLOAT64_LARGEST_FACTOR}x at its largest (for a trained model, "
                            "whose float32 rounding alone can pass 1e-5), or when each of its elements is within one "
                            "float32 rounding step of float64's; with --grads the loss and every gradient too, against "
                            "the float64 twin's")
    check.add_argument("--float64", action="store_true",
                       help="run copies of both twins in float64 instead, at --atol 1e-10 by default: no float32 "
                            "rounding on either side, so a slip smaller than 1e-5 (a LayerNorm epsilon) fails and a "
                            "correct port passes at any size and batch; the float32 code paths (casts) are not checked")
    check.add_argument("--decode", type=int, metavar="N",
                       help="also decode N new tokens greedily with KV caches on both twins (the same source batch), "
                            "1 to the model's max_len, and compare the token ids; a row that differs fails the check "
                            "(exit 1) when, at its first differing step, either twin's logit of its own token exceeds its "
                            f"logit of the other's by more than {NEAR_TIE_FACTOR} x --atol, else it is a near-tie, "
                            "reported but not failing")
    check.add_argument("--torch-device", default="cpu", metavar="DEVICE",
                       help="where the torch twin runs: cpu (default), cuda, cuda:1, ...; the Flax twin runs on "
                            "JAX's default device (JAX_PLATFORMS=cpu|cuda picks it)")
    check.add_argument("--all", action="store_true", help="show every row, not only the landmarks")
    check.add_argument("--json", metavar="OUT", help="also write the whole report as JSON")
    check.add_argument("--plot", metavar="OUT.png", help="also draw each intermediate's difference (.png, .svg or .pdf)")
    check.add_argument("--force", action="store_true", help="replace an existing --json or --plot file")
    check.set_defaults(run=_check)

    convert = sub.add_parser(
        "convert", parents=[common], help="torch checkpoint <-> Flax parameters, bit for bit",
        description="A torch state dict (.pt/.pth/.bin/.safetensors) to Flax parameters (OUT.safetensors with Flax "
                    "paths as keys and the config in its metadata, or an orbax directory: OUT without a suffix or "
                    "ending in /); or Flax parameters written by this command, or a training run's newest "
                    "checkpoint (IN: the directory of `flaxformer-mini train --out` or of `flaxformer-mini average "
                    "--out`, with --ema its moving average; RUN/best: its best checkpoint), to a torch state dict "
                    "(OUT .pt/.pth/.bin/.safetensors) that torch_ref.Transformer loads strictly; a .safetensors "
                    "OUT carries the config in its metadata, a .pt OUT the state dict alone. The direction "
                    "follows IN.",
    )
    convert.add_argument("input", metavar="IN",
                         help="torch checkpoint, Flax .safetensors / orbax directory, a training run's directory, "
                              "or RUN/best")
    convert.add_argument("output", metavar="OUT", help="where to write the other framework's parameters")
    convert.add_argument("--force", action="store_true",
                         help="replace an existing OUT (a file, or an orbax directory this command wrote); "
                              "it is replaced only once the new one is complete")
    _config_options(convert, "torch checkpoint")
    convert.set_defaults(run=_convert)
    return parser


def main(argv=None):
    """Run the command line; returns the exit code (also for argparse's own errors)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad options, 0 after --help
        return e.code
    batch, seed = getattr(args, "batch", 1), getattr(args, "seed", 0)
    problem = (f"--batch must be >= 1, got {batch}" if batch < 1 else
               f"--batch must be at most {MAX_BATCH} (every intermediate of both twins is held for the whole "
               f"batch), got {batch}" if batch > MAX_BATCH else
               f"--seed must be between 0 and 2**63-1, got {seed}" if not 0 <= seed <= MAX_SEED else None)
    decode = getattr(args, "decode", None)
    if problem is None and decode is not None and decode < 1:  # max_len is checked once the model is known
        problem = f"--decode must be >= 1 (new tokens to decode on both twins), got {decode}"
    if problem is None and args.command == "check" and args.force and not (args.json or args.plot):
        # It would replace nothing: most likely --json or --plot was forgotten, and the report with it.
        problem = "--force goes with --json or --plot: it replaces an existing --json or --plot file, and none was given"
    if problem is None and args.command == "check":
        problem = _float64_problem(args)
    if problem:  # before any work, and before numpy or JAX answer in their own words
        print(f"parity {args.command}: error: {problem}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.command == "check" and args.atol is None:
        args.atol = FLOAT64_ATOL if args.float64 else DEFAULT_ATOL
    atol = getattr(args, "atol", 0.0)
    if not (math.isfinite(atol) and atol >= 0):  # NaN would pass `< 0` and then fail every row
        print(f"parity {args.command}: error: --atol must be a finite number >= 0, got {atol}", file=sys.stderr)
        return EXIT_UNUSABLE
    previous = _stop_on_sigterm()
    try:
        code = args.run(args)
        sys.stdout.flush()  # here, so that a reader gone away is handled below, not at exit
        return code
    except BrokenPipeError:
        # The reader (`| head -1`) has what it wanted. As the Python docs advise (signal module,
        # "Note on SIGPIPE"): point stdout at devnull so that the flush at exit fails no more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as e:
        if args.debug or os.environ.get(DEBUG_ENV):
            raise
        # Each output is renamed into place whole (parity.output), so one being written when
        # the key was pressed is simply not there: say so, in one line, not a traceback.
        by = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"
        print(f"\nparity {args.command}: stopped by {by}; no output was left half-written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - a user's mistake becomes a message; a bug keeps its traceback
        message = explain(e, args)
        if message is None or args.debug or os.environ.get(DEBUG_ENV):
            raise
        print(f"parity {args.command}: error: {message}", file=sys.stderr)
        return EXIT_UNUSABLE
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, a job scheduler), raised as Ctrl-C is."""


def _raise_terminated(signum, frame):
    raise Terminated


def _stop_on_sigterm():
    """SIGTERM raises Terminated while a command runs, so that the output being written is
    cleaned up as for Ctrl-C (its default action would end the process at once, leaving the
    temporary file or orbax staging directory beside OUT). The handler it replaces, or None
    where Python allows no handler (a thread other than the main one)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def explain(error, args):
    """One line naming the problem for an error a user can fix (exit 2), or None for a bug.

    Unknown presets, unreadable checkpoints, keys that do not fit, an OUT that exists (all
    ValueErrors, named by their raiser), file errors (named by their file) and a dependency not
    installed (named, with the command that installs it). A full disk while writing is not the
    user's mistake, but its fix is theirs, and nothing was written: exit 2 as well (parity's 1
    means "the twins differ").
    """
    missing = describe_missing_dependency(error)
    if missing is not None:
        return missing
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        out = getattr(args, "output", None) or error.filename
        return (f"no space left on the device{f' writing {out}' if out else ''}; nothing was written"
                + (f" ({out} is as it was)" if out and os.path.lexists(out) else "")
                + ": free some space and run the command again")
    if isinstance(error, OSError) and error.filename is not None:
        return describe_os_error(error)  # "FILE: reason (hint)", the wording both CLIs use
    if isinstance(error, (ValueError, OSError)):
        return str(error)
    return None


if __name__ == "__main__":
    sys.exit(main())
