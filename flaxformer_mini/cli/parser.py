"""The ``flaxformer-mini`` command line's options: the parser, every numeric option's range,
and the options that only fail together. Importing it starts no JAX (``--help`` answers in a
fraction of a second)."""

import argparse
import math

from flaxformer_mini.model.config import DTYPES, PRESETS, TIE_EMBEDDINGS, get_preset
from flaxformer_mini.runs.selection import BEST_METRICS

DEBUG_ENV = "FLAXFORMER_MINI_DEBUG"  # set (to anything) for full tracebacks, as --debug

# Defaults of the main job (README): `reverse` to exact match 1.0 on a 2-core CPU.
DEFAULTS = dict(preset="small", steps=3000, batch_size=64, warmup=200, lr=3e-3, seed=0)
TEXT_MAX_LEN, SYNTHETIC_MAX_LEN = 64, 10  # --max-len's defaults: the model's, and the content's
SYNTHETIC_VOCAB_SIZE = 16  # --vocab-size's default for --task (text: None, every word/character)
# Defaults of options that go with one kind of data only: None in the parser, so that one given
# with the other kind is refused by name rather than ignored.
SYNTHETIC_MIN_LEN, SYNTHETIC_EVAL_SEQUENCES, VALID_SIZE = 1, 512, 512
# train.optimizer.SCHEDULES and data.parallel_text.LENGTH_MULTIPLE, written here because
# importing those modules imports JAX or NumPy.
SCHEDULES = ("rsqrt", "constant", "cosine")
LENGTH_MULTIPLE = 8


def split_sizes(args):
    """The sizes a mesh may split (partitioning.check_divisible): the width D, heads H and
    feed-forward width F of the model these options build (the preset's, overridden)."""
    preset = get_preset(args.preset)
    embed = args.embed_size or preset.embed_size
    # As model_config_for: an override replaces the preset's value; F = D where neither sets F.
    ffn = args.ffn_dim or preset.ffn_dim or embed
    return {"embed": embed, "heads": args.heads or preset.heads, "mlp": ffn}


def _clip_norm(text):
    """A positive float, or 'none'/'off' for no clipping (argparse names the option on an error;
    its own message would name this function)."""
    if text.lower() in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, nor 'none' for no clipping") from None


def _columns(text):
    """'S,T': two different 1-based column numbers (argparse names the option on an error)."""
    from flaxformer_mini.data import DataError, check_columns  # late: it imports NumPy, which --help must not

    try:
        return check_columns(text.split(","))
    except DataError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def _finite(v):
    return math.isfinite(v)


# Every numeric option's range, checked once after parsing, before anything is written or
# computed; the message names the option. (argparse's `type=` sees one value at a time and
# words its errors as "argument --x: ..."; this table keeps the ranges in one place.)
SEED_LIMIT = 2**63

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
    # jax.random.key takes a seed below 2**63 (a C long).
    "seed": (lambda v: 0 <= v < SEED_LIMIT, "in [0, 2**63)"),
    "vocab_size": (lambda v: v >= 5, ">= 5 (4 special tokens and at least one value)"),
    "min_len": (lambda v: v >= 1, ">= 1"),
    "max_len": (lambda v: v >= 2, ">= 2"),
    "eval_sequences": (lambda v: v >= 1, ">= 1"),
    "valid_size": (lambda v: v >= 1, ">= 1"),
    "max_tokens": (lambda v: v >= 1, ">= 1"),
    "length_multiple": (lambda v: v >= 1, ">= 1 (1: each batch padded to its longest sequence)"),
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
    "patience": (lambda v: v >= 1, ">= 1 (evaluations without a better --best-metric before the run stops)"),
    "eval_beam_size": (lambda v: v >= 1, ">= 1 (1: greedy)"),
    "eval_length_penalty": (lambda v: _finite(v) and v >= 0, "a finite number >= 0 (0: no length penalty)"),
    "ema": (lambda v: 0 < v < 1, "in (0, 1) (the moving average's decay per update, e.g. 0.999)"),
    "last": (lambda v: v >= 2, ">= 2 (the checkpoints averaged; one would be the checkpoint itself)"),
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
    if args.task and args.vocab_size == 5:  # with one value every task is the same constant map
        return "--vocab-size 5 leaves a synthetic task one value: it takes >= 6 (4 special tokens and two values)"
    sizes = split_sizes(args)
    if sizes["embed"] % sizes["heads"]:
        return (f"the width {sizes['embed']} (--embed-size or --preset {args.preset}) is not divisible by the "
                f"{sizes['heads']} heads (--heads or the preset's): each head takes width / heads")
    if args.schedule == "cosine" and args.warmup >= args.steps:
        return (f"--schedule cosine warms up for --warmup {args.warmup} steps and reaches 0 at --steps {args.steps}: "
                f"--warmup must be below --steps")
    if args.task and (args.min_len or SYNTHETIC_MIN_LEN) > (args.max_len or SYNTHETIC_MAX_LEN):
        return f"--min-len {args.min_len} is greater than --max-len {args.max_len or SYNTHETIC_MAX_LEN}"
    return None


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after an option's help, unless X is None (the help says what
    happens then) or the help already names its default."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


