"""``tools/suite_profile.py``, the suite's profiling plugin: a pytest run under it records each
test's CPU time and each XLA compilation (its program and whether the persistent cache held
it), and the summary adds them up per file and per program."""

import json
import subprocess
import sys

from helpers import REPO

# A test file for the profiled run: one program compiled, then the same one again in a fresh
# jit (the in-memory cache misses, the persistent one holds it).
PROFILED = """
import jax, jax.numpy as jnp

def test_compiles_one_program_twice():
    f = lambda x: jnp.sin(x) * 3
    jax.jit(f)(jnp.ones(4)).block_until_ready()
    jax.clear_caches()
    jax.jit(f)(jnp.ones(4)).block_until_ready()
"""


def test_a_profiled_run_records_the_tests_cpu_and_which_compilations_the_cache_held(tmp_path):
    (tmp_path / "test_profiled.py").write_text(PROFILED)
    out, cache = tmp_path / "profile", tmp_path / "cache"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "SUITE_PROFILE_OUT": str(out),
           "JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tools.suite_profile",
                           "test_profiled.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    profile = json.loads((out / "main.json").read_text())
    ((nodeid, wall, own, children),) = profile["tests"]
    assert nodeid == "test_profiled.py::test_compiles_one_program_twice"
    assert wall > 0 and own > 0 and children == 0
    runs = [(hit, cpu) for test, name, hit, cpu in profile["compiles"] if name == "jit__lambda"]
    assert [hit for hit, _ in runs] == [0, 1] and all(cpu >= 0 for _, cpu in runs)
    assert {test for test, *_ in profile["compiles"]} == {nodeid}

    summary = subprocess.run([sys.executable, "-m", "tools.suite_profile", str(out)], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr
    assert summary.stdout.startswith("1 tests: wall ") and "test_profiled.py" in summary.stdout
    assert f"{len(profile['compiles'])} compile requests" in summary.stdout


def test_a_directory_without_profiles_is_refused_by_name(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.suite_profile", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"{tmp_path}: no profile files (run pytest with SUITE_PROFILE_OUT={tmp_path} "
                                   "-p tools.suite_profile)")
