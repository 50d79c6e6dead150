"""``parity`` command line: ``parity check --preset seed``.

Exit codes: 0 every intermediate within tolerance, 1 some difference beyond it, 2 the
options or inputs are unusable (the message says which).
"""

import argparse
import sys
from pathlib import Path

EXIT_OK, EXIT_DIVERGED, EXIT_UNUSABLE = 0, 1, 2


def _check(args):
    # Imported here so that `parity --help` answers without loading torch and JAX.
    from flaxformer_mini.config import get_preset
    from parity.compare import compare_models
    from parity.twins import as_inputs, parity_numerics, sample_batch, transformer_pair

    parity_numerics()
    config = get_preset(args.preset)
    torch_model, flax_model = transformer_pair(config, seed=args.seed)
    torch_inputs, flax_inputs = as_inputs(*sample_batch(config, batch=args.batch, seed=args.seed))
    report = compare_models(torch_model, flax_model, torch_inputs, flax_inputs, atol=args.atol)

    c = config
    print(f"preset {args.preset}: vocab {c.source_vocab_size}/{c.target_vocab_size}, max_len {c.max_len}, "
          f"embed {c.embed_size}, {c.heads} heads, {c.num_layers}+{c.num_layers} layers; "
          f"batch {args.batch} with padding, float32, highest matmul precision, seed {args.seed}")
    print(report.format_table(show_all=args.all))
    if args.json:
        Path(args.json).write_text(report.to_json(indent=2) + "\n")
        print(f"report written to {args.json}")
    return EXIT_OK if report.ok else EXIT_DIVERGED


def build_parser():
    parser = argparse.ArgumentParser(prog="parity", description="Prove the torch and Flax twins compute the same numbers.")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="run both twins with the same weights and compare every intermediate")
    check.add_argument("--preset", default="seed", help="model preset (default: seed, the seed tutorial's config)")
    check.add_argument("--atol", type=float, default=1e-5, help="max absolute difference allowed (default 1e-5)")
    check.add_argument("--batch", type=int, default=4, help="batch size of the seeded inputs (default 4)")
    check.add_argument("--seed", type=int, default=0, help="seed for the weights and the inputs (default 0)")
    check.add_argument("--all", action="store_true", help="show every submodule's output, not only the landmarks")
    check.add_argument("--json", metavar="OUT", help="also write the whole report as JSON")
    check.set_defaults(run=_check)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "batch", 1) < 1:
        parser.error(f"--batch must be >= 1, got {args.batch}")
    if getattr(args, "atol", 0.0) < 0:
        parser.error(f"--atol must be >= 0, got {args.atol}")
    try:
        return args.run(args)
    except ValueError as e:  # unknown preset, unreadable checkpoint, conversion error, ...
        print(f"parity {args.command}: error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE


if __name__ == "__main__":
    sys.exit(main())