LENGTH_PENALTY = 0.6  # decoding.DEFAULT_LENGTH_PENALTY, for --help without importing JAX (a test checks)


def length_penalty(args):
    """--length-penalty's value, or its default."""
    return LENGTH_PENALTY if args.length_penalty is None else args.length_penalty


def length_penalty_option(parser):
    parser.add_argument("--length-penalty", "--alpha", type=float, default=None, metavar="ALPHA",
                        help=f"beam search ranks a hypothesis by its log-probability divided by GNMT's length penalty "
                             f"((5 + length) / 6) ** ALPHA, length counting its tokens with its EOS (Wu et al. 2016; "
                             f"the Flax WMT example's; not fairseq's --lenpen, which divides by length ** lenpen); "
                             f"0 ranks by log-probability alone, larger values favour longer outputs "
                             f"(default {LENGTH_PENALTY})")


def _decoding_problem(args):
    """Decoding options that only fail together, or do nothing together, named as typed."""
    if getattr(args, "command", None) not in ("generate", "evaluate"):
        return None
    ranked = args.beam_size > 1 or getattr(args, "nbest", None) or getattr(args, "scores", False)
    if args.length_penalty is not None and not ranked:
        return ("--length-penalty goes with --beam-size K > 1" + (" or --nbest or --scores" if args.command == "generate" else "")
                + ": greedy decoding ranks no hypotheses")
    if args.command == "generate" and (args.nbest or args.scores) and (args.temperature is not None
                                                                      or args.top_k is not None):
        return "--nbest and --scores go with greedy decoding or --beam-size, not with sampling (--temperature, --top-k)"
    return None


def _selection_problem(args):
    """Evaluation options that go only with others, named as typed."""
    if getattr(args, "command", None) != "train":
        return None
    if args.patience is not None and args.best_metric is None:
        return ("--patience goes with --best-metric: it counts the evaluations in a row that bring no better "
                "--best-metric")
    if args.eval_length_penalty is not None and args.eval_beam_size == 1:
        return "--eval-length-penalty goes with --eval-beam-size K > 1: greedy decoding ranks no hypotheses"
    return None


def _data_problem(args):
    """Data options that go only with others, named as typed."""
    if getattr(args, "valid", None) and not getattr(args, "data", None):
        return "--valid goes with --data"
    if getattr(args, "task", None):
        for option, value, default in (("--tokenizer", args.tokenizer, None), ("--shared-vocab", args.shared_vocab, False),
                                       ("--tokenizer-from", args.tokenizer_from, None), ("--max-tokens", args.max_tokens, None),
                                       ("--length-multiple", args.length_multiple, None),
                                       ("--valid-size", args.valid_size, None)):
            if value != default:
                return f"{option} goes with --data (synthetic tasks have integer tokens and fixed-size batches)"
    if getattr(args, "data", None):
        for option, value in (("--min-len", getattr(args, "min_len", None)),  # train's; evaluate takes --data too
                              ("--eval-sequences", getattr(args, "eval_sequences", None))):
            if value is not None:
                return f"{option} goes with --task (a text run's lengths and held-out pairs come from its files)"
    if getattr(args, "tokenizer_from", None) is not None:
        given = [option for option, value in (("--tokenizer", args.tokenizer), ("--vocab-size", args.vocab_size),
                                              ("--shared-vocab", args.shared_vocab or None)) if value is not None]
        if given:
            return (f"{' and '.join(given)} cannot go with --tokenizer-from: the tokenizers, their kind, size and "
                    f"sharing are those of the run it names")
    if (getattr(args, "tie_embeddings", None) == "all" and getattr(args, "data", None) and not args.shared_vocab
            and args.tokenizer_from is None):  # --tokenizer-from's run says its sharing: checked once it is read
        return ("--tie-embeddings all goes with --shared-vocab: one embedding table for source and target needs one "
                "vocabulary for both sides (--tie-embeddings decoder ties the target embedding and the output "
                "projection alone)")
    if getattr(args, "columns", None) is not None and not getattr(args, "data", None):
        return ("--columns goes with --data: it says which columns of that file to read"
                + (" (a synthetic task reads no file)" if getattr(args, "task", None) else ""))
    return None


