"""``flaxformer-mini``: train, evaluate, generate.

    flaxformer-mini train --task reverse --out runs/reverse
    flaxformer-mini train --data train.tsv --valid valid.tsv --out runs/mt
    flaxformer-mini evaluate --checkpoint runs/reverse --json
    flaxformer-mini evaluate --checkpoint runs/mt --data test.tsv --output hypotheses.txt
    flaxformer-mini generate --checkpoint runs/reverse 5 3 9 2 7

Running the same ``train`` command again with the same ``--out`` resumes the run.
Exit codes: 0 done, 1 the run failed (a NaN loss, a full disk; the last checkpoint is kept),
2 unusable options, files or run directories (nothing written or lost), 130 interrupted by
Ctrl-C or SIGTERM (the run was saved and can be resumed). A user's mistake prints one line
naming the problem; ``--debug`` (or FLAXFORMER_MINI_DEBUG=1) shows the traceback.

This module only parses: the options become a ``TrainOptions`` and a ``DataConfig``, and
``Run`` (run.py), ``fit`` (fit.py), ``evaluate_run`` and ``generate`` do the work (the last two
through decode_commands.py, which also holds the decoding options).
"""

import argparse
import errno
import json
import math
import os
import sys

from flaxformer_mini import decode_commands
from flaxformer_mini.config import DTYPES, PRESETS

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEBUG_ENV = "FLAXFORMER_MINI_DEBUG"  # set (to anything) for full tracebacks, as --debug

# Defaults of the main job (README): `reverse` to >= 0.99 exact match on this 2-core CPU.
DEFAULTS = dict(preset="small", steps=3000, batch_size=64, warmup=200, lr=3e-3, seed=0)
TEXT_MAX_LEN, SYNTHETIC_MAX_LEN = 64, 10  # --max-len's defaults: the model's, and the content's
SYNTHETIC_VOCAB_SIZE = 16  # --vocab-size's default for --task (text: None, every word/character)


def _train(args):
    if args.keep_freed_memory:
        from flaxformer_mini.malloc_tunables import restart_keeping_freed_memory

        restart_keeping_freed_memory()  # re-executes with GLIBC_TUNABLES set: see malloc_tunables.py
    from flaxformer_mini.stop import StopRequests

    # Ctrl-C and SIGTERM are ours from here on, before the runtime starts and anything compiles:
    # a signal at any moment stops every process at the same step (fit.py), never the default
    # action (which would end this process at once and abort its peers).
    with StopRequests(force_exit=True) as stop:  # a second Ctrl-C ends the process, even inside a compilation
        return _train_until_stopped(args, stop)


def _train_until_stopped(args, stop):
    from flaxformer_mini import distributed

    # gloo prints its connection lines on stdout (C++): they go to stderr, the result to stdout.
    with distributed.stdout_for_results() as results:
        result = _train_for_result(args, stop)
        if result and distributed.is_main():
            print(json.dumps(result), file=results)  # its step: the run's own where it had gone past --steps
    return EXIT_OK


