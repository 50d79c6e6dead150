"""Ctrl-C and SIGTERM while the main thread is in native code (flaxformer_mini/train/stop.py).

Python runs a signal handler only when the main thread is between bytecodes. An XLA
compilation lets it run but holds back what it raises until the compilation ends; other native
code does not let it run at all: here ``pthread_mutex_lock`` of a mutex the main thread already
holds, called through ctypes (which releases the GIL), which waits without using the CPU and
never returns, not even on a signal (glibc waits again after EINTR). Either way the stop watcher
answers: it says the first signal was heard, and a second Ctrl-C ends the process at once.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from flaxformer_mini.cli import errors
from flaxformer_mini.train import stop
from helpers import Lines, start

# A child that installs the stop requests, says so, then stays in native code until it is
# ended, idle: the second lock of a default (non-recursive) mutex, all zeros as glibc's
# PTHREAD_MUTEX_INITIALIZER is, waits for an unlock that never comes. A busy native loop
# would take a core from the other pytest worker for the child's whole life.
NATIVE = """
import ctypes, sys
from flaxformer_mini.process_exit import before_exit_now
from flaxformer_mini.train.stop import StopRequests

libc = ctypes.CDLL(None)  # CDLL, not PyDLL: the GIL is released during the call
mutex = ctypes.create_string_buffer(64)  # zeroed, larger than any pthread_mutex_t
assert libc.pthread_mutex_lock(mutex) == 0
before_exit_now(lambda: print("before exit", flush=True))
with StopRequests(force_exit=sys.argv[1] == "force_exit"):
    print("in native code", flush=True)
    libc.pthread_mutex_lock(mutex)
    print("returned", flush=True)
"""
TIMEOUT_S = 60


@contextlib.contextmanager
def child_in_native_code(force_exit=True):
    """A child in native code, as ``train``'s StopRequests has it (``force_exit``) or as a
    library caller's."""
    proc = subprocess.Popen([sys.executable, "-c", NATIVE, "force_exit" if force_exit else "library"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    assert proc.returncode == errors.EXIT_INTERRUPTED == stop.EXIT_INTERRUPTED == 130
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


def test_a_quick_second_ctrl_c_ends_the_process_without_the_first_ones_hint():
    # Pressed twice in a row: the second cuts the first's grace period short, and the hint
    # to press it again would come after the fact, so there is none.
    with child_in_native_code() as (proc, _):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 130 and stop.STOPPED_AT_ONCE in err and "stopping:" not in err
    assert "before exit" in out  # where a train process removes its per-host process-id lock (host_guards.py)


def test_one_ctrl_c_delivered_twice_at_once_is_one_stop_request():
    # `timeout -s INT` signals the process and then its process group: one request, which
    # saves; the watcher gives the first signal's hint and leaves the process to stop.
    with child_in_native_code() as (proc, stderr):
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        heard = stderr.wait_for("stopping")
        assert heard.startswith("Ctrl-C: stopping:") and "Ctrl-C again stops at once" in heard
        # Past the time a second request would have ended it: GRACE_S after the signals, not
        # after the hint, which itself comes GRACE_S after them.
        time.sleep(max(0.0, sent + stop.GRACE_S + 0.5 - time.monotonic()))
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)  # a second press, later: at once
        out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 130 and stop.STOPPED_AT_ONCE in err and "returned" not in out


@pytest.mark.parametrize("later", ["sigint_after_repeat_s", "sigterm_at_once"])
def test_a_signal_repeated_within_repeat_s_is_the_same_request_and_a_later_or_other_one_stops_at_once(later):
    with stop.StopRequests() as requests:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # the same request, delivered twice: nothing raised
        assert requests.requested
        if later == "sigint_after_repeat_s":
            time.sleep(stop.REPEAT_S)
        with pytest.raises(stop.StopNow):
            signal.raise_signal(signal.SIGINT if later == "sigint_after_repeat_s" else signal.SIGTERM)


def test_a_library_callers_process_is_never_ended_by_the_watcher():
    # fit() without train's StopRequests (a notebook, a script, a test) installs its own,
    # without force_exit: a second Ctrl-C in native code raises StopNow when Python runs
    # again, and the process is the caller's to end.
    with child_in_native_code(force_exit=False) as (proc, stderr):
        proc.send_signal(signal.SIGINT)
        stderr.wait_for("stopping")
        proc.send_signal(signal.SIGINT)
        time.sleep(stop.GRACE_S + 1.5)
        assert proc.poll() is None


def test_a_stop_that_ends_within_the_grace_period_prints_nothing_more(capfd, monkeypatch):
    # The usual case (a Ctrl-C between steps): the run saves and stops at once, and says so
    # itself; the watcher adds no line. Its thread ends with the block. (GRACE_S raised: a
    # stalled worker on a loaded machine would otherwise see the line.)
    monkeypatch.setattr(stop, "GRACE_S", 30.0)
    before = signal.getsignal(signal.SIGINT)
    with stop.StopRequests() as requests:
        signal.raise_signal(signal.SIGINT)
        assert requests.requested
    assert capfd.readouterr().err == ""
    assert not requests._watcher.is_alive()
    assert signal.getsignal(signal.SIGINT) is before
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup descriptor is given back, too


def test_the_watchers_line_never_follows_the_runs_last_word(capfd, monkeypatch):
    # The run saved, said what it kept (fit calls settled() first) and is unwinding: its
    # teardown outlasting the grace period must not print "stopping" after "interrupted".
    monkeypatch.setattr(stop, "GRACE_S", 0.05)
    with stop.StopRequests() as requests:
        signal.raise_signal(signal.SIGTERM)
        requests.settled()
        time.sleep(0.5)  # ten grace periods: the watcher's deadline passes inside the block
    assert capfd.readouterr().err == ""
    # Unsettled, the same wait gets the line: the test above is not silent by accident.
    with stop.StopRequests():
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.5)
    assert capfd.readouterr().err.strip().startswith("SIGTERM: stopping:")