def _output_problem(args):
    """--force without the output it replaces, named as typed."""
    if getattr(args, "command", None) == "evaluate" and args.force and args.output is None:
        # It would replace nothing: most likely --output was forgotten, and the hypotheses with it.
        return "--force goes with --output: it replaces an existing --output file, and none was given"
    return None


def problem(args):
    """What is wrong with the parsed options that argparse cannot see, in one line naming the
    options as typed, or None: checked before anything is read, written or computed."""
    return (_data_problem(args) or check_ranges(args) or _decoding_problem(args) or _selection_problem(args)
            or _output_problem(args))


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
    t.add_argument("--length-multiple", type=int, default=None, metavar="M",
                   help=f"text: pad each batch's source and target lengths up to a multiple of M (default "
                        f"{LENGTH_MULTIPLE}): a larger M compiles fewer batch shapes, a smaller one pads less. "
                        f"Recorded in the run")
    t.add_argument("--accumulate", type=int, default=1, metavar="K",
                   help="accumulate gradients over K micro-batches per optimizer update (= one K-times larger batch)")
    t.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="peak learning rate")
    t.add_argument("--schedule", choices=SCHEDULES, default="rsqrt",
                   help="rsqrt: linear warm-up then 1/sqrt(step) decay ('Attention Is All You Need'); cosine: "
                        "linear warm-up then a half cosine to 0 at --steps (a run's length is then part of its "
                        "recipe: a resume gives the same --steps); constant: --lr throughout")
    t.add_argument("--warmup", type=int, default=DEFAULTS["warmup"], help="warm-up steps")
    t.add_argument("--weight-decay", type=float, default=0.0, help="> 0 uses AdamW")
    t.add_argument("--clip-norm", type=_clip_norm, default=1.0, help="global gradient-norm clipping ('none': off)")
    t.add_argument("--label-smoothing", type=float, default=0.0,
                   help="in [0, 1): the target distribution's mass spread over the vocabulary (default 0: none)")
    t.add_argument("--dropout", type=float, default=None, help="override the preset's dropout")
    t.add_argument("--ema", type=float, default=None, metavar="DECAY",
                   help="keep an exponential moving average of the parameters (Marian's --exponential-smoothing; "
                        "decay min(DECAY, (1 + n) / (10 + n)) at update n), saved in the checkpoints: the evaluation "
                        "during training, evaluate, generate and parity convert use it. Recorded in the run")
    t.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="compute dtype (parameters stay float32)")
    t.add_argument("--init-from", metavar="FILE", default=None,
                   help="start a new run from these weights instead of a random init (fine-tuning; optimizer fresh, "
                        "step 0): a torch_ref Transformer state dict (.safetensors, read without torch; .pt needs "
                        "torch) or parity convert's Flax file or directory. The model comes from the options as "
                        "always and must fit the file exactly (sizes, --max-len, vocabulary sizes). Recorded in "
                        "config.json (path, sha256): a resume gives the same FILE and continues from its checkpoints")
    t.add_argument("--tie-embeddings", choices=TIE_EMBEDDINGS, default=None,
                   help="one table for several embeddings (fairseq's sharing options): decoder ties the target "
                        "embedding and the output projection (--share-decoder-input-output-embed), all ties the "
                        "source embedding too (--share-all-embeddings; text needs --shared-vocab, a synthetic task's "
                        "sides share their tokens); the output bias stays its own. Default: none, the seed's model. "
                        "Recorded in the run")
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
                   help="text: whitespace words (the default), characters, or BPE/Unigram "
                        "subwords trained on the training file (Hugging Face tokenizers)")
    t.add_argument("--shared-vocab", action="store_true", help="text: one tokenizer for source and target")
    t.add_argument("--tokenizer-from", metavar="RUN", default=None,
                   help="text: number tokens as the text run RUN did, with its tokenizers (copied into --out), "
                        "instead of training new ones on --data: for fine-tuning --init-from weights trained with "
                        "them. Its tokenizer kind, size and sharing come with it")
    t.add_argument("--eval-decode-lines", type=int, default=256, metavar="N",
                   help="evaluation during training scores BLEU, chrF, WER and CER on this many held-out lines")
    t.add_argument("--min-len", type=int, default=None,
                   help=f"synthetic: shortest sequence (default {SYNTHETIC_MIN_LEN})")
    t.add_argument("--max-len", type=int, default=None,
                   help=f"synthetic: longest sequence (default {SYNTHETIC_MAX_LEN}); "
                        f"text: the model's max_len (default {TEXT_MAX_LEN})")
    t.add_argument("--eval-sequences", type=int, default=None,
                   help=f"synthetic: held-out sequences (default {SYNTHETIC_EVAL_SEQUENCES})")
    t.add_argument("--valid-size", type=int, default=None,
                   help=f"text: evaluation during training reads this many held-out pairs; without --valid, this many "
                        f"training pairs (at most a tenth) are held out for it (default {VALID_SIZE})")
    t.add_argument("--log-every", type=int, default=50, help="steps between metrics.jsonl lines (default 50; the "
                   "last step is always logged)")
    t.add_argument("--eval-every", type=int, default=500, help="steps between evaluations (default 500; and at the "
                   "last step)")
    t.add_argument("--save-every", type=int, default=500, help="steps between checkpoints (default 500; also at the "
                   "last step and on Ctrl-C/SIGTERM; a process killed with -9 resumes from the last one saved)")
    t.add_argument("--keep", type=int, default=3, help="checkpoints kept (the rotating ones; OUT/best is apart)")
    t.add_argument("--best-metric", choices=BEST_METRICS, default=None,
                   help="keep the state of the best evaluation by this held-out metric in OUT/best (lower loss, wer, "
                        "cer; higher bleu, chrf, exact_match), apart from the rotating checkpoints; evaluate, "
                        "generate and parity convert read it as OUT/best. Recorded in the run")
    t.add_argument("--patience", type=int, default=None, metavar="N",
                   help="with --best-metric: stop when N evaluations in a row bring no better value (a resume "
                        "continues the count; run again with a larger N to train on)")
    t.add_argument("--eval-beam-size", type=int, default=1, metavar="K",
                   help="the evaluation during training decodes with beam search over K hypotheses (1: greedy), so "
                        "--best-metric picks by the decoding users run. Recorded in the run")
    t.add_argument("--eval-length-penalty", type=float, default=None, metavar="ALPHA",
                   help=f"with --eval-beam-size K > 1: the beam's length penalty, as --length-penalty of evaluate and "
                        f"generate (default {LENGTH_PENALTY})")
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

    e = sub.add_parser("evaluate", help="loss, token accuracy, exact match, BLEU, chrF, WER and CER of a run's "
                                        "latest checkpoint on its held-out data (or --data)",
                       parents=[common], formatter_class=_DefaultsHelp,
                       description="Score a run's latest checkpoint on its held-out data, or on the pairs of --data. "
                                   "Hypotheses are decoded as generate decodes them (up to the model's max_len, "
                                   "each stopping at its EOS), so the scores do not depend on --batch-size.")
    e.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="a run directory made by train or average, or RUN/best: the run's best checkpoint (train --best-metric)")
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
    length_penalty_option(e)

    a = sub.add_parser("average", help="average the parameters of a run's last N checkpoints into a new run "
                                       "directory that evaluate, generate and parity convert read",
                       parents=[common], formatter_class=_DefaultsHelp,
                       description="Average the parameters of the last N checkpoints of RUN (its rotating ones: "
                                   "train --keep sets how many there are), as fairseq's average_checkpoints.py "
                                   "--num-epoch-checkpoints does, into --out: a run directory holding one checkpoint "
                                   "(at the newest averaged step; its optimizer state that step's), RUN's config and "
                                   "tokenizers. evaluate, generate and parity convert read it as any run; train does "
                                   "not continue it.")
    a.add_argument("--checkpoint", required=True, metavar="RUN", help="a run directory made by train")
    a.add_argument("--last", type=int, required=True, metavar="N", help="how many of the newest checkpoints to average")
    a.add_argument("--out", required=True, metavar="DIR", help="the averaged run's directory (new, or empty)")

    g = sub.add_parser("generate", help="decode inputs with a run's latest checkpoint", parents=[common],
                       formatter_class=_DefaultsHelp,
                       description="Decode TEXT (the words given), or one input per line of standard input "
                                   "(UTF-8): one output line per input line, in order (--nbest N: N lines). Greedy by "
                                   "default; --beam-size K for beam search (--length-penalty, --nbest, --scores); "
                                   "--temperature/--top-k to sample.",
                       epilog="A blank line gives an empty output line. A line longer than the model takes (its "
                              "max_len, EOS included) gives an empty output line and a warning naming the line, "
                              "its length and the limit; the other lines are decoded and the exit code stays 0. "
                              "Exit code 2: unusable options, run directory or input (no text at all, a token "
                              "outside a synthetic run's values, invalid UTF-8).")
    g.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="a run directory made by train or average, or RUN/best: the run's best checkpoint (train --best-metric)")
    g.add_argument("--beam-size", type=int, default=1, metavar="K", help="beam search over K hypotheses (1: greedy)")
    length_penalty_option(g)
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
    return parser


