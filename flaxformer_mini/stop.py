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

The handler runs in the main thread between bytecodes, and during an XLA compilation it does
run, inside the compile call (seconds on a CPU, minutes for a large model on a GPU), but the
StopNow it raises there surfaces only when the compilation returns. So a second Ctrl-C did not
stop at once, and the first went unanswered until the run stopped. A watcher thread reads each
signal from ``signal``'s wakeup file descriptor (written by the interpreter's C-level handler
as the signal arrives) and acts when the run has not stopped within ``GRACE_S``: after the
first, it says the stop was heard; after a second Ctrl-C, it ends the process as ``kill -9``
would (the last complete checkpoint is kept, and the same command resumes from it).
"""

import os
import signal
import sys
import threading

GRACE_S = 1.0  # how long a stop may take before the watcher speaks (first signal) or ends the process (second)
EXIT_INTERRUPTED = 130  # as cli.py's: the exit code of any Ctrl-C


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
        self._watcher = None

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        self._start_watcher()
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise StopNow
        self.requested = True

    def _start_watcher(self):
        read, write = os.pipe()
        os.set_blocking(write, False)  # the C-level handler must never block on a full pipe
        self._wakeup = (read, write, signal.set_wakeup_fd(write, warn_on_full_buffer=False))
        self._closing = threading.Event()  # set by __exit__: the run has stopped, or ended
        self._watcher = threading.Thread(target=self._watch, args=(read,), name="stop-requests", daemon=True)
        self._watcher.start()

    def _watch(self, read):
        stops = 0  # our signals so far, in arrival order
        while True:
            try:
                data = os.read(read, 64)
            except OSError:
                return
            if not data:  # __exit__ closed the pipe
                return
            for signum in data:
                if signum not in self.SIGNALS:
                    continue
                stops += 1
                if stops > 1 and signum == signal.SIGINT:
                    if not self._closing.wait(GRACE_S):
                        print("\nstopped at once, without saving: the last complete checkpoint is kept; run the "
                              "same command to resume from it", file=sys.stderr, flush=True)
                        sys.stdout.flush()
                        os._exit(EXIT_INTERRUPTED)
                elif stops == 1 and not self._closing.wait(GRACE_S):
                    name, hint = (("Ctrl-C", "; Ctrl-C again stops at once, without saving")
                                  if signum == signal.SIGINT else (signal.Signals(signum).name, ""))
                    print(f"\n{name}: stopping: the run saves when the step or compilation in progress "
                          f"ends, then exits{hint}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        read, write, previous_fd = self._wakeup
        signal.set_wakeup_fd(previous_fd)
        self._closing.set()
        os.close(write)  # the watcher reads the pipe's end and returns
        self._watcher.join()
        os.close(read)
        return False