def _train_for_result(args, stop):
    from flaxformer_mini import distributed

    # Scale-out: the multi-process runtime starts before anything touches a device.
    distributed.start_runtime(args.coordinator, args.num_processes, args.process_id, args.distributed_timeout,
                              program=f"flaxformer-mini {args.command}")
    from flaxformer_mini.fit import fit
    from flaxformer_mini.run import Run
    from flaxformer_mini.run_config import TrainOptions
    from flaxformer_mini.partitioning import parse_mesh
    from flaxformer_mini.sharding import training_mesh

    echo = lambda m: print(m, file=sys.stderr) if distributed.is_main() else None  # noqa: E731
    batch_size = args.batch_size or DEFAULTS["batch_size"]
    if args.max_tokens is not None and args.batch_size is not None:
        echo(f"note: --max-tokens {args.max_tokens} wins: training batches hold up to that many tokens; "
             f"--batch-size {args.batch_size} sets only the evaluation batch size")
    options = TrainOptions(preset=args.preset, embed_size=args.embed_size, heads=args.heads, num_layers=args.layers,
                           ffn_dim=args.ffn_dim, batch_size=batch_size, lr=args.lr, schedule=args.schedule,
                           warmup=args.warmup, weight_decay=args.weight_decay, clip_norm=args.clip_norm,
                           label_smoothing=args.label_smoothing, dropout=args.dropout, dtype=args.dtype,
                           seed=args.seed, max_tokens=args.max_tokens, accumulate=args.accumulate,
                           scan_layers=args.scan_layers, remat=args.remat, init_from=args.init_from)
    # Before anything is written: the mesh, and the model's split sizes against it; the options
    # and data files every process must agree on. An error here on one process (its --data
    # missing on that host, another device count) stops every process at once: the others
    # would otherwise wait for it in agree_on until the timeout, then abort.
    error = mesh = identity = data = None
    try:
        data = _data_config(args, echo)  # --tokenizer-from's run may be missing on this host alone
        # With --max-tokens, --batch-size sets only the evaluation's batches, which every process
        # runs alone: nothing for the mesh to divide.
        mesh = training_mesh(args.devices, args.sharding, None if args.max_tokens is not None else batch_size,
                             model_sizes=_split_sizes(args),
                             mesh_shape=None if args.mesh is None else parse_mesh(args.mesh))
        identity = _identity(args)
    except (ValueError, OSError) as e:
        error = e
    distributed.all_started(error)
    distributed.agree_on(identity)  # every process started with the same options, or none runs
    error = run = None
    try:
        run = Run.start(args.out, options, data, echo=echo)
    except (ValueError, FileNotFoundError) as e:
        error = e
    distributed.all_started(error)  # process 0 refused the directory: every process stops
    try:
        error = None
        try:
            distributed.agree_on_shared_directory(run.path)  # before the first save could hang on it
            # A resumed older run's own settings and process 0's tokenizers, on every process. The
            # others read process 0's files here, after the last collective: an error reading them
            # is gathered, or process 0 would wait for that process in fit until the timeout.
            run = run.follow_main()
        except (ValueError, FileNotFoundError) as e:  # RunConfigError, TokenizerFileError, DataError: ValueErrors
            error = e
        distributed.all_started(error)
    except BaseException:
        run.close()
        raise
    try:
        result = fit(run, args.steps, log_every=args.log_every, eval_every=args.eval_every,
                     save_every=args.save_every, max_to_keep=args.keep, progress=not args.no_progress, mesh=mesh,
                     sharding=args.sharding, echo=echo, stop=stop, plot=not args.no_plot)
    except (RuntimeError, ValueError) as e:
        lost = distributed.as_lost_process(e)
        if lost is None:
            raise
        raise lost from None
    return result


def _data_config(args, echo):
    """The run's DataConfig from the options: a synthetic task's, or a text run's."""
    from flaxformer_mini.run_config import DataConfig

    if args.task:
        return DataConfig(kind="synthetic", task=args.task, vocab_size=args.vocab_size or SYNTHETIC_VOCAB_SIZE,
                          min_len=args.min_len, max_len=args.max_len or SYNTHETIC_MAX_LEN,
                          eval_sequences=args.eval_sequences, eval_decode_lines=args.eval_decode_lines)
    from flaxformer_mini.files import same_file

    if args.valid is not None and same_file(args.valid, args.data):  # allowed: a check that it can fit at all
        echo(f"warning: --valid {args.valid} is the --data file: the held-out scores are on pairs it trains on")
    # --max-len is the model's max_len for text: the longest side, with its EOS. Absolute paths
    # in the run's config: evaluate and resume may run from another directory.
    return DataConfig(kind="tsv", max_len=(args.max_len or TEXT_MAX_LEN) - 1, train_path=os.path.abspath(args.data),
                      valid_path=args.valid and os.path.abspath(args.valid), eval_pairs=args.valid_size,
                      holdout=0 if args.valid else args.valid_size,
                      eval_decode_lines=args.eval_decode_lines, columns=args.columns, **_tokenizer_settings(args, echo))


