"""Test-wide settings, and why. How to run the suite, where its time goes and what is left
out to keep it short: docs/testing.md.

- Numerics: parity runs use exact float32 matmuls on both sides (DESIGN.md): on an accelerator
  JAX's highest matmul precision, and on a CPU its default one, which XLA:CPU computes in
  float32 all the same (the commands' precision, so their programs are shared). As in Equinox's
  tests, implicit rank promotion is an error, so a missing axis is caught, and implicit dtype
  promotion too (a float32 constant silently widening a bfloat16 activation, an int mixing
  with a float): the few library calls that promote on purpose say so where they run
  (``jax.numpy_dtype_promotion("standard")`` around optax's update and Flax's LayerNorm).
- ``--torch-device cuda`` (with ``-m parity``, on a GPU): torch's tensors and modules on CUDA
  (``torch.set_default_device``), JAX on its default device, TF32 off and JAX's highest
  matmul precision.
- Speed: XLA:CPU compiles at LLVM optimisation level 0 and runs its kernels on one thread,
  torch on one thread per worker (below); the pytest workers and the subprocesses the tests
  start (the CLI, multi-process runs) share one persistent compilation cache per pytest run;
  the longest files are scheduled first (HEAVY_FIRST); JAX's bookkeeping is cheaper in the
  pytest processes (tests/jax_bookkeeping.py: no program and no number changes).

Shared helpers are tests/helpers.py's (plain functions and constants); fixtures shared by
several files are here. A test file never imports another.
"""

import gc
import os
import shutil
import signal
import tempfile
from pathlib import Path

# XLA:CPU's LLVM optimisation level 0, for this process and (inherited) every subprocess the
# tests start: it cuts each compilation by about a third, and the suite is mostly compilation.
# Level 0 forms no fused multiply-adds, which the default level does, so a value computed here
# may differ from a user's in its last bits (jax.random.uniform's scaling: half its values, by
# one rounding; docs/testing.md), and a trained run by more as such roundings add up. Both
# sides of every comparison here are compiled at the same level. Set before JAX starts.
#
# One thread for XLA:CPU's Eigen kernels (here, in every process) and for torch (below, in
# each pytest worker): the suite runs as `-n 2` on 2 cores, so each worker has a core of its
# own already, and a second thread in each only makes the workers (and their subprocesses) take
# turns on the cores (Eigen's and OpenMP's waiting threads spin before they sleep).
# The measurements behind both: docs/testing.md, "Where the time goes".
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):  # xdist's workers inherit them
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), TEST_XLA_FLAGS]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402

import flaxformer_mini as fm
from flaxformer_mini.collector import THRESHOLDS
import jax_bookkeeping  # noqa: F401 - cheaper JAX bookkeeping, no program changed: the module says why
from parity import parity_numerics
from parity.policy import DEFAULT_ATOL

parity_numerics()
# XLA:CPU computes float32 dots in float32 at every matmul precision: there the precision is only
# a word in the program, and a key of the compilation cache. On a CPU the workers keep the
# precision a command runs under, so a test's library call and the command it is compared with
# (in this process or in one of its own) run one compiled program, not two.
SUITE_PRECISION = "highest" if jax.default_backend() != "cpu" else None
jax.config.update("jax_default_matmul_precision", SUITE_PRECISION)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
torch.set_num_threads(1)  # one thread per worker: see TEST_XLA_FLAGS above
# Python's cyclic garbage collector, less often, at the thresholds a command runs under
# (flaxformer_mini/collector.py): tracing and lowering allocate objects by the million, and with
# the default thresholds (700, 10, 10) a worker runs a full collection, which walks every object
# the worker holds (every module, every compiled program), every few seconds. Garbage without
# cycles is freed at once either way; memory stays within a few percent. Measured:
# docs/testing.md, "Where the time goes".
gc.set_threshold(*THRESHOLDS)

# The tolerance of DESIGN.md's parity policy (Hugging Face's PT/Flax standard): parity's own.
ATOL = DEFAULT_ATOL

# One JAX compilation cache for the whole pytest run: both xdist workers and every process the
# tests start read and write it. The CLI and multi-process tests start dozens of processes that
# compile the same train, eval and decode steps, and the two workers compile many of the same
# small programs (the random inits' and eager operations' of equal shapes), each a compilation
# of its own without the cache; every compile time is cached, however short (docs/testing.md).
# Made before the workers start (xdist copies the environment), removed at the end of the run.
CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
# The runs several files train alike (trained_run, below), in one directory every worker of
# this pytest run reads: made like the compilation cache's, removed at the end of the run.
RUNS_ENV = "FLAXFORMER_MINI_TEST_RUNS"
_CACHE_CREATED = []


def pytest_addoption(parser):
    parser.addoption(
        "--torch-device", default="cpu", metavar="DEVICE",
        help="where torch makes its tensors and modules (torch.set_default_device): cpu (the default) or cuda. "
             "The parity suite on a GPU, torch CUDA against JAX's GPU: python -m pytest -m parity --torch-device cuda")


