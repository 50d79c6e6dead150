"""Whether an output path can be written, checked before a benchmark or tool runs: standard
library only, so a tool whose children measure their own memory (tools/measure_loading.py)
checks its options without loading JAX into the process the children are forked from."""

import os
import tempfile


def output_problem(path, option="--json"):
    """Why ``path`` cannot take an output file (None if it can): checked before the run."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{option} {path}: is a directory; give a file name"
    if not os.path.isdir(parent):
        return f"{option} {path}: its directory {parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"{option} {path}: its directory {parent} is not writable"
    return None


def directory_problem(path, option="--out"):
    """Why ``path`` cannot be made (where missing) and written as an output directory (None if it
    can): its nearest existing ancestor must be a directory a file can be made in, which a probe
    tries, as ``os.access`` says yes to root where the kernel still refuses (/proc)."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{option} {path}: is a file; give a directory"
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return f"{option} {path}: {ancestor} is a file, not a directory"
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as e:
        return f"{option} {path}: cannot be written under {ancestor} ({e.strerror or e})"
    return None
