"""Whole-run training parity, PyTorch against Flax: ``python -m benchmarks.train_parity``.

    python -m benchmarks.train_parity --data data/cmudict --steps 3000 --eval-every 250 --seeds 0 1 --out OUT
    python -m benchmarks.train_parity --task reverse --preset tiny --steps 200 --eval-every 50
    python -m benchmarks.train_parity --merge SEED0/train_parity.json SEED1/train_parity.json --out OUT

MLCommons AlgoPerf's question for the two twins: from the same start, do they reach the same
held-out score, and how fast? For each seed, in one process:

- the same initial weights: ``torch_ref.Transformer`` initialised from ``torch.manual_seed(seed)``
  and converted into the Flax twin (``parity.transformer_pair``);
- the same batches in the same order: the run's data as ``flaxformer-mini train`` builds it
  (``runs.Run``: tokenizers trained on the training file, ``TextPairs`` and their
  length-bucketed batches of ``--batch-size`` pairs, or ``--max-tokens`` batches; a synthetic
  task's batches), each numpy batch drawn once and fed to both twins;
- the same recipe: ``flaxformer_mini.train.Trainer`` with the run's ``TrainConfig`` against
  ``torch_ref.training.make_optimizer`` and ``train_step`` with every one of its settings
  (Adam or AdamW, the schedule, clipping, label smoothing, dropout);
- the same evaluation: at step 0, every ``--eval-every`` steps and at the last step, on the same
  held-out pairs, teacher-forced loss and token accuracy, then greedy decoding (or beam search,
  ``--beam-size``) to the model's max_len with each twin's cached decoder
  (``flaxformer_mini.decode.evaluation.evaluate``, the product's; ``torch_ref.CachedDecoder``),
  the hypotheses scored by the same code (``decode.metrics``).

Dropout draws differ between the frameworks (torch's generator against JAX's keys). With
``--dropout 0`` nothing random is left after the init and the batches, so the curves must
track step for step until float32 rounding, amplified by training, moves them apart; with
dropout they are compared as statistics, across ``--seeds``.

The twins take turns step by step (which goes first alternates), each step timed on its own
until its results are back on the host (``block_until_ready`` for JAX, ``.item()`` inside
``train_step`` for torch), so neither runs while the other is timed and a drift in the
machine's load hits both. Training time excludes evaluation and drawing the batches (both
reported), as AlgoPerf's time to target does, and includes JAX's compilation of each new
batch shape (reported apart: ``first_shape_s``). Throughput is target tokens (non-padding
labels, the loss's count) per second of training time.

Held-out metrics, per evaluation and twin: ``loss``, ``token_accuracy``, ``exact_match``,
``word_error_rate`` = 1 - exact match (a sequence is wrong if any of its tokens is: G2P's
word error rate), ``token_error_rate`` = the edit distance over the target's space-separated
tokens per reference token (G2P's phoneme error rate, PER; ``evaluate``'s ``wer``), ``cer``,
``bleu``, ``chrf``. ``--target-wer`` and ``--target-per`` set the validation targets: each
twin's training time, and step, at its first evaluation at or below them.

Writes ``OUT/train_parity.json`` (schema in ``build_report``) and ``OUT/train_parity.png``,
headed by the machine (``benchmarks.machine``), the date and the code's commit, and prints a
table. The verdict: the Flax twin's final held-out WER is no worse than the
torch twin's by more than the spread of the seeds (the larger of the two twins' max - min
across seeds). Nothing here asserts it; ``tests/test_train_parity_benchmark.py`` runs a
smoke version.

``--merge`` joins reports of the same recipe run for different seeds (seeds run one at a time,
on one kind of machine) into one report and its verdict; it refuses reports of another recipe
or CPU, of another ``torch_threads``, ``XLA_FLAGS`` or ``GLIBC_TUNABLES``, or of a seed twice.
The same data files at another path are the same recipe where both reports record the files'
sha256 (``recipe.data_sha256``). A merged report can be merged again: each run keeps its own
``merged_from`` entry (date, commit, argv).

Ctrl-C (or SIGTERM) ends a run with one line: ``OUT/train_parity.json`` then holds the seeds
finished before it, as a report of those seeds (no plot), or nothing is written.
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import one_at_a_time
from benchmarks.earlier_runs import same_cpu
from benchmarks.outputs import directory_problem
from flaxformer_mini.cli.parser import LENGTH_MULTIPLE, SCHEDULES

JSON_NAME, PLOT_NAME = "train_parity.json", "train_parity.png"
TWINS = ("flax", "torch")
EVAL_METRICS = ("loss", "token_accuracy", "exact_match", "word_error_rate", "token_error_rate", "cer", "bleu", "chrf")
TARGETS = {"wer": "word_error_rate", "per": "token_error_rate"}  # --target-X: the metric it is on


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _fraction(text):
    value = float(text)
    if not 0.0 <= value <= 1.0:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be a rate in [0, 1], got {text}")
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_parity",
                                     description=__doc__.split("\n\n")[0])
    data = parser.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", metavar="DIR", help="a directory with train.tsv and valid.tsv (python -m "
                                                    "flaxformer_mini.data.corpora cmudict DIR writes one)")
    data.add_argument("--task", choices=("copy", "reverse", "sort"), help="a synthetic task instead")
    data.add_argument("--merge", nargs="+", metavar="REPORT",
                      help="join train_parity.json reports of one recipe run for different seeds (trains nothing)")
    parser.add_argument("--steps", type=_positive_int, help="optimizer steps per twin and seed (required to train)")
    parser.add_argument("--eval-every", type=_positive_int,
                        help="steps between evaluations (also at step 0 and at the last step; required to train)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="one run of both twins per seed: init, batch order and dropout (default: 0)")
    parser.add_argument("--out", default="train_parity", help="directory for the JSON and the plot "
                                                              "(default: ./train_parity)")
    parser.add_argument("--torch-threads", type=_positive_int,
                        help="torch's intra-op threads (default: the cores this process may use, as python -m "
                             "benchmarks; on a loaded machine 1 avoids OpenMP's threads waiting on each other)")
    m = parser.add_argument_group("model (as flaxformer-mini train)")
    m.add_argument("--preset", default="small", help="model preset (default: small)")
    m.add_argument("--embed-size", type=_positive_int)
    m.add_argument("--heads", type=_positive_int)
    m.add_argument("--layers", type=_positive_int)
    m.add_argument("--ffn-dim", type=_positive_int)
    m.add_argument("--dropout", type=float, help="both twins' dropout (default: the preset's)")
    m.add_argument("--max-len", type=_positive_int,
                   help="text: the model's max_len (default 32); synthetic: the longest sequence (default 10)")
    r = parser.add_argument_group("recipe (as flaxformer-mini train)")
    r.add_argument("--batch-size", type=_positive_int, default=64,
                   help="pairs a step (default 64); with --max-tokens, the evaluation's batch size")
    r.add_argument("--max-tokens", type=_positive_int, help="token-budget training batches instead")
    r.add_argument("--length-multiple", type=_positive_int, default=LENGTH_MULTIPLE,
                   help=f"text: batch lengths padded up to a multiple of this (default {LENGTH_MULTIPLE})")
    r.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    r.add_argument("--schedule", choices=SCHEDULES, default="rsqrt", help="cosine reaches 0 at --steps")
    r.add_argument("--warmup", type=_positive_int, default=200)
    r.add_argument("--weight-decay", type=float, default=0.0)
    r.add_argument("--clip-norm", type=float, default=1.0, help="global-norm clipping (0: none; default 1.0)")
    r.add_argument("--label-smoothing", type=float, default=0.0)
    e = parser.add_argument_group("evaluation")
    e.add_argument("--valid-size", type=_positive_int, default=512,
                   help="held-out pairs (text) or sequences (synthetic) evaluated (default 512)")
    e.add_argument("--beam-size", type=_positive_int, default=1, help="1: greedy (default); both twins")
    e.add_argument("--target-wer", type=_fraction, help="validation target on the word error rate (1 - exact match)")
    e.add_argument("--target-per", type=_fraction, help="validation target on the token (phoneme) error rate")
    s = parser.add_argument_group("synthetic task")
    s.add_argument("--vocab-size", type=_positive_int, default=16)
    s.add_argument("--min-len", type=_positive_int, default=1)
    args = parser.parse_args(argv)
    if args.merge is None:
        for option in ("steps", "eval_every"):
            if getattr(args, option) is None:
                parser.error(f"--{option.replace('_', '-')} is required to train (only --merge trains nothing)")
    else:
        for path in args.merge:
            if not os.path.isfile(path):
                parser.error(f"--merge {path}: no such file (give the train_parity.json of each run)")
    if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
        parser.error(f"--seeds must be distinct integers >= 0, got {' '.join(map(str, args.seeds))}")
    if args.data is not None:
        for name in ("train.tsv", "valid.tsv"):
            if not os.path.isfile(os.path.join(args.data, name)):
                parser.error(f"--data {args.data}: no {name} there (python -m flaxformer_mini.data.corpora cmudict "
                             f"{args.data} writes train.tsv, valid.tsv and test.tsv)")
    if args.merge is not None:
        # The reports' own recipe is kept: a training option beside --merge would be ignored.
        for action in parser._actions:
            if action.option_strings and action.dest in TRAINING_DESTS and (
                    getattr(args, action.dest) != action.default):
                parser.error(f"{action.option_strings[0]} has no effect with --merge (the reports' recipe is kept)")
    if problem := directory_problem(args.out, "--out"):
        parser.error(problem)  # before the run, not after it
    if args.merge is None:
        try:
            check_recipe(args)  # a bad --lr, --dropout or --preset: refused here, not as a traceback later
        except ValueError as e:
            parser.error(as_options(str(e), args))
    return args


# The options that shape a training run (all but --data, --task, --merge and --out).
TRAINING_DESTS = ("steps", "eval_every", "seeds", "torch_threads", "preset", "embed_size", "heads", "layers",
                  "ffn_dim", "dropout", "max_len", "batch_size", "max_tokens", "length_multiple", "lr", "schedule",
                  "warmup", "weight_decay", "clip_norm", "label_smoothing", "valid_size", "beam_size", "target_wer",
                  "target_per", "vocab_size", "min_len")
# The config fields a recipe error names, as the options that set them.
FIELD_OPTIONS = {"dropout": "--dropout", "embed_size": "--embed-size", "heads": "--heads", "learning_rate": "--lr",
                 "label_smoothing": "--label-smoothing", "clip_norm": "--clip-norm",
                 "weight_decay": "--weight-decay", "warmup_steps": "--warmup", "decay_steps": "--steps",
                 "vocab_size": "--vocab-size", "min_len": "--min-len", "max_len": "--max-len"}


def check_recipe(args):
    """Raise ValueError where ``args``' recipe cannot run: the configs ``flaxformer-mini train``
    would build (with a placeholder vocabulary for a text run, whose own is known once its
    tokenizers are trained), and a synthetic task's lengths."""
    from flaxformer_mini.data.synthetic import SyntheticTask
    from flaxformer_mini.runs.config import resolve_config

    if args.task and args.max_tokens is not None:
        raise ValueError(f"--max-tokens goes with --data (synthetic tasks have fixed-size batches), got "
                         f"--max-tokens {args.max_tokens}")
    options, data = recipe(args)
    if args.task:
        SyntheticTask(args.task, data.vocab_size, data.min_len, data.max_len)
    vocab = data.vocab_size if args.task else 64
    resolve_config(options, data, vocab, vocab)


