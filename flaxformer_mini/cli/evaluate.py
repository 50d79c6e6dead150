"""``flaxformer-mini evaluate``: score a run's latest checkpoint on its held-out data or on
``--data``, and print the metrics (one line, or ``--json``)."""

import json

from flaxformer_mini.cli.parser import length_penalty
from flaxformer_mini.decode.options import OptionError
from flaxformer_mini.files import check_writable, refuse_existing, same_file
from flaxformer_mini.runs.directory import RunDir, best_of
from flaxformer_mini.runs.evaluate import evaluate_run


def run(args):
    """Score the run (or ``--data``) and print the result; errors propagate to cli.main."""
    if args.output is not None:  # before decoding the whole held-out set
        check_writable(args.output, "--output")
        if args.data is not None and same_file(args.output, args.data):
            raise ValueError(f"--output {args.output}: is the --data file being scored; write the hypotheses elsewhere")
        _refuse_the_runs_file(args.output, args.checkpoint)
        if not args.force:
            refuse_existing(args.output, "--output")

    try:
        result = evaluate_run(args.checkpoint, batch_size=args.batch_size, beam_size=args.beam_size, output=args.output,
                              data=args.data, force=args.force, columns=args.columns, alpha=length_penalty(args))
    except OptionError as e:  # named as the user typed it (--max-new-tokens), not as the library's argument
        raise ValueError(e.cli) from None
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "step"}))
    else:
        print(f"{args.checkpoint} at step {result['step']}: loss {result['loss']:.4f}, "
              f"token accuracy {result['token_accuracy']:.4f}, exact match {result['exact_match']:.4f}, "
              f"BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f}, WER {result['wer']:.4f}, CER {result['cer']:.4f}")


def _refuse_the_runs_file(output, checkpoint):
    """--output must not be one of the run's files (``RunDir.own_file``): even with --force, it
    would replace the pairs the run trains and scores on (and a resume refuses a changed
    file), or a file no run can do without."""
    what = RunDir(best_of(checkpoint) or checkpoint).own_file(output)  # RUN/best: RUN's
    if what is not None:
        raise ValueError(f"--output {output}: is the run's {what}, which --force would overwrite too; "
                         f"write the hypotheses elsewhere")
