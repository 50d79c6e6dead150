"""Ending the process at once (``os._exit``), for the exits that must not wait on Python's
shutdown: JAX's exit barrier would wait for a lost peer, or the main thread is inside native
code. ``os._exit`` runs no ``atexit`` handler, so what must still happen then (the per-host
process-id lock's removal, scale/host_guards.py) registers here as well."""

import os
import sys

_BEFORE_EXIT_NOW = []


def before_exit_now(fn):
    """Call ``fn`` (no arguments) when ``exit_now`` ends the process; registering it again
    changes nothing."""
    if fn not in _BEFORE_EXIT_NOW:
        _BEFORE_EXIT_NOW.append(fn)


def exit_now(code):
    """Flush what was printed, call what registered with ``before_exit_now``, and end the
    process with ``code`` without Python's shutdown."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fn in _BEFORE_EXIT_NOW:
        fn()
    os._exit(code)