def as_options(message, args):
    """A config error in the options' names: ``lr_factor`` (the rsqrt schedule's factor, from
    --lr) is said as --lr with the value given."""
    import re

    if "lr_factor" in message:
        return re.sub(r"lr_factor (must be [^,]*), got \S+", rf"--lr \1, got {args.lr}", message)
    if message.startswith("unknown preset"):
        return f"--preset: {message}"
    for field, option in FIELD_OPTIONS.items():
        message = re.sub(rf"(?<![-\w]){field}\b", option, message)
    return message.replace("or None (no clipping)", "or 0 (no clipping)")


def recipe(args):
    """(TrainOptions, DataConfig) of ``args``: what ``flaxformer-mini train`` would build."""
    from flaxformer_mini.runs.config import DataConfig, TrainOptions

    options = TrainOptions(preset=args.preset, embed_size=args.embed_size, heads=args.heads, num_layers=args.layers,
                           ffn_dim=args.ffn_dim, batch_size=args.batch_size, lr=args.lr, schedule=args.schedule,
                           warmup=args.warmup, weight_decay=args.weight_decay,
                           clip_norm=args.clip_norm or None, label_smoothing=args.label_smoothing,
                           dropout=args.dropout, seed=args.seeds[0], max_tokens=args.max_tokens,
                           steps=args.steps)
    if args.task:
        data = DataConfig(kind="synthetic", task=args.task, vocab_size=args.vocab_size, min_len=args.min_len,
                          max_len=args.max_len or 10, eval_sequences=args.valid_size)
    else:
        data = DataConfig(kind="tsv", max_len=(args.max_len or 32) - 1,
                          train_path=os.path.abspath(os.path.join(args.data, "train.tsv")),
                          valid_path=os.path.abspath(os.path.join(args.data, "valid.tsv")),
                          eval_pairs=args.valid_size, tokenizer="word", length_multiple=args.length_multiple)
    return options, data


