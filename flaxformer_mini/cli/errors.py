"""What the command line does with an error: its exit code and one line naming the problem.

Exit codes: 0 done, 1 the run failed on the way (a NaN loss, a full disk, a lost process; the
last checkpoint is kept), 2 unusable options, files or run directories (nothing written or
lost), 130 interrupted by Ctrl-C or SIGTERM (the run was saved and can be resumed, but for a second
signal, which ends the process at once without saving), 141 standard output closed early
(`| head`). Errors are told apart by type; an error of no type named here is a bug and keeps its
traceback. Every import here is light: errors are told apart without starting JAX.
"""

import errno
import importlib.util
import sys

from flaxformer_mini.files import describe_os_error
from flaxformer_mini.scale.errors import ProcessLostError
from flaxformer_mini.train.errors import NonFiniteLossError
from flaxformer_mini.train.stop import StopNow

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 141  # standard output closed early (`| head`): 128 + SIGPIPE, as a shell reports such a stop

# The project's dependencies by the module a command imports, with the distribution pip installs
# (pyproject.toml). A missing one is an environment to fix, not a bug: say which and how. torch
# and safetensors are the [torch] extra, which takes torch's CPU build first (README).
DEPENDENCIES = {"jax": "jax", "jaxlib": "jaxlib", "flax": "flax", "optax": "optax", "orbax": "orbax-checkpoint",
                "numpy": "numpy", "tqdm": "tqdm", "matplotlib": "matplotlib", "tokenizers": "tokenizers",
                "sacrebleu": "sacrebleu", "rapidfuzz": "rapidfuzz", "tensorboardX": "tensorboardX",
                "torch": "torch", "safetensors": "safetensors"}
TORCH_EXTRA = ("torch", "safetensors")


def _installed(name):
    """Whether the top-level module ``name`` can be found, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it says so by raising
        return False


def describe_missing_dependency(error):
    """One line for an ImportError of one of the project's dependencies (``DEPENDENCIES``), or
    None: any other module missing is a bug, and keeps its traceback."""
    module = getattr(error, "name", None) or ""
    name = module.split(".")[0]
    if not isinstance(error, ModuleNotFoundError) or name not in DEPENDENCIES:
        return None
    if module != name and _installed(name):
        return None  # the package is installed and lacks one of its modules: a broken install or a bug
    install = ('pip install torch==2.13.0 (the CPU build), then pip install -e ".[torch]"' if name in TORCH_EXTRA
               else "pip install -e . (the Flax side), as the README's set-up does")
    return f"this command needs the Python package {DEPENDENCIES[name]}, which is not installed here: {install}"


def explain(error):
    """(exit code, one-line message) for an error a user can fix, or (None, None) for a bug.

    2: unusable options, files or run directories (nothing was written, or nothing lost);
    1: a run that failed on the way (a NaN loss, a full disk): its last checkpoint is kept.
    """
    if isinstance(error, (NonFiniteLossError, ProcessLostError)):
        return EXIT_FAILED, str(error)
    missing = describe_missing_dependency(error)
    if missing is not None:
        return EXIT_UNUSABLE, missing
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {error.filename}" if error.filename else ""
        return EXIT_FAILED, (f"no space left on the device{where}. The last complete checkpoint is kept: "
                             f"free some space, then run the same command to resume")
    if isinstance(error, OSError) and error.filename is not None:
        return EXIT_UNUSABLE, describe_os_error(error)
    if isinstance(error, (ValueError, FileNotFoundError)):  # bad files, configs or options, named by the raiser
        return EXIT_UNUSABLE, str(error)
    if _is_out_of_memory(error):
        return EXIT_FAILED, ("out of memory: " + _last_line(error) + ". The sizes fit the check made before the "
                             "work started, but not what XLA allocated: give a smaller --batch-size, --max-tokens or "
                             "--beam-size (whichever the command takes)")
    return None, None


def _is_out_of_memory(error):
    """XLA's out-of-memory error. Told by JAX's own error type when JAX is loaded (it is, once
    anything has run), so that this module never loads it."""
    jax = sys.modules.get("jax")
    return (jax is not None and isinstance(error, jax.errors.JaxRuntimeError)
            and any(m in str(error) for m in ("RESOURCE_EXHAUSTED", "Out of memory")))


def _last_line(error):
    return (str(error).strip().splitlines() or [type(error).__name__])[-1].strip().rstrip(".")


def exits_at_once(interrupt):
    """Whether the process ends at once, without Python's shutdown: after a second Ctrl-C
    (StopNow). The shutdown would wait for an XLA compilation still running (StopNow reaches
    Python while the compile runs on: seconds for a base model on a CPU, minutes for a large
    one on a GPU) and, in a multi-process run, at jax's exit barrier for peers still in the run
    (every process then aborted after its timeout). The peers stop with "lost contact"; the
    last complete checkpoint is kept, as after ``kill -9``. The coordinated stop (Stopped)
    exits normally."""
    return isinstance(interrupt, StopNow)


def exits_at_once_after(error):
    """Whether an error ends the process at once: a lost process, for which jax's exit barrier
    would wait until its timeout."""
    return isinstance(error, ProcessLostError)
