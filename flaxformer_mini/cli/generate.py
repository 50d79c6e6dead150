"""``flaxformer-mini generate``: decode the inputs (arguments, or standard input line by line)
and print one output line per input line (``--nbest N``: N), with notes and warnings on
standard error."""

import math
import sys

import numpy as np

from flaxformer_mini.cli.arriving_lines import ArrivingLines
from flaxformer_mini.cli.parser import length_penalty
from flaxformer_mini.data import iter_lines
from flaxformer_mini.decode.options import OptionError
from flaxformer_mini.runs.generate import generate


def run(args):
    """Decode the inputs and print one output line (``--nbest N``: N) per input line."""
    # Each argument is one input; `generate --checkpoint r 5 3 9` (words split by the shell)
    # is one input too, so join bare words into a single line. Standard input is read lazily,
    # as bytes through the training files' reader (BOM skipped, \r\n and \r end lines), and
    # every line, blank or not, gets its output line: output line i is input line i's. Lines
    # are decoded as they arrive: a pause in the input decodes those read so far.
    ready = None
    if args.text:
        texts, where = [" ".join(args.text)], lambda i: "the input"
    elif sys.stdin is None:  # a closed standard input (`<&-`): no lines, refused as an empty input is
        texts, where = [], lambda i: f"line {i}"
    else:
        try:
            stdin = ArrivingLines(sys.stdin.fileno())
            ready = stdin.ready
        except (OSError, ValueError):  # a stream with no descriptor (a program embedding the CLI): read as a file
            stdin = sys.stdin.buffer
        texts, where = (line for _, line in iter_lines(stdin, "standard input")), lambda i: f"line {i}"
    # --scores alone is the best hypothesis with its score: an n-best list of one.
    nbest = args.nbest or (1 if args.scores else None)
    try:
        outputs = generate(args.checkpoint, texts, max_new_tokens=args.max_new_tokens, beam_size=args.beam_size,
                           temperature=args.temperature, top_k=args.top_k, seed=args.seed, batch_size=args.batch_size,
                           alpha=length_penalty(args), nbest=nbest, ready=ready)
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
    if cut:
        what = "output(s)" if nbest is None else "inputs' best hypotheses"
        limit = (f"--max-new-tokens {args.max_new_tokens}" if args.max_new_tokens is not None
                 else "the model's max_len (the default --max-new-tokens)")
        print(f"warning: {cut} of {i} {what} reached {limit} before their EOS and are cut there", file=sys.stderr)


def _lines(nbest):
    return "line is" if nbest in (None, 1) else f"{nbest} lines are"


def _score(score):
    """A float32 score as its shortest exact text (float(text) gives back the library's value)."""
    return str(np.float32(score)) if math.isfinite(score) else "-inf"