def _tokenizer_settings(args, echo):
    """A text run's DataConfig tokenizer fields: from the options, or --tokenizer-from's run."""
    if args.tokenizer_from is None:
        return {"tokenizer": args.tokenizer or "word", "tokenizer_vocab_size": args.vocab_size,
                "shared_vocab": args.shared_vocab}
    from flaxformer_mini import tokenizer_from

    return tokenizer_from.settings(args.tokenizer_from, args.out, echo)


def _split_sizes(args):
    """The sizes a mesh may split (partitioning.check_divisible): the width D, heads H and
    feed-forward width F of the model these options build (the preset's, overridden)."""
    from flaxformer_mini.config import get_preset

    preset = get_preset(args.preset)
    embed = args.embed_size or preset.embed_size
    # As model_config_for: an override replaces the preset's value; F = D where neither sets F.
    ffn = args.ffn_dim or preset.ffn_dim or embed
    return {"embed": embed, "heads": args.heads or preset.heads, "mlp": ffn}


def _identity(args):
    """What every process of a run must agree on: its options (not the process id) and
    the content of its data files."""
    from flaxformer_mini.distributed import file_digest

    # Options that act on one process only may differ (--debug on the host being watched).
    own = {"process_id", "coordinator", "distributed_timeout", "no_progress", "no_plot", "run", "debug",
           "keep_freed_memory"}
    identity = {f"--{k.replace('_', '-')}": v for k, v in vars(args).items() if k not in own}
    for option in ("data", "valid"):
        if getattr(args, option, None):
            identity[f"--{option} (sha256 of the file)"] = file_digest(getattr(args, option))
    if getattr(args, "init_from", None) and os.path.exists(args.init_from):  # a missing one: named by Run.start
        from flaxformer_mini.init_from import digest

        identity["--init-from (sha256)"] = digest(os.path.abspath(args.init_from))
    return identity


def _clip_norm(text):
    """A positive float, or 'none'/'off' for no clipping."""
    return None if text.lower() in ("none", "off") else float(text)


def _columns(text):
    """'S,T': two different 1-based column numbers (argparse names the option on an error)."""
    from flaxformer_mini.data import DataError, check_columns

    try:
        return check_columns(text.split(","))
    except DataError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def _finite(v):
    return math.isfinite(v)


# Every numeric option's range, checked once after parsing, before anything is written or
# computed; the message names the option. (argparse's `type=` sees one value at a time and
# words its errors as "argument --x: ..."; this table keeps the ranges in one place.)
RANGES = {
    "steps": (lambda v: v >= 1, ">= 1"),
    "embed_size": (lambda v: v >= 1, ">= 1"),
    "heads": (lambda v: v >= 1, ">= 1"),
    "layers": (lambda v: v >= 1, ">= 1"),
    "ffn_dim": (lambda v: v >= 1, ">= 1"),
    "batch_size": (lambda v: v >= 1, ">= 1"),
    "lr": (lambda v: _finite(v) and v > 0, "a finite number > 0"),
    "warmup": (lambda v: v >= 1, ">= 1"),
    "weight_decay": (lambda v: _finite(v) and v >= 0, "a finite number >= 0 (0: Adam, > 0: AdamW)"),
    "clip_norm": (lambda v: _finite(v) and v > 0, "a finite number > 0, or 'none' for no clipping"),
    "label_smoothing": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "devices": (lambda v: v >= 1, ">= 1"),
    "num_processes": (lambda v: v >= 1, ">= 1"),
    "process_id": (lambda v: v >= 0, ">= 0"),
    "distributed_timeout": (lambda v: v >= 1, ">= 1"),
    "seed": (lambda v: v >= 0, ">= 0"),
    "vocab_size": (lambda v: v >= 5, ">= 5 (4 special tokens and at least one value)"),
    "min_len": (lambda v: v >= 1, ">= 1"),
    "max_len": (lambda v: v >= 2, ">= 2"),
    "eval_sequences": (lambda v: v >= 1, ">= 1"),
    "valid_size": (lambda v: v >= 1, ">= 1"),
    "max_tokens": (lambda v: v >= 1, ">= 1"),
    "accumulate": (lambda v: v >= 1, ">= 1 (micro-batches per optimizer update; 1: no accumulation)"),
    "eval_decode_lines": (lambda v: v >= 1, ">= 1"),
    "log_every": (lambda v: v >= 1, ">= 1"),
    "eval_every": (lambda v: v >= 1, ">= 1"),
    "save_every": (lambda v: v >= 1, ">= 1"),
    "keep": (lambda v: v >= 1, ">= 1"),
    "beam_size": (lambda v: v >= 1, ">= 1"),
    "length_penalty": (lambda v: _finite(v) and v >= 0, "a finite number >= 0 (0: no length penalty)"),
    "nbest": (lambda v: v >= 1, ">= 1"),
    "max_new_tokens": (lambda v: v >= 1, ">= 1"),
    "temperature": (lambda v: v > 0, "> 0 (inf samples uniformly; greedy decoding is the limit -> 0)"),
    "top_k": (lambda v: v >= 1, ">= 1"),
}


