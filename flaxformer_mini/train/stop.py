"""Stop requests: the first Ctrl-C (SIGINT) or SIGTERM (what SLURM, Kubernetes and Cloud TPU
send before they take a machine back) asks the run to finish its current step, save and stop;
a second signal of either kind stops at once, as a second Ctrl-C does. The same signal again
within ``REPEAT_S`` of the first is that first request, delivered twice.

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
StopNow it raises there surfaces only when the compilation returns: alone, a second Ctrl-C would
not stop at once, and the first would go unanswered until the run stopped. A watcher thread reads each
signal from ``signal``'s wakeup file descriptor (written by the interpreter's C-level handler
as the signal arrives) and acts when the run has not stopped within ``GRACE_S``: after the
first, it says the stop was heard, unless the run has said what it saved (``settled``); after a
second signal (``force_exit``, which ``train`` asks for), it ends the process as ``kill -9``
would (the last complete checkpoint is kept, and the same command resumes from it). A forked
child shares the wakeup descriptor; nothing here forks.
"""

import os
import select
import signal
import sys
import threading
import time

from flaxformer_mini.process_exit import exit_now

GRACE_S = 1.0  # how long a stop may take before the watcher speaks (first signal) or ends the process (second)
# The same signal again within this of the first is the same request: `timeout -s INT` sends
# it to the process and then to its process group, and wrappers forward a terminal's Ctrl-C
# that the terminal also sent, microseconds to milliseconds apart; a second key press by a
# person comes 0.1 s or more after the first.
REPEAT_S = 0.05
EXIT_INTERRUPTED = 130  # as cli/errors.py's: the exit code of any Ctrl-C


class StopNow(KeyboardInterrupt):
    """The second signal (Ctrl-C or SIGTERM): stop at once, without saving (not the coordinated stop)."""


class Stopped(KeyboardInterrupt):
    """The coordinated stop, done: every process saved the same step, or had nothing new to
    save. ``str()`` says which and how to resume; the CLI exits 130, as for any Ctrl-C."""


STOPPED_AT_ONCE = ("stopped at once, without saving: the last complete checkpoint is kept; run the same command "
                   "to resume from it")


class StopRequests:
    """A flag set by SIGINT/SIGTERM while installed (a context manager); the previous handlers
    come back on exit. ``force_exit``: a second signal that the run has not acted on within
    GRACE_S ends the process (``train`` asks for it; a library caller's process is never ended
    from here, it gets StopNow when its code next runs)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, force_exit=False):
        self.requested = False
        self._first = None  # (signal, time.monotonic()) of the request
        self.force_exit = force_exit
        self._previous = None
        self._watcher = None
        # The watcher's "stopping" line and the run's last word (``settled``) are ordered by
        # this lock: the line comes before what the run saved, or not at all.
        self._notice_lock = threading.Lock()
        self._settled = False

    def __enter__(self):
        self._closing = threading.Event()  # set first thing in __exit__: the run has stopped, or ended
        read, write = os.pipe()
        os.set_blocking(write, False)  # the C-level handler must never block on a full pipe
        try:
            self._wakeup = (read, write, signal.set_wakeup_fd(write, warn_on_full_buffer=False))
        except BaseException:  # not the main thread (ValueError), as signal.signal would refuse too
            os.close(read), os.close(write)
            raise
        self._watcher = threading.Thread(target=self._watch, args=(read,), name="stop-requests", daemon=True)
        self._watcher.start()
        self._previous = {}
        try:
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        except BaseException:  # a Ctrl-C meanwhile (Python's default handler): leave nothing behind
            self.__exit__()
            raise
        return self

    def settled(self):
        """The run has stopped and is about to say what it kept: the watcher's line that the
        stop was heard, if not said already, is never said after it. (A second signal still
        ends the process: what follows, the process's teardown, can hang too.)"""
        with self._notice_lock:
            self._settled = True

    def _handle(self, signum, frame):
        now = time.monotonic()
        if self.requested:  # the second signal, whichever: a scheduler's second SIGTERM too
            if _repeats(self._first, signum, now):
                return
            raise StopNow
        self.requested, self._first = True, (signum, now)

    def _watch(self, read):
        """Each of our signals, as it arrives: after the first, a line if the run has not stopped
        within GRACE_S of it; after a second signal (force_exit), the process ended if it has not
        stopped within GRACE_S of that one. A second signal cuts the first's wait short."""
        stops, say_at, end_at, first = 0, None, None, None  # first: (signal, time) of the first stop
        while True:
            due = [t for t in (say_at, end_at) if t is not None]
            ready = select.select([read], [], [], max(0.0, min(due) - time.monotonic()) if due else None)[0]
            if ready:
                try:
                    data = os.read(read, 64)
                except OSError:
                    return
                if not data:  # __exit__ closed the pipe
                    return
                now = time.monotonic()
                for signum in data:
                    if signum not in self.SIGNALS or _repeats(first, signum, now):
                        continue  # another handler's signal, __exit__'s wake-up byte (0), or a repeat
                    stops += 1
                    if stops == 1:
                        say_at, first = now + GRACE_S, (signum, now)
                    elif self.force_exit and end_at is None:
                        say_at, end_at = None, now + GRACE_S  # no hint once it is pressed again
            if self._closing.is_set():
                return
            now = time.monotonic()
            if end_at is not None and now >= end_at:
                print(f"\n{STOPPED_AT_ONCE}", file=sys.stderr, flush=True)
                exit_now(EXIT_INTERRUPTED)
            if say_at is not None and now >= say_at:
                say_at = None
                name, hint = (("Ctrl-C", "; Ctrl-C again stops at once, without saving") if first[0] == signal.SIGINT
                              else (signal.Signals(first[0]).name, "; a second signal stops at once, without saving"))
                with self._notice_lock:
                    if not self._settled:
                        print(f"\n{name}: stopping: the run saves when the step or compilation in progress ends, "
                              f"then exits{hint}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        # The watcher first (a signal from here on must not end the process behind a caller
        # that has already stopped), then the handlers and the descriptor, whatever is raised
        # meanwhile: a third Ctrl-C arriving here raises StopNow or KeyboardInterrupt.
        self._closing.set()
        read, write, previous_fd = self._wakeup
        try:
            for s, handler in self._previous.items():
                signal.signal(s, handler)
        finally:
            signal.set_wakeup_fd(previous_fd)
            try:
                os.write(write, b"\0")  # wakes the watcher even where a forked child holds the pipe open
            except OSError:
                pass  # full: the watcher is awake already
            os.close(write)
            self._watcher.join()
            os.close(read)
        return False


def _repeats(first, signum, now):
    """Whether ``signum`` at ``now`` repeats the ``first`` stop request ((signal, time), or None)."""
    return first is not None and first[0] == signum and now - first[1] < REPEAT_S