def test_a_ctrl_c_while_the_block_exits_leaves_no_watcher_handler_or_descriptor_behind(monkeypatch):
    # A third Ctrl-C can land in __exit__ itself (StopNow raised from our handler, or Python's
    # KeyboardInterrupt once the old one is back): what __exit__ undoes is undone anyway.
    requests = stop.StopRequests()
    requests.__enter__()
    restore = signal.signal
    raised = []

    def interrupted(signum, handler):
        if not raised:
            raised.append(signum)
            raise KeyboardInterrupt
        return restore(signum, handler)

    monkeypatch.setattr(stop.signal, "signal", interrupted)
    try:
        requests.__exit__(None, None, None)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the KeyboardInterrupt raised in __exit__ was lost")
    monkeypatch.setattr(stop.signal, "signal", restore)
    assert raised and not requests._watcher.is_alive()
    assert signal.set_wakeup_fd(-1) == -1
    for signum, handler in requests._previous.items():  # what the interrupted restore left undone
        signal.signal(signum, handler)


def test_stop_requests_outside_the_main_thread_are_refused_and_leave_no_descriptor_open():
    # Signal handlers belong to the main thread (signal.signal refuses any other): so do these.
    import threading

    errors, before = [], len(os.listdir("/proc/self/fd"))

    def enter():
        try:
            stop.StopRequests().__enter__()
        except ValueError as e:
            errors.append(e)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert len(errors) == 1 and len(os.listdir("/proc/self/fd")) == before
    assert "main thread" in str(errors[0])


def test_a_second_sigterm_ends_the_process_at_once_as_a_second_ctrl_c_does():
    # A scheduler that sends SIGTERM twice (or a user who repeats `kill`) must not wait for a
    # native call to return: the second signal of either kind is the second Ctrl-C.
    with child_in_native_code() as (proc, stderr):
        proc.send_signal(signal.SIGTERM)
        heard = stderr.wait_for("stopping")
        assert heard.endswith("; a second signal stops at once, without saving")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT_S)
        took = time.monotonic() - sent
    assert proc.returncode == 130 and stop.STOPPED_AT_ONCE in err and "returned" not in out
    assert stop.GRACE_S <= took < stop.GRACE_S + 10, took


def test_a_second_sigterm_raises_stop_now_in_python_code():
    with stop.StopRequests() as requests:
        signal.raise_signal(signal.SIGTERM)
        assert requests.requested
        time.sleep(stop.REPEAT_S)  # a scheduler's second SIGTERM, not the first one delivered twice
        try:
            signal.raise_signal(signal.SIGTERM)
        except stop.StopNow:
            pass
        else:
            raise AssertionError("a second SIGTERM was ignored")