def check_ranges(args):
    """The first option outside its range, as '--name must be ...', or None; then the options
    that only fail together, named as the user typed them (the configs would name their fields)."""
    for dest, (ok, requirement) in RANGES.items():
        value = getattr(args, dest, None)
        if value is not None and not ok(value):
            return f"--{dest.replace('_', '-')} must be {requirement}, got {value}"
    if getattr(args, "command", None) != "train":
        return None
    sizes = _split_sizes(args)
    if sizes["embed"] % sizes["heads"]:
        return (f"the width {sizes['embed']} (--embed-size or --preset {args.preset}) is not divisible by the "
                f"{sizes['heads']} heads (--heads or the preset's): each head takes width / heads")
    if args.task and args.min_len > (args.max_len or SYNTHETIC_MAX_LEN):
        return f"--min-len {args.min_len} is greater than --max-len {args.max_len or SYNTHETIC_MAX_LEN}"
    return None


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after an option's help, unless X is None (the help says what
    happens then) or the help already names its default."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser():
    parser = argparse.ArgumentParser(prog="flaxformer-mini", description="Train and evaluate the Flax seq2seq Transformer.")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.commands = sub.choices  # {name: its parser}: main's checks speak with the command's parser
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help=f"show the full traceback of an error (or set {DEBUG_ENV}=1)")

    t = sub.add_parser("train", help="train a model (resumes when --out holds the same run)", parents=[common],
                       formatter_class=_DefaultsHelp)
    source = t.add_mutually_exclusive_group(required=True)
    source.add_argument("--task", choices=("copy", "reverse", "sort"), help="a synthetic task over integer tokens")
    source.add_argument("--data", metavar="TRAIN.tsv", help="parallel text, one 'source<TAB>target' per line")
    t.add_argument("--valid", metavar="VALID.tsv",
                   help="held-out pairs for --data (default: --valid-size pairs held out of the training file)")
    t.add_argument("--columns", type=_columns, metavar="S,T",
                   help="source and target columns of --data and --valid (1-based, as cut -f): 2,1 trains the other "
                        "direction, 1,2 reads a file with more columns (Tatoeba's attribution); default: exactly two, "
                        "source first")
    t.add_argument("--out", required=True, help="run directory: config, metrics.jsonl, checkpoints, loss.png")
    t.add_argument("--preset", default=DEFAULTS["preset"], choices=sorted(PRESETS),
                   help="model size: small (the default, for the synthetic tasks), medium (real corpora on a CPU), "
                        "transformer-base (the paper's base model), seed, base, tiny")
    t.add_argument("--embed-size", type=int, default=None, help="override the preset's width D")
    t.add_argument("--heads", type=int, default=None, help="override the preset's attention heads H")
    t.add_argument("--layers", type=int, default=None, help="override the preset's layers (each of encoder and decoder)")
    t.add_argument("--ffn-dim", type=int, default=None, help="override the preset's feed-forward width F")
    t.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="total optimizer steps")
    t.add_argument("--batch-size", type=int, default=None,
                   help=f"sentences per training batch (default {DEFAULTS['batch_size']}); with --max-tokens, "
                        f"--max-tokens wins and this sets only the evaluation batch size")
    t.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="text: batches of at most N tokens (source or target, padding included), bucketed by "
                        "length (fairseq's --max-tokens, but global: the budget of the whole batch over every device)")
    t.add_argument("--accumulate", type=int, default=1, metavar="K",
                   help="accumulate gradients over K micro-batches per optimizer update (= one K-times larger batch)")
    t.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="peak learning rate")
    t.add_argument("--schedule", choices=("rsqrt", "constant"), default="rsqrt",
                   help="rsqrt: linear warm-up then 1/sqrt(step) decay ('Attention Is All You Need')")
    t.add_argument("--warmup", type=int, default=DEFAULTS["warmup"], help="warm-up steps")
    t.add_argument("--weight-decay", type=float, default=0.0, help="> 0 uses AdamW")
    t.add_argument("--clip-norm", type=_clip_norm, default=1.0, help="global gradient-norm clipping ('none': off)")
    t.add_argument("--label-smoothing", type=float, default=0.0,
                   help="in [0, 1): the target distribution's mass spread over the vocabulary (default 0: none)")
    t.add_argument("--dropout", type=float, default=None, help="override the preset's dropout")
    t.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="compute dtype (parameters stay float32)")
    t.add_argument("--init-from", metavar="FILE", default=None,
                   help="start a new run from these weights instead of a random init (fine-tuning; optimizer fresh, "
                        "step 0): a torch_ref Transformer state dict (.safetensors, read without torch; .pt needs "
                        "torch) or parity convert's Flax file or directory. The model comes from the options as "
                        "always and must fit the file exactly (sizes, --max-len, vocabulary sizes). Recorded in "
                        "config.json (path, sha256): a resume gives the same FILE and continues from its checkpoints")
    t.add_argument("--scan-layers", action="store_true",
                   help="hold each side's layers as one stacked block run by a scan: compile time stays flat in "
                        "depth (checkpoints hold stacked parameters; recorded in the run)")
    t.add_argument("--remat", action="store_true",
                   help="recompute each layer's activations in the backward pass instead of keeping them: less "
                        "memory at long sequences, about one more forward pass of time")
    layout = t.add_mutually_exclusive_group()
    layout.add_argument("--devices", type=int, default=None,
                        help="shard each batch over this many devices per process (data parallelism); default: all")
    layout.add_argument("--mesh", metavar="data=D,model=M", default=None,
                        help="a 2-D mesh of all D x M devices: batches split over data, attention heads and "
                             "feed-forward units over model (tensor parallelism)")
    t.add_argument("--sharding", choices=("replicated", "fsdp"), default="replicated",
                   help="over the data axis: replicate parameters, or shard them FSDP-style (along the width D)")
    t.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="seeds initialisation, data and dropout")
    t.add_argument("--vocab-size", type=int, default=None,
                   help=f"synthetic: token ids, 4 special ones included (default {SYNTHETIC_VOCAB_SIZE}); text: the "
                        f"tokenizer's vocabulary size, 4 special tokens included (needed for bpe/unigram; for "
                        f"word it keeps the most frequent words; char keeps every character, so it must be at least "
                        f"their number + 4; default: all)")
    t.add_argument("--tokenizer", choices=("word", "char", "bpe", "unigram"), default=None,
                   help="text: whitespace words (today's vocabularies; the default), characters, or BPE/Unigram "
                        "subwords trained on the training file (Hugging Face tokenizers)")
    t.add_argument("--shared-vocab", action="store_true", help="text: one tokenizer for source and target")
    t.add_argument("--tokenizer-from", metavar="RUN", default=None,
                   help="text: number tokens as the text run RUN did, with its tokenizers (copied into --out), "
                        "instead of training new ones on --data: for fine-tuning --init-from weights trained with "
                        "them. Its tokenizer kind, size and sharing come with it")
    t.add_argument("--eval-decode-lines", type=int, default=256, metavar="N",
                   help="evaluation during training scores BLEU, chrF, WER and CER on this many held-out lines")
    t.add_argument("--min-len", type=int, default=1, help="synthetic: shortest sequence")
    t.add_argument("--max-len", type=int, default=None,
                   help=f"synthetic: longest sequence (default {SYNTHETIC_MAX_LEN}); "
                        f"text: the model's max_len (default {TEXT_MAX_LEN})")
    t.add_argument("--eval-sequences", type=int, default=512, help="synthetic: held-out sequences")
    t.add_argument("--valid-size", type=int, default=512,
                   help="text: evaluation during training reads this many held-out pairs; without --valid, this many "
                        "training pairs (at most a tenth) are held out for it")
    t.add_argument("--log-every", type=int, default=50, help="steps between metrics.jsonl lines (default 50; the "
                   "last step is always logged)")
    t.add_argument("--eval-every", type=int, default=500, help="steps between evaluations (default 500; and at the "
                   "last step)")
    t.add_argument("--save-every", type=int, default=500, help="steps between checkpoints (default 500; also at the "
                   "last step and on Ctrl-C/SIGTERM; a process killed with -9 resumes from the last one saved)")
    t.add_argument("--keep", type=int, default=3, help="checkpoints kept")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--no-plot", action="store_true",
                   help="do not draw loss.png at the end (sweeps, CI; metrics.jsonl and TensorBoard hold the curves)")
    t.add_argument("--keep-freed-memory", action="store_true",
                   help="CPU, large models: keep freed host memory in the process (one glibc arena, no mmap), so "
                        "each step stops page-faulting its temporaries in; slower for small models "
                        "(flaxformer_mini/malloc_tunables.py)")
    scale = t.add_argument_group("scale-out (docs/scale-out.md): one process per host, every process the same "
                                 "command; with none of these, JAX's own detection (JAX_COORDINATOR_ADDRESS, "
                                 "JAX_NUM_PROCESSES, JAX_PROCESS_ID, SLURM, Open MPI, Cloud TPU)")
    scale.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address, the same on every process")
    scale.add_argument("--num-processes", type=int, metavar="N", help="how many processes the run has")
    scale.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0 to N-1")
    scale.add_argument("--distributed-timeout", type=int, default=300, metavar="SECONDS",
                       help="give up on an unreachable coordinator, or on a silent process, after this long")
    t.set_defaults(run=_train)

    e = sub.add_parser("evaluate", help="loss, token accuracy, exact match, BLEU, chrF, WER and CER of a run's "
                                        "latest checkpoint on its held-out data (or --data)",
                       parents=[common],
                       description="Score a run's latest checkpoint on its held-out data, or on the pairs of --data. "
                                   "Hypotheses are decoded as generate decodes them (up to the model's max_len, "
                                   "each stopping at its EOS), so the scores do not depend on --batch-size.")
    e.add_argument("--checkpoint", required=True, metavar="DIR", help="a run directory made by train")
    e.add_argument("--data", metavar="FILE.tsv",
                   help="score these pairs (one 'source<TAB>target' per line, read as training data, encoded with "
                        "the run's saved tokenizers) instead of the run's held-out data")
    e.add_argument("--columns", type=_columns, metavar="S,T",
                   help="source and target columns of --data (1-based); default: the run's --columns")
    e.add_argument("--json", action="store_true",
                   help="print one JSON object: loss, token_accuracy, exact_match, bleu, chrf, wer, cer")
    e.add_argument("--output", metavar="FILE",
                   help="write the decoded hypotheses, one per line: with --data, one per line of the file (an empty line "
                        "for a blank line and for a pair longer than the run's max length); else in held-out order. "
                        "An existing FILE is refused unless --force")
    e.add_argument("--force", action="store_true", help="replace an existing --output file")
    e.add_argument("--batch-size", type=int, default=None,
                   help="examples decoded together (default: the run's); the hypotheses do not depend on it")
    e.add_argument("--beam-size", type=int, default=1, help="exact match of the best beam (1: greedy)")
    decode_commands.length_penalty_option(e)
    e.set_defaults(run=decode_commands.evaluate_command)

    g = sub.add_parser("generate", help="decode inputs with a run's latest checkpoint", parents=[common],
                       description="Decode TEXT (the words given), or one input per line of standard input "
                                   "(UTF-8): one output line per input line, in order (--nbest N: N lines). Greedy by "
                                   "default; --beam-size K for beam search (--length-penalty, --nbest, --scores); "
                                   "--temperature/--top-k to sample.",
                       epilog="A blank line gives an empty output line. A line longer than the model takes (its "
                              "max_len, EOS included) gives an empty output line and a warning naming the line, "
                              "its length and the limit; the other lines are decoded and the exit code stays 0. "
                              "Exit code 2: unusable options, run directory or input (no text at all, a token "
                              "outside a synthetic run's values, invalid UTF-8).")
    g.add_argument("--checkpoint", required=True, metavar="DIR", help="a run directory made by train")
    g.add_argument("--beam-size", type=int, default=1, metavar="K", help="beam search over K hypotheses (1: greedy)")
    decode_commands.length_penalty_option(g)
    g.add_argument("--nbest", type=int, default=None, metavar="N",
                   help="print the N best hypotheses of the beam (N <= --beam-size), best first: N lines per input, "
                        "so input i's are lines (i-1)*N+1 to i*N (an input not decoded: N empty lines)")
    g.add_argument("--scores", action="store_true",
                   help="print each hypothesis as 'SCORE<TAB>TEXT' (fairseq's H lines without their H-ID; its "
                        "log-probability in natural log, where fairseq prints base 2, divided by the length penalty); "
                        "greedy decoding too (beam size 1)")
    g.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help="at most N tokens per output, EOS included (default: the model's max_len); a warning on "
                        "standard error counts the outputs cut there before their EOS")
    g.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="sample instead of decoding greedily: logits divided by T > 0 (1 when only --top-k is given)")
    g.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sample from the K most likely tokens only (with --temperature, or at temperature 1)")
    g.add_argument("--seed", type=int, default=0, help="seed for sampling")
    g.add_argument("--batch-size", type=int, default=64, help="inputs decoded together (memory is bounded by it)")
    g.add_argument("text", nargs="*", help="the input; if absent, one input per line of standard input")
    g.set_defaults(run=decode_commands.generate_command)
    return parser