def pytest_configure(config):
    device = config.getoption("--torch-device")
    if device != "cpu":
        from parity.twins import torch_device

        try:
            torch.set_default_device(torch_device(device))  # refused by name when torch cannot use it
        except ValueError as e:
            raise pytest.UsageError(f"--torch-device {device}: {e}") from None
    if CACHE_ENV not in os.environ and not hasattr(config, "workerinput"):
        os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="flaxformer-mini-jax-cache-")
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # tiny runs compile fast
        _CACHE_CREATED.append(os.environ[CACHE_ENV])
    # JAX read its environment when conftest imported it, before the lines above ran here.
    jax.config.update("jax_compilation_cache_dir", os.environ[CACHE_ENV])
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")))
    if RUNS_ENV not in os.environ and not hasattr(config, "workerinput"):
        os.environ[RUNS_ENV] = tempfile.mkdtemp(prefix="flaxformer-mini-test-runs-")
        _CACHE_CREATED.append(os.environ[RUNS_ENV])


def pytest_report_header(config):
    # Where the numbers of a parity run came from: part of its evidence, on a GPU above all.
    jax_device = jax.devices()[0]
    return (f"torch on {config.getoption('--torch-device')} (TF32 off), JAX on {jax_device.platform} "
            f"({jax_device.device_kind}); matmul precision {jax.config.jax_default_matmul_precision}")


def pytest_unconfigure(config):
    for path in _CACHE_CREATED:
        shutil.rmtree(path, ignore_errors=True)


# The longest files first, so that under `-n 2 --dist loadfile --no-loadscope-reorder`
# (pyproject) the longest file does not start, and end, last: xdist hands files out in this
# order as workers free up (their times: docs/testing.md).
HEAVY_FIRST = ("test_multiprocess.py", "test_run_lifecycle.py", "test_benchmarks.py", "test_parity_cli.py",
               "test_real_corpora.py", "test_tied_embeddings.py", "test_scanned_layers.py", "test_training.py",
               "test_train_cli.py", "test_ablations.py", "test_bad_input_matrix.py", "test_multiprocess_faults.py",
               "test_decoding.py", "test_best_checkpoint.py", "test_tensor_parallel.py", "test_generate_lines.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(HEAVY_FIRST)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def suite_precision():
    """The suite's matmul precision again after each test: `parity check` and `parity
    bfloat16` set the highest one for their process, which here is the worker."""
    yield
    if jax.config.jax_default_matmul_precision != SUITE_PRECISION:
        jax.config.update("jax_default_matmul_precision", SUITE_PRECISION)


@pytest.fixture
def tiny_config():
    return fm.get_preset("tiny")


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """``trained_run(name)``: the directory holding the run ``helpers.SHARED_RUNS[name]``
    trains, and its data files: trained once per pytest run, whichever worker asks first (a
    file lock keeps the other waiting, then it reads the same run). Read only: a test that
    changes a run copies it first."""
    import fcntl

    from helpers import SHARED_RUNS, cli

    # Without xdist's controller (pytest -n 0 run by hand in another way), a directory of this pytest run's.
    root = Path(os.environ.get(RUNS_ENV) or tmp_path_factory.mktemp("shared_runs"))

    def get(name):
        d, done = root / name, root / f"{name}.done"
        with open(root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not done.exists():
                shutil.rmtree(d, ignore_errors=True)  # what a failed attempt left
                d.mkdir()
                proc = cli(*SHARED_RUNS[name](d))
                assert proc.returncode == 0, proc.stderr
                done.touch()
        return d

    return get


def assert_close(flax_value, torch_value, atol=ATOL):
    """Max absolute difference of a Flax and a torch value, in float64, within ``atol``."""
    a = np.asarray(flax_value, np.float64)
    b = torch_value.detach().cpu().numpy().astype(np.float64) if isinstance(torch_value, torch.Tensor) else np.asarray(torch_value, np.float64)
    assert a.shape == b.shape, f"shapes differ: Flax {a.shape}, torch {b.shape}"
    err = float(np.abs(a - b).max()) if a.size else 0.0
    assert err <= atol, f"max abs diff {err:.3e} > {atol:g}"
    return err


def flax_twin_of(torch_module, flax_cls, *args, **kwargs):
    """The Flax twin of ``torch_module`` (built with the same constructor arguments), holding
    its weights, in eval mode. Built from shapes (``nnx.eval_shape``), as parity's own twins
    are: ``torch_to_flax`` is strict and sets every variable, and a random init would compile
    an initializer for each new shape only to be overwritten."""
    from parity import torch_to_flax

    model = nnx.eval_shape(lambda: flax_cls(*args, **kwargs, rngs=nnx.Rngs(0)))
    torch_to_flax(torch_module.state_dict(), model)
    model.eval()
    return model


@pytest.fixture
def ctrl_c_raises():
    """Python's default SIGINT handler (KeyboardInterrupt) for the test, as a shell gives a
    command: pytest-xdist's workers ignore SIGINT, and a held signal goes to the handler it
    would have reached, ignored there too."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
