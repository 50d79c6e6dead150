"""``flaxformer-mini average``: the parameters of a run's last N checkpoints averaged into a new
run directory (``runs/average.py``), which evaluate, generate and parity convert read."""

from flaxformer_mini.files import StoppedAfterWriting
from flaxformer_mini.runs.average import average_run


def run(args):
    placed = []  # placing's record: a signal answered after the rename still says OUT was written
    try:
        steps = average_run(args.checkpoint, args.last, args.out, placed=placed)
        print(f"{args.out}: the mean parameters of {args.checkpoint}'s checkpoints at steps "
              f"{', '.join(map(str, steps))} (read as a run at step {steps[-1]})")
    except KeyboardInterrupt:
        if placed:
            raise StoppedAfterWriting(args.out) from None
        raise