def main(argv=None):
    top = build_parser()
    args = top.parse_args(argv)
    # The command's own parser says what is wrong: its usage line and "flaxformer-mini train: error:".
    parser = top.commands[args.command]
    if getattr(args, "valid", None) and not getattr(args, "data", None):
        parser.error("--valid goes with --data")
    if getattr(args, "task", None):
        for option, value, default in (("--tokenizer", args.tokenizer, None), ("--shared-vocab", args.shared_vocab, False),
                                       ("--tokenizer-from", args.tokenizer_from, None), ("--max-tokens", args.max_tokens, None)):
            if value != default:
                parser.error(f"{option} goes with --data (synthetic tasks have integer tokens and fixed-size batches)")
    if getattr(args, "tokenizer_from", None) is not None:
        given = [option for option, value in (("--tokenizer", args.tokenizer), ("--vocab-size", args.vocab_size),
                                              ("--shared-vocab", args.shared_vocab or None)) if value is not None]
        if given:
            parser.error(f"{' and '.join(given)} cannot go with --tokenizer-from: the tokenizers, their kind, size and "
                         f"sharing are those of the run it names")
    if getattr(args, "columns", None) is not None and not getattr(args, "data", None):
        parser.error("--columns goes with --data: it says which columns of that file to read"
                     + (" (a synthetic task reads no file)" if getattr(args, "task", None) else ""))
    problem = check_ranges(args) or decode_commands.option_problem(args)
    if problem:
        parser.error(problem)
    try:
        return args.run(args) or EXIT_OK  # evaluate and generate return None when done
    except KeyboardInterrupt as e:
        from flaxformer_mini.stop import STOPPED_AT_ONCE, StopNow, Stopped

        if isinstance(e, StopNow):  # a second Ctrl-C: in the watcher's words (stop.py), had it come first
            print(f"\n{STOPPED_AT_ONCE}", file=sys.stderr)
        elif not isinstance(e, Stopped):  # a Ctrl-C before the stop handler was in
            print("\nstopped", file=sys.stderr)
        else:  # fit raises it, so jax is up; process 0 said it already (train's echo), the others say it too
            from flaxformer_mini import distributed

            if not distributed.is_main():
                print(e, file=sys.stderr)
        if _exits_at_once(e):
            sys.stdout.flush(), sys.stderr.flush(), os._exit(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - a user's mistake becomes a message; a bug keeps its traceback
        code, message = explain(e)
        if code is None or args.debug or os.environ.get(DEBUG_ENV):
            raise
        print(f"flaxformer-mini {args.command}: error: {message}", file=sys.stderr)
        if type(e).__name__ == "ProcessLostError":  # jax's exit barrier would wait for the lost process
            sys.stdout.flush(), sys.stderr.flush(), os._exit(EXIT_FAILED)
        return code


def _exits_at_once(interrupt):
    """A second Ctrl-C (StopNow) ends the process here, without Python's shutdown, which would
    wait: for an XLA compilation still running (StopNow reaches Python while the compile runs
    on, 4.5 s of a base model's here, minutes of a large model's on a GPU), and, in a
    multi-process run, at jax's exit barrier for peers still in the run (every process then
    aborted after its timeout). The peers stop with "lost contact"; the last complete
    checkpoint is kept, as after ``kill -9``. The coordinated stop (Stopped) exits normally."""
    from flaxformer_mini.stop import StopNow

    return isinstance(interrupt, StopNow)


def explain(error):
    """(exit code, one-line message) for an error a user can fix, or (None, None) for a bug.

    2: unusable options, files or run directories (nothing was written, or nothing lost);
    1: a run that failed on the way (a NaN loss, a full disk): its last checkpoint is kept.
    """
    from flaxformer_mini.distributed import ProcessLostError
    from flaxformer_mini.fit import NonFiniteLossError

    if isinstance(error, (NonFiniteLossError, ProcessLostError)):
        return EXIT_FAILED, str(error)
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {error.filename}" if error.filename else ""
        return EXIT_FAILED, (f"no space left on the device{where}. The last complete checkpoint is kept: "
                             f"free some space, then run the same command to resume")
    if isinstance(error, OSError) and error.filename is not None:
        hint = {errno.EISDIR: "give a file, not a directory", errno.EACCES: "check its permissions",
                errno.ENOENT: "check the path", errno.ENOTDIR: "a part of the path is a file, not a directory"}
        reason = error.strerror or type(error).__name__
        return EXIT_UNUSABLE, f"{error.filename}: {reason}" + (f" ({hint[error.errno]})" if error.errno in hint else "")
    if isinstance(error, (ValueError, FileNotFoundError)):  # bad files, configs or options, named by the raiser
        return EXIT_UNUSABLE, str(error)
    return None, None


if __name__ == "__main__":
    sys.exit(main())