def torch_optimizer(model, config):
    """torch_ref's optimizer and schedule with every setting of a Flax ``TrainConfig``."""
    from torch_ref.training import make_optimizer

    return make_optimizer(model, schedule=config.schedule, learning_rate=config.learning_rate,
                          lr_factor=config.lr_factor, warmup_steps=config.warmup_steps, decay_steps=config.decay_steps,
                          b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay)


def with_error_rates(result):
    """``evaluate``'s metrics under this benchmark's names (module docstring)."""
    return {"loss": result["loss"], "token_accuracy": result["token_accuracy"],
            "exact_match": result["exact_match"], "word_error_rate": 1.0 - result["exact_match"],
            "token_error_rate": result["wer"], "cer": result["cer"], "bleu": result["bleu"], "chrf": result["chrf"]}


def evaluate_flax(trainer, state, batches, codec, beam_size):
    from flaxformer_mini.decode.evaluation import evaluate

    return with_error_rates(evaluate(trainer, state, batches, beam_size=beam_size, codec=codec))


def evaluate_torch(model, batches, codec, beam_size):
    """``flaxformer_mini.decode.evaluation.evaluate``'s metrics for the torch twin: the
    teacher-forced loss (no label smoothing) and token accuracy summed over the batches, then
    ``torch_ref.CachedDecoder``'s greedy tokens (or best beam) to the model's max_len, scored
    by the same functions."""
    import numpy as np
    import torch

    from flaxformer_mini.data import PAD
    from flaxformer_mini.decode.evaluation import TEXT_METRICS
    from flaxformer_mini.decode.metrics import corpus_metrics, exact_match
    from torch_ref.cached_decoding import CachedDecoder
    from torch_ref.training import token_cross_entropy

    was_training = model.training
    model.eval()
    decoder, max_len = CachedDecoder(model), model.decoder.max_len
    total = count = correct = 0.0
    hits, hypotheses, references = [], [], []
    try:
        with torch.no_grad():
            for b in batches:
                source, target_in, target_out = (torch.as_tensor(np.asarray(x), dtype=torch.int64) for x in b)
                logits = model(source, target_in)
                labelled = target_out != PAD
                n = int(labelled.sum())
                total += token_cross_entropy(logits, target_out).item() * n  # the mean over n labels, summed back
                count += n
                correct += int(((logits.argmax(-1) == target_out) & labelled).sum())
                if beam_size == 1:
                    predicted = decoder.greedy(source, max_len)
                else:
                    predicted = decoder.beam_search(source, max_len, beam_size=beam_size)[0][:, 0]
                predicted = predicted.numpy()
                hits.append(exact_match(predicted, b.target_out))
                hypotheses += [codec.decode(row) for row in predicted]
                references += [codec.decode(row) for row in np.asarray(b.target_out)]
    finally:
        model.train(was_training)
    scores = corpus_metrics(hypotheses, references)
    result = {"loss": total / max(count, 1.0), "token_accuracy": correct / max(count, 1.0),
              "exact_match": float(np.concatenate(hits).mean()), **{k: scores[k] for k in TEXT_METRICS}}
    return with_error_rates(result)


@dataclasses.dataclass
class Curves:
    """One twin's record of one seed's run."""

    loss: list = dataclasses.field(default_factory=list)  # training loss of each step (before its update)
    grad_norm: list = dataclasses.field(default_factory=list)
    learning_rate: list = dataclasses.field(default_factory=list)
    step_s: list = dataclasses.field(default_factory=list)  # each step's time, until its results were on the host
    evals: list = dataclasses.field(default_factory=list)  # {"step", "train_s", **EVAL_METRICS, "eval_s"}

    def record(self, loss, grad_norm, learning_rate, seconds):
        self.loss.append(float(loss))
        self.grad_norm.append(float(grad_norm))
        self.learning_rate.append(float(learning_rate))
        self.step_s.append(seconds)


