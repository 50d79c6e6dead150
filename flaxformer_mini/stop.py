"""Stop requests: the first Ctrl-C (SIGINT) or SIGTERM (what SLURM, Kubernetes and Cloud TPU
send before they take a machine back) asks the run to finish its current step, save and stop;
a second Ctrl-C stops at once.

    with StopRequests() as stop:       # installed before anything slow (runtime, restore, compile)
        ...                            # a signal only sets stop.requested
        fit(run, steps, stop=stop)     # checked before the first step and at every step boundary

The handler is installed by ``train`` before the multi-process runtime starts, not by the
training loop: a SIGTERM that lands while the runtime starts, the checkpoint is restored or
the first step compiles is remembered, not lost to the default action (which ends the process
at once, and in a multi-process run takes its peers down with a C++ abort). This module
imports nothing heavy, so it can be installed before jax starts.
"""

import signal


class StopNow(KeyboardInterrupt):
    """The second Ctrl-C: stop at once, without saving (not the coordinated stop)."""


class Stopped(KeyboardInterrupt):
    """The coordinated stop, done: every process saved the same step, or had nothing new to
    save. ``str()`` says which and how to resume; the CLI exits 130, as for any Ctrl-C."""


class StopRequests:
    """A flag set by SIGINT/SIGTERM while installed (a context manager); the previous handlers
    come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise StopNow
        self.requested = True

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        return False
