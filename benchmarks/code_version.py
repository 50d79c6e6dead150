"""Which code took a benchmark's measurements: the git commit of the checkout it ran from.

Without it two reports of one machine cannot be told apart by code: the Zen 4's Flax train
step was at 60% of its matmul peak on 2026-11-25 and at 74% on 2026-11-27, and only a rerun of
the older commit beside the newer one showed that the spread was the machine's (docs/benchmarks.md).
"""

import os
import subprocess
from importlib import metadata
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# What a benchmark runs: a change elsewhere (docs, tests) changes no number, and a report
# written while its own docs are being edited is not marked as measuring changed code.
MEASURED = ("benchmarks", "flaxformer_mini", "torch_ref", "pyproject.toml")
# A copy without .git (the `device` tool's GPU machine gets the working tree alone): the
# caller names the commit it copied, `FLAXFORMER_MINI_COMMIT=$(git rev-parse HEAD)` here.
COMMIT_ENV = "FLAXFORMER_MINI_COMMIT"


def _git(root, *args):
    """git's output, or None where it failed, and what it said on stderr."""
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    return (out.stdout.strip() if out.returncode == 0 else None), out.stderr.strip()


def code_version(root=PROJECT_ROOT):
    """Which code took the measurements: ``{"commit": sha, "modified": bool}`` in a git
    checkout of the project (``modified``: tracked files of the measured code, ``MEASURED``,
    differ from the commit, so the numbers are of an uncommitted change); else the commit that
    ``FLAXFORMER_MINI_COMMIT`` names (``modified`` None: unknown); else ``{"package": version}``
    of the installed flaxformer-mini; for a checkout git refuses to read, the commit None and
    git's ``error``. A checkout counts only at its top: an installed copy
    inside some other repository (a virtual environment in a clone) is not that repository's
    commit."""
    try:
        top, refusal = _git(root, "rev-parse", "--show-toplevel")
        if top is not None and Path(top).resolve() == Path(root).resolve():
            commit, _ = _git(root, "rev-parse", "HEAD")
            status, _ = _git(root, "status", "--porcelain", "--untracked-files=no", "--", *MEASURED)
            if commit is not None and status is not None:
                return {"commit": commit, "modified": bool(status)}
        elif (Path(root) / ".git").exists():
            # A checkout git will not read (another user's, as root: "dubious ownership"): say
            # so, rather than the package's version, which is the same for every commit.
            error = refusal.splitlines()
            return {"commit": None, "modified": None, "error": error[0] if error else "git could not read it"}
    except (OSError, subprocess.TimeoutExpired):  # no git on this machine: what the caller says, or the package
        pass
    if os.environ.get(COMMIT_ENV):
        return {"commit": os.environ[COMMIT_ENV], "modified": None}  # None: a copy's changes are unknown
    try:
        return {"package": metadata.version("flaxformer-mini")}
    except metadata.PackageNotFoundError:
        return {"package": None}


def describe(code):
    """'commit 4f1cec1 (with uncommitted changes)' or 'flaxformer-mini 0.1.0' for a header."""
    if "error" in code:
        return f"commit unknown (git: {code['error']})"
    if "commit" in code:
        said = {True: " (with uncommitted changes)", None: f" (as {COMMIT_ENV} says; no checkout to check it)"}
        return f"commit {code['commit'][:7]}" + said.get(code["modified"], "")
    return f"flaxformer-mini {code['package'] or '(version unknown)'}"
