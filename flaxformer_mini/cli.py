"""``flaxformer-mini``: train, evaluate, generate.

    flaxformer-mini train --task reverse --out runs/reverse
    flaxformer-mini train --data train.tsv --valid valid.tsv --out runs/mt
    flaxformer-mini evaluate --checkpoint runs/reverse --json
    flaxformer-mini generate --checkpoint runs/reverse 5 3 9 2 7

Running the same ``train`` command again with the same ``--out`` resumes the run.
Exit codes: 0 done, 1 the run failed (a NaN loss), 2 unusable options or files, 130
interrupted (the run was saved and can be resumed).
"""

import argparse
import json
import math
import sys

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE, EXIT_INTERRUPTED = 0, 1, 2, 130

# Defaults of the main job (README): `reverse` to >= 0.99 exact match on this 2-core CPU.
DEFAULTS = dict(preset="small", steps=3000, batch_size=64, warmup=200, lr=3e-3, seed=0)


def _train(args):
    if args.keep_freed_memory:
        from flaxformer_mini.malloc_tunables import restart_keeping_freed_memory

        restart_keeping_freed_memory()  # re-executes with GLIBC_TUNABLES set: see malloc_tunables.py
    from flaxformer_mini.data import TASKS
    from flaxformer_mini.fit import NonFiniteLossError, fit
    from flaxformer_mini.run import DataConfig, RunConfig, RunDir, load_data, model_config_for
    from flaxformer_mini.training import TrainConfig

    if args.task:
        data = DataConfig(kind="synthetic", task=args.task, vocab_size=args.vocab_size, min_len=args.min_len,
                          max_len=args.max_len or 10, eval_sequences=args.eval_sequences)
    else:
        data = DataConfig(kind="tsv", max_len=args.max_len or 64, train_path=args.data, valid_path=args.valid)
    run = RunDir(args.out)
    loaded = load_data(data, run)
    if data.kind == "synthetic":
        src_vocab = tgt_vocab = data.vocab_size
        max_len = loaded[0].model_max_len
    else:
        src_vocab, tgt_vocab = (len(v) for v in loaded[2])
        max_len = data.max_len
    model = model_config_for(args.preset, src_vocab, tgt_vocab, max_len, dropout=args.dropout)
    # --lr is the peak of the warm-up + inverse-square-root schedule, reached at --warmup:
    # the paper's lr = factor * D^-0.5 * min(n^-0.5, n * w^-1.5) peaks at factor * (D * w)^-0.5.
    if args.schedule == "rsqrt":
        train = TrainConfig(schedule="rsqrt", lr_factor=args.lr * math.sqrt(model.embed_size * args.warmup),
                            warmup_steps=args.warmup, weight_decay=args.weight_decay, clip_norm=args.clip_norm,
                            label_smoothing=args.label_smoothing, seed=args.seed)
    else:
        train = TrainConfig(schedule="constant", learning_rate=args.lr, weight_decay=args.weight_decay,
                            clip_norm=args.clip_norm, label_smoothing=args.label_smoothing, seed=args.seed)
    config = RunConfig(model=model, train=train, data=data, batch_size=args.batch_size, dtype=args.dtype)
    try:
        result = fit(config, args.out, args.steps, log_every=args.log_every, eval_every=args.eval_every,
                     save_every=args.save_every, max_to_keep=args.keep, progress=not args.no_progress,
                     data=loaded, devices=args.devices, sharding=args.sharding,
                     echo=lambda m: print(m, file=sys.stderr))
    except NonFiniteLossError as e:
        print(f"flaxformer-mini train: {e}", file=sys.stderr)
        return EXIT_FAILED
    if result:
        print(json.dumps({"step": args.steps, **result}))
    return EXIT_OK


def _evaluate(args):
    from flaxformer_mini.fit import evaluate_run

    if args.beam_size < 1:
        raise ValueError(f"--beam-size must be >= 1, got {args.beam_size}")
    result = evaluate_run(args.checkpoint, batch_size=args.batch_size, beam_size=args.beam_size)
    if args.json:
        print(json.dumps({k: result[k] for k in ("loss", "token_accuracy", "exact_match")}))
    else:
        print(f"{args.checkpoint} at step {result['step']}: loss {result['loss']:.4f}, "
              f"token accuracy {result['token_accuracy']:.4f}, exact match {result['exact_match']:.4f}")
    return EXIT_OK