@dataclasses.dataclass
class Steps:
    """What both twins' steps of one seed's run share: the batches' target tokens, whether each
    batch's shape (B, S, T) was new (JAX compiles the step there), the shapes, the time spent
    drawing the batches, and the model's parameter count."""

    tokens: list = dataclasses.field(default_factory=list)
    first_shape: list = dataclasses.field(default_factory=list)
    shapes: list = dataclasses.field(default_factory=list)
    data_s: float = 0.0
    parameters: int = 0


def train_seed(run, seed, args, eval_batches, log):
    """Both twins from the same converted weights over ``args.steps`` steps of ``run``'s batches:
    ``(Curves by twin, Steps)``."""
    import jax
    import numpy as np
    import torch

    import parity
    from flaxformer_mini.data import PAD
    from flaxformer_mini.train.trainer import Trainer
    from torch_ref.training import train_step

    config = run.config
    torch_model, flax_model = parity.transformer_pair(config.model, seed)  # torch's init, converted
    torch_model.train()
    torch.manual_seed(seed)  # the torch twin's dropout draws; the Flax twin's: fold_in(key(seed), step)
    optimizer, scheduler = torch_optimizer(torch_model, config.train)
    trainer = Trainer(flax_model, config.train)  # config.train.seed == seed
    state = trainer.init_state()
    del flax_model  # the state holds its own copies of the arrays
    curves = {twin: Curves() for twin in TWINS}
    steps = Steps()

    def evaluate(step):
        for twin in TWINS:
            t0 = time.perf_counter()
            if twin == "flax":
                result = evaluate_flax(trainer, state, eval_batches, run.codec, args.beam_size)
            else:
                result = evaluate_torch(torch_model, eval_batches, run.codec, args.beam_size)
            c = curves[twin]
            c.evals.append({"step": step, "train_s": sum(c.step_s), **result, "eval_s": time.perf_counter() - t0})
        f, t = curves["flax"].evals[-1], curves["torch"].evals[-1]
        log(f"seed {seed} step {step}: held-out loss {f['loss']:.4f} / {t['loss']:.4f}, WER "
            f"{f['word_error_rate']:.4f} / {t['word_error_rate']:.4f}, PER {f['token_error_rate']:.4f} / "
            f"{t['token_error_rate']:.4f} (flax / torch); training {f['train_s']:.1f} s / {t['train_s']:.1f} s; "
            f"load {_loadavg()}")

    def flax_step(batch):
        nonlocal state
        t0 = time.perf_counter()
        state, metrics = trainer.step(state, batch)
        jax.block_until_ready((state, metrics))
        seconds = time.perf_counter() - t0
        m = jax.device_get(metrics)
        curves["flax"].record(m["loss"], m["grad_norm"], m["learning_rate"], seconds)

    def torch_step(batch):
        t0 = time.perf_counter()
        m = train_step(torch_model, optimizer, scheduler, batch, config.train.clip_norm, config.train.label_smoothing)
        curves["torch"].record(m["loss"], m["grad_norm"], m["learning_rate"], time.perf_counter() - t0)

    evaluate(0)
    for step in range(args.steps):
        t0 = time.perf_counter()
        (batch,) = run.train_batches(step)  # accumulate 1: one micro-batch an update
        steps.data_s += time.perf_counter() - t0
        steps.tokens.append(int(np.sum(np.asarray(batch.target_out) != PAD)))
        shape = [*batch.source.shape, batch.target_in.shape[1]]
        steps.first_shape.append(shape not in steps.shapes)
        if steps.first_shape[-1]:
            steps.shapes.append(shape)
        # Which twin goes first alternates: caches warmed by the batch's conversion, and a
        # drift in the load, favour neither.
        for go in ((flax_step, torch_step) if step % 2 == 0 else (torch_step, flax_step)):
            go(batch)
        done = step + 1
        for twin, c in curves.items():
            if not math.isfinite(c.loss[-1]):
                raise FloatingPointError(f"seed {seed}: the {twin} twin's loss is {c.loss[-1]} at step {done}")
        if done % args.eval_every == 0 or done == args.steps:
            evaluate(done)
    steps.parameters = sum(p.numel() for p in torch_model.parameters())
    return curves, steps


def time_to_target(evals, metric, target):
    """(training seconds, step) at the first evaluation with ``metric`` <= ``target``, or None."""
    for e in evals:
        if e[metric] <= target:
            return {"train_s": e["train_s"], "step": e["step"]}
    return None


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _spread(values):
    return max(values) - min(values) if len(values) > 1 else None


def _mean(values):
    return sum(values) / len(values)


