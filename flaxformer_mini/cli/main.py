"""``flaxformer-mini``: train, evaluate, generate, average.

    flaxformer-mini train --task reverse --out runs/reverse
    flaxformer-mini train --data train.tsv --valid valid.tsv --out runs/mt
    flaxformer-mini evaluate --checkpoint runs/reverse --json
    flaxformer-mini evaluate --checkpoint runs/mt --data test.tsv --output hypotheses.txt
    flaxformer-mini generate --checkpoint runs/reverse 5 3 9 2 7
    flaxformer-mini evaluate --checkpoint runs/mt/best     # train --best-metric's best checkpoint
    flaxformer-mini average --checkpoint runs/mt --last 3 --out runs/mt-avg3

Running the same ``train`` command again with the same ``--out`` resumes the run. ``main``
parses (``parser.py``), dispatches to the command's module (``train.py``, ``evaluate.py``,
``generate.py``, ``average.py``) and turns what it raises into an exit code and one line (``errors.py``;
``--debug`` or FLAXFORMER_MINI_DEBUG=1 shows the traceback).
"""

import importlib
import os
import sys

from flaxformer_mini.cli import errors
from flaxformer_mini.cli.parser import DEBUG_ENV, build_parser, problem
from flaxformer_mini.collector import collecting_rarely
from flaxformer_mini.files import StoppedAfterWriting, sigterm_as_interrupt
from flaxformer_mini.malloc_tunables import restart_keeping_freed_memory
from flaxformer_mini.process_exit import exit_now
from flaxformer_mini.train.stop import STOPPED_AT_ONCE, StopNow, Stopped, StopRequests

# Each command's module, imported once its options are known good: `--help` and an option's
# error answer without loading JAX (seconds).
COMMANDS = {"train": "flaxformer_mini.cli.train", "evaluate": "flaxformer_mini.cli.evaluate",
            "generate": "flaxformer_mini.cli.generate", "average": "flaxformer_mini.cli.average"}


def main(argv=None):
    top = build_parser()
    args = top.parse_args(argv)
    # The command's own parser says what is wrong: its usage line and "flaxformer-mini train: error:".
    found = problem(args)
    if found:
        top.commands[args.command].error(found)
    if getattr(args, "keep_freed_memory", False):
        restart_keeping_freed_memory()  # re-executes with GLIBC_TUNABLES set, before JAX loads: malloc_tunables.py
    finished = False  # the command's work is done: a signal from here on stops nothing it was writing
    try:
        with _signals(args.command) as stop, collecting_rarely():
            command = importlib.import_module(COMMANDS[args.command])
            code = (command.run(args) if stop is None else command.run(args, stop)) or errors.EXIT_OK
            finished = True
            if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
                sys.stdout.flush()  # here, so that a reader gone away is handled below, not at exit
            return code
    except BrokenPipeError:
        # The reader (`generate ... | head -1`) has what it wanted: stop quietly, as other tools do.
        # As the Python docs advise (signal module, "Note on SIGPIPE"): stdout onto devnull, so
        # that the flush at exit fails no more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return errors.EXIT_BROKEN_PIPE
    except KeyboardInterrupt as e:
        return _interrupted(e, finished=finished)
    except Exception as e:  # noqa: BLE001 - a user's mistake becomes a message; a bug keeps its traceback
        code, message = errors.explain(e)
        if code is None or args.debug or os.environ.get(DEBUG_ENV):
            raise
        print(f"flaxformer-mini {args.command}: error: {message}", file=sys.stderr)
        if errors.exits_at_once_after(e):  # jax's exit barrier would wait for the lost process
            exit_now(code)
        return code


def _signals(command):
    """``train``: Ctrl-C and SIGTERM become stop requests (``StopRequests``) from before JAX
    loads: a signal at any moment stops every process at the same step, saved, never the
    default action (which would end this process at once and abort its peers); a second Ctrl-C
    ends the process, even inside a compilation. The other commands keep Python's Ctrl-C, and
    SIGTERM becomes one (``files.sigterm_as_interrupt``)."""
    return StopRequests(force_exit=True) if command == "train" else sigterm_as_interrupt()


def _interrupted(e, finished=False):
    if isinstance(e, StopNow):  # a second Ctrl-C: in the watcher's words (stop.py), had it come first
        print(f"\n{STOPPED_AT_ONCE}", file=sys.stderr)
    elif isinstance(e, StoppedAfterWriting):
        print(f"\nstopped once {e} was written", file=sys.stderr)
    elif finished and not isinstance(e, Stopped):  # while stdout was flushed or the handlers removed
        print("\nstopped after the command had finished its work", file=sys.stderr)
    elif not isinstance(e, Stopped):  # a Ctrl-C before the stop handler was in
        print("\nstopped", file=sys.stderr)
    else:  # fit raises it, so jax is up; process 0 said it already (train's echo), the others say it too
        from flaxformer_mini.scale import distributed  # late: it imports JAX, which --help must not; here fit has loaded it

        if not distributed.is_main():
            print(e, file=sys.stderr)
    if errors.exits_at_once(e):
        exit_now(errors.EXIT_INTERRUPTED)
    return errors.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
