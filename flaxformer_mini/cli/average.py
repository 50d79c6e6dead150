"""``flaxformer-mini average``: the parameters of a run's last N checkpoints averaged into a new
run directory (``runs/average.py``), which evaluate, generate and parity convert read."""

from flaxformer_mini.runs.average import average_run


def run(args):
    steps = average_run(args.checkpoint, args.last, args.out)
    print(f"{args.out}: the mean parameters of {args.checkpoint}'s checkpoints at steps "
          f"{', '.join(map(str, steps))} (read as a run at step {steps[-1]})")