def _generate(args):
    from flaxformer_mini.generation import generate

    # Each argument is one input; `generate --checkpoint r 5 3 9` (words split by the shell)
    # is one input too, so join bare words into a single line.
    texts = [" ".join(args.text)] if args.text else [line.strip() for line in sys.stdin if line.strip()]
    outputs = generate(args.checkpoint, texts, max_new_tokens=args.max_new_tokens, beam_size=args.beam_size,
                       temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    for i, out in enumerate(outputs, 1):
        if out.unknown_words:
            print(f"note: input {i}: {len(out.unknown_words)} unknown word(s) mapped to <unk>: "
                  f"{', '.join(out.unknown_words)}", file=sys.stderr)
        print(out.text)
    return EXIT_OK


def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def build_parser():
    parser = argparse.ArgumentParser(prog="flaxformer-mini", description="Train and evaluate the Flax seq2seq Transformer.")
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model (resumes when --out holds the same run)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    source = t.add_mutually_exclusive_group(required=True)
    source.add_argument("--task", choices=("copy", "reverse", "sort"), help="a synthetic task over integer tokens")
    source.add_argument("--data", metavar="TRAIN.tsv", help="parallel text, one 'source<TAB>target' per line")
    t.add_argument("--valid", metavar="VALID.tsv", help="held-out pairs for --data (default: the training pairs)")
    t.add_argument("--out", required=True, help="run directory: config, metrics.jsonl, checkpoints, loss.png")
    t.add_argument("--preset", default=DEFAULTS["preset"], help="model width/heads/depth preset (small, tiny, seed, base)")
    t.add_argument("--steps", type=_positive(int), default=DEFAULTS["steps"], help="total optimizer steps")
    t.add_argument("--batch-size", type=_positive(int), default=DEFAULTS["batch_size"])
    t.add_argument("--lr", type=_positive(float), default=DEFAULTS["lr"], help="peak learning rate")
    t.add_argument("--schedule", choices=("rsqrt", "constant"), default="rsqrt",
                   help="rsqrt: linear warm-up then 1/sqrt(step) decay ('Attention Is All You Need')")
    t.add_argument("--warmup", type=_positive(int), default=DEFAULTS["warmup"], help="warm-up steps")
    t.add_argument("--weight-decay", type=float, default=0.0, help="> 0 uses AdamW")
    t.add_argument("--clip-norm", type=float, default=1.0, help="global gradient-norm clipping")
    t.add_argument("--label-smoothing", type=float, default=0.0)
    t.add_argument("--dropout", type=float, default=None, help="override the preset's dropout")
    t.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="compute dtype (parameters stay float32)")
    t.add_argument("--devices", type=_positive(int), default=1,
                   help="shard each batch over this many devices (data parallelism)")
    t.add_argument("--sharding", choices=("replicated", "fsdp"), default="replicated",
                   help="with --devices > 1: replicate parameters, or shard them FSDP-style")
    t.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="seeds initialisation, data and dropout")
    t.add_argument("--vocab-size", type=int, default=16, help="synthetic: token ids, 4 special ones included")
    t.add_argument("--min-len", type=_positive(int), default=1, help="synthetic: shortest sequence")
    t.add_argument("--max-len", type=_positive(int), default=None,
                   help="synthetic: longest sequence (default 10); text: the model's max_len (default 64)")
    t.add_argument("--eval-sequences", type=_positive(int), default=512, help="synthetic: held-out sequences")
    t.add_argument("--log-every", type=_positive(int), default=50)
    t.add_argument("--eval-every", type=_positive(int), default=500)
    t.add_argument("--save-every", type=_positive(int), default=500)
    t.add_argument("--keep", type=_positive(int), default=3, help="checkpoints kept")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--keep-freed-memory", action="store_true",
                   help="CPU, large models: keep freed host memory in the process (one glibc arena, no mmap), so "
                        "each step stops page-faulting its temporaries in; slower for small models "
                        "(flaxformer_mini/malloc_tunables.py)")
    t.set_defaults(run=_train)

    e = sub.add_parser("evaluate", help="loss, token accuracy and exact match of a run's latest checkpoint")
    e.add_argument("--checkpoint", required=True, metavar="DIR", help="a run directory made by train")
    e.add_argument("--json", action="store_true", help="print one JSON object: loss, token_accuracy, exact_match")
    e.add_argument("--batch-size", type=_positive(int), default=None)
    e.add_argument("--beam-size", type=int, default=1, help="exact match of the best beam (1: greedy)")
    e.set_defaults(run=_evaluate)

    g = sub.add_parser("generate", help="decode inputs with a run's latest checkpoint",
                       description="Decode TEXT (the words given), or one input per line of standard input. "
                                   "Greedy by default; --beam-size K for beam search; --temperature/--top-k to sample.")
    g.add_argument("--checkpoint", required=True, metavar="DIR", help="a run directory made by train")
    g.add_argument("--beam-size", type=int, default=1, metavar="K")
    g.add_argument("--max-new-tokens", type=int, default=None, metavar="N", help="default: the model's max_len")
    g.add_argument("--temperature", type=float, default=None, metavar="T")
    g.add_argument("--top-k", type=int, default=None, metavar="K")
    g.add_argument("--seed", type=int, default=0, help="seed for sampling")
    g.add_argument("text", nargs="*", help="the input; if absent, one input per line of standard input")
    g.set_defaults(run=_generate)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "valid", None) and not getattr(args, "data", None):
        parser.error("--valid goes with --data")
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("\nstopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, FileNotFoundError) as e:  # bad files, configs or options: say which
        print(f"flaxformer-mini {args.command}: error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE


if __name__ == "__main__":
    sys.exit(main())
