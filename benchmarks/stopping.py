"""How a benchmark command stops on Ctrl-C or SIGTERM: in one line, with exit code 130, keeping
what had finished. Light (no JAX, no torch), so that a command installs it before its first
slow import."""

import contextlib
import os
import signal
import sys

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_on_signals():
    """Ctrl-C and SIGTERM raise KeyboardInterrupt, once: the command unwinds (its temporary
    directories are removed on the way out) and says in one line what it kept. Later ones are
    ignored until it ends, so that a second Ctrl-C cannot cut the cleanup or that line short
    into a traceback."""
    def interrupt(signum, frame):
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_IGN)
        raise KeyboardInterrupt

    for number in STOP_SIGNALS:
        signal.signal(number, interrupt)


def exit_interrupted(line, command):
    """Print ``line``; a command then ends at once with 130: XLA's compile thread may still be
    running, and an interpreter teardown under it segfaults. Called as a function: 130."""
    print(line, file=sys.stderr)
    if not command:
        return 130
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


@contextlib.contextmanager
def stopping_while_importing(module_name, line):
    """The module-level imports of a command's module (JAX, flax, torch: seconds) under
    ``stop_on_signals``: Ctrl-C or SIGTERM among them ends the command with ``line`` and 130, not
    a traceback. Only where ``module_name`` is "__main__" (``python -m ...``): a module imported
    as a library leaves the process's signal handlers alone."""
    if module_name != "__main__":
        yield
        return
    stop_on_signals()
    try:
        yield
    except KeyboardInterrupt:
        exit_interrupted(line, command=True)
