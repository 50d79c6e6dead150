"""Ctrl-C and SIGTERM while the main thread is in native code (flaxformer_mini/stop.py).

Python runs a signal handler only when the main thread is between bytecodes. An XLA
compilation lets it run but holds back what it raises until the compilation ends; other native
code (here ``hashlib.pbkdf2_hmac``, which releases the GIL and never checks for signals) does
not let it run at all. Either way the stop watcher answers: it says the first signal was
heard, and a second Ctrl-C ends the process at once.
"""

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

from flaxformer_mini import cli, stop

# A child that installs the stop requests, says so, then stays in native code for minutes
# (about 0.3 us an iteration: the test ends it long before).
NATIVE = """
import hashlib
from flaxformer_mini.stop import StopRequests

with StopRequests():
    print("in native code", flush=True)
    hashlib.pbkdf2_hmac("sha256", b"password", b"salt", 2_000_000_000)
    print("returned", flush=True)
"""
TIMEOUT_S = 60


class Lines:
    """A child's output stream read line by line, failing after TIMEOUT_S: a line that never
    comes fails the test rather than hanging it. It reads the raw descriptor after select, so
    no line waits in a buffer that select cannot see."""

    def __init__(self, stream, proc):
        self.fd, self.proc, self.rest = stream.fileno(), proc, ""

    def wait_for(self, text):
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            *lines, self.rest = self.rest.split("\n")
            for i, line in enumerate(lines):
                if text in line:
                    self.rest = "\n".join(lines[i + 1:] + [self.rest])
                    return line
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self.fd], [], [], left)[0], f"no {text!r} within {TIMEOUT_S} s"
            chunk = os.read(self.fd, 4096).decode()
            assert chunk, f"no {text!r}; the child exited {self.proc.wait()}"
            self.rest += chunk


@contextlib.contextmanager
def child_in_native_code():
    proc = subprocess.Popen([sys.executable, "-c", NATIVE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        Lines(proc.stdout, proc).wait_for("in native code")
        yield proc, Lines(proc.stderr, proc)
    finally:
        proc.kill()
        proc.communicate()


def test_a_signal_in_native_code_is_answered_and_a_second_ctrl_c_ends_the_process_at_once():
    with child_in_native_code() as (proc, stderr):
        # SIGTERM first (a scheduler's), then Ctrl-C: a stop was requested already, so the
        # Ctrl-C is the second one, which stops at once whatever the first signal was.
        proc.send_signal(signal.SIGTERM)
        heard = stderr.wait_for("stopping")
        assert heard.startswith("SIGTERM: stopping: the run saves when the step or compilation in progress ends")
        assert "Ctrl-C again" not in heard  # a scheduler's signal gets no keyboard hint
        assert proc.poll() is None  # still in native code: the stop waits for it
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT_S)
        took = time.monotonic() - sent
    assert proc.returncode == cli.EXIT_INTERRUPTED == stop.EXIT_INTERRUPTED == 130
    assert "stopped at once, without saving: the last complete checkpoint is kept" in err
    assert "returned" not in out and "Traceback" not in err
    # GRACE_S after the second signal; the native call had minutes left.
    assert stop.GRACE_S <= took < stop.GRACE_S + 10, took


def test_a_first_ctrl_c_in_native_code_is_answered_with_the_keyboard_hint():
    with child_in_native_code() as (proc, stderr):
        proc.send_signal(signal.SIGINT)
        heard = stderr.wait_for("stopping")
        assert heard.startswith("Ctrl-C: stopping:") and "Ctrl-C again stops at once, without saving" in heard
        assert proc.poll() is None


def test_a_stop_that_ends_within_the_grace_period_prints_nothing_more(capfd):
    # The usual case (a Ctrl-C between steps): the run saves and stops at once, and says so
    # itself; the watcher adds no line. Its thread ends with the block.
    before = signal.getsignal(signal.SIGINT)
    with stop.StopRequests() as requests:
        signal.raise_signal(signal.SIGINT)
        assert requests.requested
    time.sleep(stop.GRACE_S + 0.2)
    assert capfd.readouterr().err == ""
    assert not requests._watcher.is_alive()
    assert signal.getsignal(signal.SIGINT) is before
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup descriptor is given back, too
