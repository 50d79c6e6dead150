"""``flaxformer-mini evaluate`` and ``generate``: their handlers and decoding options.

cli.py parses and dispatches; these turn the parsed options into ``evaluate_run`` and
``generation.generate`` calls and print their results (one line per input line, n-best
lists, scores). Nothing here imports JAX at module level: ``--help`` stays fast.
"""

import json
import math
import sys


def evaluate_command(args):
    """Score the run (or ``--data``) and print the result; errors propagate to cli.main."""
    from flaxformer_mini.evaluation import evaluate_run
    from flaxformer_mini.files import check_writable, refuse_existing, same_file

    if args.output is not None:  # before decoding the whole held-out set
        check_writable(args.output, "--output")
        if args.data is not None and same_file(args.output, args.data):
            raise ValueError(f"--output {args.output}: is the --data file being scored; write the hypotheses elsewhere")
        _refuse_the_runs_data(args.output, args.checkpoint)
        if not args.force:
            refuse_existing(args.output, "--output")

    from flaxformer_mini.decoding import OptionError

    try:
        result = evaluate_run(args.checkpoint, batch_size=args.batch_size, beam_size=args.beam_size, output=args.output,
                              data=args.data, force=args.force, columns=args.columns, alpha=_alpha(args))
    except OptionError as e:  # named as the user typed it (--max-new-tokens), not as the library's argument
        raise ValueError(e.cli) from None
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "step"}))
    else:
        print(f"{args.checkpoint} at step {result['step']}: loss {result['loss']:.4f}, "
              f"token accuracy {result['token_accuracy']:.4f}, exact match {result['exact_match']:.4f}, "
              f"BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f}, WER {result['wer']:.4f}, CER {result['cer']:.4f}")


def _refuse_the_runs_data(output, checkpoint):
    """--output must not be the run's own training or --valid file: even with --force, it
    would replace the pairs the run trains and scores on (and a resume refuses a changed file)."""
    from flaxformer_mini.files import same_file
    from flaxformer_mini.run_config import RunConfigError
    from flaxformer_mini.run_dir import RunDir

    try:
        data = RunDir(checkpoint).load_config().data
    except RunConfigError:
        return  # no run there: evaluate_run names the problem
    for key, what in (("train_path", "training file"), ("valid_path", "--valid file")):
        path = getattr(data, key, None)
        if path is not None and same_file(output, path):
            raise ValueError(f"--output {output}: is the run's {what} (data.{key} in {checkpoint}/config.json), "
                             f"which --force would overwrite too; write the hypotheses elsewhere")


def generate_command(args):
    """Decode the inputs and print one output line (``--nbest N``: N) per input line."""
    from flaxformer_mini.data import iter_lines
    from flaxformer_mini.generation import generate

    # Each argument is one input; `generate --checkpoint r 5 3 9` (words split by the shell)
    # is one input too, so join bare words into a single line. Standard input is read lazily,
    # as bytes through the training files' reader (BOM skipped, \r\n and \r end lines), and
    # every line, blank or not, gets its output line: output line i is input line i's.
    if args.text:
        texts, where = [" ".join(args.text)], lambda i: "the input"
    else:
        texts, where = (line for _, line in iter_lines(sys.stdin.buffer, "standard input")), lambda i: f"line {i}"
    from flaxformer_mini.decoding import OptionError

    # --scores alone is the best hypothesis with its score: an n-best list of one.
    nbest = args.nbest or (1 if args.scores else None)
    try:
        outputs = generate(args.checkpoint, texts, max_new_tokens=args.max_new_tokens, beam_size=args.beam_size,
                           temperature=args.temperature, top_k=args.top_k, seed=args.seed, batch_size=args.batch_size,
                           alpha=_alpha(args), nbest=nbest)
        left_empty = cut = 0
        for i, out in enumerate(outputs, 1):
            if out.unknown_words:
                print(f"note: {where(i)}: {len(out.unknown_words)} unknown {out.unit}(s) mapped to <unk>: "
                      f"{', '.join(out.unknown_words)}", file=sys.stderr)
            if out.left_empty:
                left_empty += 1
                print(f"warning: {where(i)} {out.left_empty}; its output {_lines(nbest)} left empty", file=sys.stderr)
            cut += not out.finished
            if nbest is None:
                print(out.text, flush=True)
            else:  # nbest lines per input, best first; an input not decoded gives nbest empty lines
                hypotheses = out.hypotheses or [None] * nbest
                print("\n".join("" if h is None else f"{_score(h[1])}\t{h[0]}" if args.scores else h[0]
                                for h in hypotheses), flush=True)
    except OptionError as e:  # named as the user typed it (--max-new-tokens), not as the library's argument
        raise ValueError(e.cli) from None
    if left_empty:  # exit 0 all the same: every input line has its output line, in order
        print(f"warning: {left_empty} of {i} input line(s) left empty; the warnings above name each and why",
              file=sys.stderr)
    if cut and args.max_new_tokens is not None:
        what = "output(s)" if nbest is None else "inputs' best hypotheses"
        print(f"warning: {cut} of {i} {what} reached --max-new-tokens {args.max_new_tokens} before their EOS "
              f"and are cut there", file=sys.stderr)


LENGTH_PENALTY = 0.6  # decoding.DEFAULT_LENGTH_PENALTY, for --help without importing JAX (a test checks)


def _alpha(args):
    return LENGTH_PENALTY if args.length_penalty is None else args.length_penalty


def _lines(nbest):
    return "line is" if nbest in (None, 1) else f"{nbest} lines are"


def _score(score):
    """A float32 score as its shortest exact text (float(text) gives back the library's value)."""
    import numpy as np

    return str(np.float32(score)) if math.isfinite(score) else "-inf"


def length_penalty_option(parser):
    parser.add_argument("--length-penalty", "--alpha", type=float, default=None, metavar="ALPHA",
                        help=f"beam search ranks a hypothesis by its log-probability divided by GNMT's length penalty "
                             f"((5 + length) / 6) ** ALPHA, length counting its tokens with its EOS (Wu et al. 2016; "
                             f"the Flax WMT example's; not fairseq's --lenpen, which divides by length ** lenpen); "
                             f"0 ranks by log-probability alone, larger values favour longer outputs "
                             f"(default {LENGTH_PENALTY})")


def option_problem(args):
    """Decoding options that only fail together, or do nothing together, named as typed."""
    if getattr(args, "command", None) not in ("generate", "evaluate"):
        return None
    ranked = args.beam_size > 1 or getattr(args, "nbest", None) or getattr(args, "scores", False)
    if args.length_penalty is not None and not ranked:
        return ("--length-penalty goes with --beam-size K > 1" + (" or --scores" if args.command == "generate" else "")
                + ": greedy decoding ranks no hypotheses")
    if args.command == "generate" and (args.nbest or args.scores) and (args.temperature is not None
                                                                      or args.top_k is not None):
        return "--nbest and --scores go with greedy decoding or --beam-size, not with sampling (--temperature, --top-k)"
    return None