def seed_summary(curves, steps, targets):
    """One seed's figures: each twin's training time, throughput and time to each target, and
    how closely the two training-loss curves track, step by step."""
    import numpy as np

    out = {}
    tokens, first = np.asarray(steps.tokens), np.asarray(steps.first_shape)
    for twin, c in curves.items():
        step_s = np.asarray(c.step_s)
        train_s = float(step_s.sum())
        steady_s = float(step_s[~first].sum())
        out[twin] = {
            "train_s": train_s,
            "first_shape_s": float(step_s[first].sum()),  # the steps at a new batch shape: JAX compiles there
            "median_step_ms": float(np.median(step_s)) * 1e3,
            "target_tokens": int(tokens.sum()),
            "target_tokens_per_s": float(tokens.sum()) / train_s,
            # Without the steps at a new batch shape: the rate once every shape is compiled.
            "target_tokens_per_s_steady": float(tokens[~first].sum()) / steady_s if steady_s else None,
            "eval_s": float(sum(e["eval_s"] for e in c.evals)),
            "final": {k: c.evals[-1][k] for k in ("step", *EVAL_METRICS)},
            "time_to_target": {name: time_to_target(c.evals, TARGETS[name], value)
                               for name, value in targets.items() if value is not None},
        }
    f, t = np.asarray(curves["flax"].loss), np.asarray(curves["torch"].loss)
    diff = f - t
    late = max(len(diff) // 10, 1)  # the last tenth of the run
    apart = np.flatnonzero(np.abs(diff) > 1e-3)
    out["loss_curves"] = {
        "max_abs_diff": float(np.max(np.abs(diff))),
        "max_abs_diff_first_10_steps": float(np.max(np.abs(diff[:10]))),
        # flax - torch: noise averages out over the steps, a systematic gap does not.
        "mean_diff": float(np.mean(diff)),
        "mean_diff_last_tenth": float(np.mean(diff[-late:])),
        "mean_loss_last_tenth": {"flax": float(np.mean(f[-late:])), "torch": float(np.mean(t[-late:]))},
        "first_step_apart_by_1e-3": int(apart[0]) + 1 if apart.size else None,
    }
    out["train_time_torch_over_flax"] = out["torch"]["train_s"] / out["flax"]["train_s"]
    return out


def verdict(seeds):
    """Across seeds: each twin's mean final held-out metrics, their spread over seeds (max -
    min), the gap flax - torch, and whether the Flax twin's final WER is within the seeds'
    spread (the larger of the two twins') of torch's."""
    out = {}
    for metric in ("word_error_rate", "token_error_rate", "exact_match", "loss"):
        by_twin = {twin: [s[twin]["final"][metric] for s in seeds.values()] for twin in TWINS}
        out[metric] = {"mean": {twin: _mean(v) for twin, v in by_twin.items()},
                       "spread_over_seeds": {twin: _spread(v) for twin, v in by_twin.items()}}
        out[metric]["gap_flax_minus_torch"] = out[metric]["mean"]["flax"] - out[metric]["mean"]["torch"]
    wer = out["word_error_rate"]
    if len(seeds) > 1:
        out["allowed_wer_gap"] = max(wer["spread_over_seeds"].values())
        out["flax_wer_within_seed_spread"] = wer["gap_flax_minus_torch"] <= out["allowed_wer_gap"]
    else:
        out["allowed_wer_gap"] = out["flax_wer_within_seed_spread"] = None  # one seed: no spread to judge by
    for key in ("target_tokens_per_s", "target_tokens_per_s_steady"):
        rates = {twin: [s[twin][key] for s in seeds.values()] for twin in TWINS}
        out[key] = {twin: None if None in v else _mean(v) for twin, v in rates.items()}
    # Issue 46, item 4: the larger of the two twins' rates is the figure to beat.
    out["figure_to_beat_target_tokens_per_s"] = max(out["target_tokens_per_s"].values())
    out["throughput_flax_over_torch"] = out["target_tokens_per_s"]["flax"] / out["target_tokens_per_s"]["torch"]
    return out


def build_report(args, config, env, per_seed, load, wall_s, argv):
    """The JSON document::

        {"benchmark": "train_parity", "date_utc", "machine": benchmarks.machine.describe(), "code",
         "torch_threads", "GLIBC_TUNABLES", "XLA_FLAGS", "jax_compilation_cache_dir",
         "load_average": {"start", "after_seed_N", "end"}, "wall_s", "argv",
         "recipe": {"model": ModelConfig, "train": TrainConfig (its seed: the first seed's),
                    "data": DataConfig, "batch_size", "max_tokens", "beam_size", "steps",
                    "eval_every", "seeds", "eval_examples", "parameters", "targets": {"wer", "per"},
                    "data_sha256": {"data.train_path", "data.valid_path"} of a text run's files, or null},
         "seeds": {"0": {"flax": {"train_s", "first_shape_s", "median_step_ms", "target_tokens",
                                  "target_tokens_per_s", "target_tokens_per_s_steady", "eval_s",
                                  "final": {"step", "loss", ..., "word_error_rate", "token_error_rate"},
                                  "time_to_target": {"wer": {"train_s", "step"} or null, "per": ...}},
                         "torch": {the same},
                         "loss_curves": {"max_abs_diff", "mean_diff", ...}, "train_time_torch_over_flax",
                         "batch_shapes": [[B, S, T], ...], "data_s",
                         "curves": {"flax": {"loss", "grad_norm", "learning_rate", "step_s",
                                             "evals": [{"step", "train_s", metrics..., "eval_s"}]},
                                    "torch": {the same}},
                         "tokens": [each step's target tokens]}, ...},
         "summary": verdict(seeds)}
    """
    recipe_ = {
        "model": dataclasses.asdict(config.model), "train": dataclasses.asdict(config.train),
        "data": config.data.to_dict(), "batch_size": config.batch_size, "max_tokens": config.max_tokens,
        "beam_size": args.beam_size, "steps": args.steps, "eval_every": args.eval_every, "seeds": args.seeds,
        "eval_examples": env.pop("eval_examples"), "parameters": env.pop("parameters"),
        "targets": {"wer": args.target_wer, "per": args.target_per},
        "data_sha256": env.pop("data_sha256", None),
    }
    seeds = {str(seed): s for seed, s in per_seed.items()}
    return {"benchmark": "train_parity", **env, "load_average": load, "wall_s": wall_s, "argv": list(argv),
            "recipe": recipe_, "seeds": seeds, "summary": verdict(seeds)}


def run_all(args, argv=(), log=None, progress=None):
    """Train and evaluate both twins for each seed; returns the report (``build_report``),
    which records ``argv``, the options it ran with. ``progress(report)``, if given, gets the
    report of the seeds finished so far after each seed."""
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    started, load = time.perf_counter(), {"start": _loadavg()}
    import jax
    import torch

    from benchmarks import machine
    from benchmarks.code_version import code_version
    from flaxformer_mini.runs.directory import data_file_checksums
    from flaxformer_mini.runs.run import Run

    # As the speed benchmark: the cores this process may use, unless told otherwise.
    torch.set_num_threads(args.torch_threads or machine.usable_cores())
    env = {"date_utc": machine.date_utc(), "machine": machine.describe(), "code": code_version(),
           "torch_threads": torch.get_num_threads(),
           "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", ""), "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
           # Unset, every run compiles afresh, as a user's first run does: the compilations are in the time.
           "jax_compilation_cache_dir": jax.config.jax_compilation_cache_dir}
    log(f"{machine.one_line(env['machine'])}\nload average {load['start']}")
    options, data_config = recipe(args)
    # The data's contents, by sha256: --merge takes the same files at another path as the same data.
    env["data_sha256"] = data_file_checksums(data_config) or None
    per_seed, first = {}, None
    with tempfile.TemporaryDirectory(prefix="train-parity-") as tmp:
        for seed in args.seeds:
            out = Path(tmp) / f"seed{seed}"
            if first is None:  # tokenizers and pairs built once, as `flaxformer-mini train` builds them
                try:
                    run = first = Run.start(out, dataclasses.replace(options, seed=seed), data_config, echo=log)
                except ValueError as e:  # --max-tokens below the longest pair: known once the data is read
                    raise Refused(str(e)) from None
            else:  # the same run but for its seed: init, batch order, dropout
                config = dataclasses.replace(first.config, train=dataclasses.replace(first.config.train, seed=seed))
                run = Run.create(out, config, first.data, echo=log)
            try:
                eval_batches = run.eval_batches(limit=run.config.data.eval_pairs)
                env["eval_examples"] = sum(len(b.source) for b in eval_batches)
                if first is run:
                    log(describe_evaluation(run, args) or f"evaluating on {env['eval_examples']} held-out sequences")
                curves, steps = train_seed(run, seed, args, eval_batches, log)
            finally:
                run.close()
            env["parameters"] = steps.parameters
            per_seed[seed] = {**seed_summary(curves, steps, {"wer": args.target_wer, "per": args.target_per}),
                              "batch_shapes": steps.shapes, "data_s": steps.data_s,
                              "curves": {twin: dataclasses.asdict(c) for twin, c in curves.items()},
                              "tokens": steps.tokens}
            load[f"after_seed_{seed}"] = _loadavg()
            if progress is not None:  # the seeds so far, as a report of their own
                finished = argparse.Namespace(**{**vars(args), "seeds": list(per_seed)})
                progress(build_report(finished, first.config, dict(env), dict(per_seed),
                                      dict(load, end=load[f"after_seed_{seed}"]), time.perf_counter() - started, argv))
    load["end"] = _loadavg()
    return build_report(args, first.config, env, per_seed, load, time.perf_counter() - started, argv)