# A run whose first update has a billion micro-batches: it never ends by itself.
ENDLESS_UPDATE = ["--task", "copy", "--preset", "tiny", "--layers", "1", "--vocab-size", "11", "--max-len", "5",
                  "--batch-size", "8", "--accumulate", "1000000000", "--steps", "3", "--no-progress", "--no-plot"]


def test_sigterm_during_a_long_accumulation_stops_inside_the_update_and_keeps_the_last_complete_state(tmp_path):
    from flaxformer_mini.runs.run import Run

    out = tmp_path / "run"
    proc = start("train", *ENDLESS_UPDATE, "--out", str(out))
    try:
        Lines(proc.stderr, proc).wait_for("model: ")  # restored or initialised: the update is under way
        time.sleep(3)  # into the micro-batches (their step compiles first)
        proc.send_signal(signal.SIGTERM)
        # The update never ends by itself: a process that ends at all stopped inside it, and one
        # that waits for the update's end times out here. A tighter wall-clock bound would test
        # the machine's load (the last micro-batch and the save), not the stop.
        out_text, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted during update 1's micro-batches: saved step 0; run the same command to resume" in err
    assert "Traceback" not in err
    # The update's sums were dropped; the state saved is the complete one before it, and reads back.
    state = Run.open(out).latest_state()
    assert int(state.step) == 0


def test_signals_held_together_each_reach_their_handler_and_the_first_exception_propagates():
    from flaxformer_mini.files import signals_held

    calls = []

    def on_sigterm(signum, frame):
        calls.append("SIGTERM")
        raise RuntimeError("terminated")

    def on_sigint(signum, frame):
        calls.append("SIGINT")
        raise KeyboardInterrupt

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(RuntimeError, match="terminated"):
            with signals_held():
                signal.raise_signal(signal.SIGTERM)
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGTERM)  # one of a kind is one request
                calls.append("the block ended")
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert calls == ["the block ended", "SIGTERM", "SIGINT"]


def test_sigterm_as_interrupt_raises_inside_and_restores_the_handler_after():
    from flaxformer_mini.files import sigterm_as_interrupt

    def previous(signum, frame):
        raise AssertionError("the previous handler answered a SIGTERM sent inside the block")

    before = signal.signal(signal.SIGTERM, previous)
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigterm_as_interrupt():
                signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_sigterm_as_the_block_ends_reaches_the_previous_handler_and_the_handler_is_restored(monkeypatch):
    # The signal lands after the block's last line and before the handler is put back: it is
    # the previous handler's to answer, and the block's own handler does not stay installed.
    from flaxformer_mini import files

    calls, restore = [], signal.signal

    def previous(signum, frame):
        calls.append(signum)

    def signalled_first(signum, handler):
        if handler is previous:
            signal.raise_signal(signal.SIGTERM)
        return restore(signum, handler)

    before = signal.signal(signal.SIGTERM, previous)
    try:
        with files.sigterm_as_interrupt():
            monkeypatch.setattr(files.signal, "signal", signalled_first)
        monkeypatch.setattr(files.signal, "signal", restore)
        assert calls == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        restore(signal.SIGTERM, before)


def test_a_sigterm_the_moment_the_handler_is_in_stops_the_block_and_the_previous_handler_is_restored(monkeypatch):
    # The signal lands as the block's handler is installed, before the block runs: it stops the
    # block (KeyboardInterrupt), and the handler does not stay installed past it.
    from flaxformer_mini import files

    install = signal.signal

    def previous(signum, frame):
        raise AssertionError("the previous handler answered a SIGTERM sent as the block's was installed")

    def signalled_at_once(signum, handler):
        old = install(signum, handler)
        if handler is not previous:  # the block's own handler, just installed
            signal.raise_signal(signal.SIGTERM)
        return old

    before = install(signal.SIGTERM, previous)
    try:
        monkeypatch.setattr(files.signal, "signal", signalled_at_once)
        ran = []
        with pytest.raises(KeyboardInterrupt):
            with files.sigterm_as_interrupt():
                ran.append("the block")
        monkeypatch.setattr(files.signal, "signal", install)
        assert ran == [] and signal.getsignal(signal.SIGTERM) is previous
    finally:
        install(signal.SIGTERM, before)


def test_an_ignored_sigterm_stays_ignored_under_sigterm_as_interrupt():
    from flaxformer_mini.files import sigterm_as_interrupt

    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with sigterm_as_interrupt():
            signal.raise_signal(signal.SIGTERM)  # ignored: the block runs on
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