class Refused(ValueError):
    """An option the run cannot take, found once its data is read (``--max-tokens`` below the
    longest pair): the command ends with it in one line, exit 2."""


def describe_evaluation(run, args):
    """``Run.describe_evaluation``'s line in this command's words: the held-out pairs are
    --data's valid.tsv (this command has no --valid option)."""
    said = run.describe_evaluation()
    if said and args.data is not None:
        said = said.replace("from --valid;", f"from {os.path.join(args.data, 'valid.tsv')} (--data);")
    return said


# What may differ between the reports --merge joins: the seeds and what each run measured.
RUN_KEYS = ("date_utc", "code", "argv", "wall_s", "load_average")
REPORT_KEYS = ("benchmark", "machine", "recipe", "seeds", "summary", *RUN_KEYS)


# The settings beside the recipe that change the times: reports that differ in one are not joined.
SETTING_KEYS = ("torch_threads", "XLA_FLAGS", "GLIBC_TUNABLES")
# The nested keys merge() reads, and the type each must have (None: any).
SHAPE = (("machine", dict), ("machine.cpu", dict), ("machine.cores", None), ("load_average", dict),
         ("load_average.start", None), ("load_average.end", None), ("recipe", dict), ("recipe.train", dict),
         ("recipe.data", dict), ("seeds", dict))


def _check_shape(rep, name):
    """ValueError naming the first key path of ``SHAPE`` that ``rep`` lacks or holds another type at."""
    for path, kind in SHAPE:
        value = rep
        for key in path.split("."):
            if not isinstance(value, dict) or key not in value:
                raise ValueError(f"{name}: a train_parity report without {path}")
            value = value[key]
        if kind is not None and not isinstance(value, kind):
            raise ValueError(f"{name}: {path} is a {type(value).__name__} in a train_parity report, not a "
                             f"{'JSON object' if kind is dict else kind.__name__}")
    for i, run in enumerate(rep.get("merged_from") or ()):
        if not (isinstance(run, dict) and {"name", "seeds", *RUN_KEYS} <= set(run)):
            raise ValueError(f"{name}: merged_from[{i}] lacks one of name, seeds, {', '.join(RUN_KEYS)}")


def _without_seeds(recipe_, other):
    """``recipe_`` as compared with ``other``'s: its seeds left out, and its data files' paths
    where both recipes record the files' sha256 (the same data may lie at another path)."""
    out = {**recipe_, "seeds": None, "train": {**recipe_["train"], "seed": None}}
    if recipe_.get("data_sha256") and other.get("data_sha256"):
        out["data"] = {k: v for k, v in recipe_["data"].items() if k not in ("train_path", "valid_path")}
    else:
        out.pop("data_sha256", None)
    return out


def _first_difference(a, b, where=()):
    """The first key path at which two JSON values differ, with both values there, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            found = _first_difference(a.get(key), b.get(key), (*where, key))
            if found:
                return found
        return None
    return None if a == b else (".".join(map(str, where)), a, b)


def _cpu(rep):
    cpu = rep["machine"]["cpu"]
    return f"{cpu.get('model_name')} family {cpu.get('family')} model {cpu.get('model')}, {rep['machine']['cores']} cores"


def merge(reports, names=None):
    """One report (``build_report``'s schema) of ``reports``' seeds, with its verdict across
    all of them. The reports must hold one recipe (but for its seeds) measured on one kind of
    CPU with as many cores, and no seed twice. The top-level run keys (``RUN_KEYS``) are the
    first report's, with each report's own under ``merged_from``; the load averages are
    joined."""
    names = names or [f"report {i + 1}" for i in range(len(reports))]
    first, name0 = reports[0], names[0]
    for rep, name in zip(reports, names):
        if not isinstance(rep, dict) or rep.get("benchmark") != "train_parity":
            raise ValueError(f"{name}: not a train_parity report")
        missing = [key for key in REPORT_KEYS if key not in rep]
        if missing:
            raise ValueError(f"{name}: a train_parity report without {', '.join(missing)}")
        _check_shape(rep, name)
    for rep, name in zip(reports[1:], names[1:]):
        differ = _first_difference(_without_seeds(rep["recipe"], first["recipe"]),
                                   _without_seeds(first["recipe"], rep["recipe"]))
        if differ:
            raise ValueError(f"{name}: another recipe than {name0}'s (recipe.{differ[0]}: {differ[1]!r} against "
                             f"{differ[2]!r})")
        if not (same_cpu(rep["machine"]["cpu"], first["machine"]["cpu"])
                and rep["machine"]["cores"] == first["machine"]["cores"]):
            raise ValueError(f"{name}: measured on another CPU than {name0} ({_cpu(rep)} against {_cpu(first)}): "
                             f"their times cannot be compared")
        for key in SETTING_KEYS:
            if rep.get(key) != first.get(key):
                raise ValueError(f"{name}: measured with another {key} than {name0} ({rep.get(key)!r} against "
                                 f"{first.get(key)!r}): their times cannot be compared")
    seeds = {}
    for rep, name in zip(reports, names):
        for seed, s in rep["seeds"].items():
            if seed in seeds:
                raise ValueError(f"{name}: seed {seed} is in an earlier report too")
            seeds[seed] = s
    load = {"start": first["load_average"]["start"]}
    for rep in reports:
        load.update({k: v for k, v in rep["load_average"].items() if k.startswith("after_seed_")})
    load["end"] = reports[-1]["load_average"]["end"]
    recipe_ = {**first["recipe"], "seeds": [int(seed) for seed in seeds]}
    # A report that is itself a merge brings its own runs, each with its date, commit and argv.
    merged_from = [run for rep, name in zip(reports, names)
                   for run in (rep.get("merged_from") or [{"name": name, "seeds": [int(seed) for seed in rep["seeds"]],
                                                           **{k: rep[k] for k in RUN_KEYS}}])]
    return {**first, "load_average": load, "recipe": recipe_, "seeds": seeds, "summary": verdict(seeds),
            "merged_from": merged_from}


def _read_report(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot be read as JSON ({e})") from None


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def _when_and_what(rep):
    """'DATE, commit C, load average A -> B' for each run a report holds (one unless merged)."""
    from benchmarks.code_version import describe

    runs = rep.get("merged_from") or [{**rep, "seeds": rep["recipe"]["seeds"]}]
    said = [f"{run['date_utc']}, {describe(run['code'])}, load average {run['load_average']['start']} -> "
            f"{run['load_average']['end']}" for run in runs]
    if len(runs) > 1:
        said = [f"seeds {' '.join(map(str, run['seeds']))}: {line}" for run, line in zip(runs, said)]
    return said


def format_table(rep):
    """The printed summary: per seed and twin, the final held-out metrics, training time,
    time to each target and throughput; then the verdict."""
    from benchmarks import machine

    lines = [machine.one_line(rep["machine"]), *_when_and_what(rep)]
    r = rep["recipe"]
    lines.append(f"{r['parameters']:,} parameters, {r['steps']} steps, eval every {r['eval_every']} on "
                 f"{r['eval_examples']} held-out examples, seeds {' '.join(map(str, r['seeds']))}")
    targets = {k: v for k, v in r["targets"].items() if v is not None}
    head = ["seed", "twin", "WER", "PER", "exact", "eval loss", "train s", "1st-shape s"]
    head += [f"s to {k.upper()}<={v}" for k, v in targets.items()] + ["tok/s", "tok/s steady"]
    rows = []
    for seed, s in rep["seeds"].items():
        for twin in TWINS:
            t = s[twin]
            f = t["final"]
            row = [seed, twin, _fmt(f["word_error_rate"], ".4f"), _fmt(f["token_error_rate"], ".4f"),
                   _fmt(f["exact_match"], ".4f"), _fmt(f["loss"], ".4f"), _fmt(t["train_s"], ".1f"),
                   _fmt(t["first_shape_s"], ".1f")]
            for k in targets:
                hit = t["time_to_target"].get(k)
                row.append("not reached" if hit is None else f"{hit['train_s']:.1f} (step {hit['step']})")
            row += [_fmt(t["target_tokens_per_s"], ",.0f"), _fmt(t["target_tokens_per_s_steady"], ",.0f")]
            rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for row in [head, *rows]:
        lines.append("  ".join(str(x).rjust(w) for x, w in zip(row, widths)))
    for seed, s in rep["seeds"].items():
        c = s["loss_curves"]
        lines.append(f"seed {seed}: training loss flax - torch: max |diff| {c['max_abs_diff']:.2e} (first 10 steps "
                     f"{c['max_abs_diff_first_10_steps']:.2e}), mean {c['mean_diff']:+.2e}, last tenth "
                     f"{c['mean_diff_last_tenth']:+.2e}; " + ("never apart by 1e-3" if c['first_step_apart_by_1e-3'] is None
                                                              else f"apart by 1e-3 from step {c['first_step_apart_by_1e-3']}"))
    v = rep["summary"]
    w = v["word_error_rate"]
    lines.append(f"final WER mean flax {w['mean']['flax']:.4f}, torch {w['mean']['torch']:.4f} (gap "
                 f"{w['gap_flax_minus_torch']:+.4f}; spread over seeds flax {_fmt(w['spread_over_seeds']['flax'], '.4f')}, "
                 f"torch {_fmt(w['spread_over_seeds']['torch'], '.4f')}): Flax within the seeds' spread: "
                 + {True: "yes", False: "no", None: "not judged (one seed has no spread)"}[v['flax_wer_within_seed_spread']])
    rates = v["target_tokens_per_s"]
    lines.append(f"target tokens/s: flax {rates['flax']:,.0f}, torch {rates['torch']:,.0f} (flax/torch "
                 f"{v['throughput_flax_over_torch']:.2f}x); the figure to beat: {v['figure_to_beat_target_tokens_per_s']:,.0f}")
    return "\n".join(lines)


def plot(rep, path):
    """Four panels: training loss per step (a running mean, both twins, every seed); flax - torch
    training loss (at dropout 0 its size step by step, on a log scale: where rounding starts to
    tell; with dropout its running mean, where a systematic gap would stand off zero); held-out
    WER per evaluation step; held-out WER against training time (time to target)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from benchmarks import machine

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    palette = {"flax": ["tab:blue", "navy", "tab:cyan", "slateblue"],
               "torch": ["tab:orange", "saddlebrown", "gold", "tab:red"]}
    linestyle = {"flax": "-", "torch": "--"}
    markers = ["o", "s", "^", "v", "D", "x"]
    r = rep["recipe"]
    window = max(r["steps"] // 50, 1)
    dropout = r["model"]["dropout"]

    def running_mean(x):
        return np.arange(window, len(x) + 1), np.convolve(x, np.ones(window) / window, mode="valid")

    for i, (seed, s) in enumerate(rep["seeds"].items()):
        for twin in TWINS:
            style = dict(color=palette[twin][i % 4], linestyle=linestyle[twin], label=f"{twin}, seed {seed}")
            c = s["curves"][twin]
            axes[0, 0].plot(*running_mean(np.asarray(c["loss"])), **style)
            wer = [e["word_error_rate"] for e in c["evals"]]
            axes[1, 0].plot([e["step"] for e in c["evals"]], wer, marker=markers[i % 6], **style)
            axes[1, 1].plot([e["train_s"] for e in c["evals"]], wer, marker=markers[i % 6], **style)
        diff = np.asarray(s["curves"]["flax"]["loss"]) - np.asarray(s["curves"]["torch"]["loss"])
        if dropout:
            axes[0, 1].plot(*running_mean(diff), label=f"seed {seed}", color=["tab:green", "tab:purple"][i % 2])
        else:
            axes[0, 1].plot(np.arange(1, len(diff) + 1), np.maximum(np.abs(diff), 1e-9), label=f"seed {seed}",
                            linewidth=0.8, color=["tab:green", "tab:purple"][i % 2])
    axes[0, 0].set(title=f"training loss (running mean of {window} steps)", xlabel="step", ylabel="loss")
    if dropout:
        axes[0, 1].axhline(0.0, color="grey", linewidth=0.8)
        axes[0, 1].set(title=f"flax - torch training loss (running mean of {window} steps)", xlabel="step",
                       ylabel="difference")
    else:
        axes[0, 1].set(title="|flax - torch| training loss, step by step (0 drawn at 1e-9)", xlabel="step",
                       ylabel="|difference|", yscale="log")
    axes[1, 0].set(title="held-out WER (1 - exact match)", xlabel="step", ylabel="WER")
    axes[1, 1].set(title="held-out WER against training time (evaluation excluded)", xlabel="training s",
                   ylabel="WER")
    if r["targets"].get("wer") is not None:
        for ax in axes[1]:
            ax.axhline(r["targets"]["wer"], color="grey", linewidth=0.8, linestyle=":")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Training parity, torch_ref against flaxformer_mini: {r['parameters']:,} parameters, "
                 f"dropout {dropout}, {r['steps']} steps\n{machine.one_line(rep['machine'])}\n"
                 + "\n".join(_when_and_what(rep)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    command = argv is None
    from benchmarks.stopping import exit_interrupted, stop_on_signals
    if command:
        stop_on_signals()  # before parse_args: its checks import JAX and flax (seconds)
    try:
        args = parse_args(argv)
        if command and not args.merge:  # a command: one timing run per host (the suite's workers call main() side by side)
            one_at_a_time.hold_the_machine_or_exit("python -m benchmarks.train_parity")
    except KeyboardInterrupt:
        return exit_interrupted(f"interrupted: {NO_SEED_FINISHED}", command)
    if args.merge:
        try:
            rep = merge([_read_report(path) for path in args.merge], args.merge)
        except ValueError as e:
            print(f"python -m benchmarks.train_parity: error: --merge: {e}", file=sys.stderr)
            return 2
    else:
        finished = []
        try:
            rep = run_all(args, sys.argv[1:] if command else argv, progress=finished.append)
        except Refused as e:
            print(f"python -m benchmarks.train_parity: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # the run's temporary directory is removed on the way out
            return exit_interrupted(f"interrupted: {keep_finished(finished, args.out)}", command)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from benchmarks.__main__ import write_json

    write_json(rep, out / JSON_NAME)
    plot(rep, out / PLOT_NAME)
    print(format_table(rep))
    print(f"wrote {out / JSON_NAME} and {out / PLOT_NAME}", file=sys.stderr)
    return 0


NO_SEED_FINISHED = "no seed had finished: nothing written"


def keep_finished(finished, out):
    """Write the last of ``finished`` (the report of the seeds finished so far) to ``out``'s JSON
    (no plot: the run was asked to stop); what was kept, in words."""
    if not finished:
        return NO_SEED_FINISHED
    from benchmarks.__main__ import write_json

    rep = finished[-1]
    path = Path(out) / JSON_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(rep, path)
    return f"{path} holds seed(s) {' '.join(rep['seeds'])}, finished before it (no plot drawn)"


if __name__ == "__main__":
    sys.exit(main())
