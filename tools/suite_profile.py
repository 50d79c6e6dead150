"""Where the test suite's time goes: a pytest plugin, and a summary of what it wrote.

    SUITE_PROFILE_OUT=DIR PYTHONPATH=. python -m pytest -n 2 -p tools.suite_profile
    python -m tools.suite_profile DIR

The plugin writes one JSON file per pytest worker into DIR: for each test its wall time and
the CPU time of the worker and of the processes it waited for (``getrusage``'s children: a
process the test started and reaped), and for each XLA compilation the worker asked for its
program's name, whether the persistent cache held it, and the worker's CPU time meanwhile
(XLA compiles on threads of its own, so the calling thread's time would miss it). The summary
prints the files and the programs that cost the most. Numbers from it belong in
docs/testing.md with the machine they were measured on.
"""

import argparse
import collections
import glob
import json
import os
import resource
import sys
import time

import pytest

OUT_ENV = "SUITE_PROFILE_OUT"
SMALL_S = 0.3  # a compilation under this much CPU: an eager operation or a random init, mostly

_tests = []  # (nodeid, wall s, worker CPU s, children's CPU s)
_compiles = []  # (nodeid, program name, 1 if read from the persistent cache else 0, CPU s)
_current = {"test": ""}


def _cpu():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _record_compilations():
    # jax._src.compiler is JAX's internal module: its cache-hit and cache-miss loggers are the
    # only place that says which program a compile request was and whether the cache held it.
    import jax._src.compiler as compiler

    compile_or_get_cached = compiler.compile_or_get_cached
    outcome = {}
    hit, miss = compiler.log_persistent_cache_hit, compiler.log_persistent_cache_miss

    def on_hit(name, key):
        outcome["hit"] = 1
        return hit(name, key)

    def on_miss(name, key):
        outcome["hit"] = 0
        return miss(name, key)

    def recorded(backend, computation, *args, **kwargs):
        outcome.clear()
        start = time.process_time()
        try:
            return compile_or_get_cached(backend, computation, *args, **kwargs)
        finally:
            name = str(computation.operation.attributes["sym_name"]).strip('"')
            _compiles.append((_current["test"], name, outcome.get("hit", 0), time.process_time() - start))

    compiler.log_persistent_cache_hit, compiler.log_persistent_cache_miss = on_hit, on_miss
    compiler.compile_or_get_cached = recorded


def pytest_configure(config):
    out = os.environ.get(OUT_ENV)
    # The summary reads every file in the directory: one from an earlier run would be merged in.
    # The controller checks (an xdist worker starts after it, and its own file is not there yet).
    if out and "PYTEST_XDIST_WORKER" not in os.environ and os.path.isdir(out) and os.listdir(out):
        raise pytest.UsageError(f"{OUT_ENV}={out}: holds files of an earlier run, which the summary would "
                                "merge into this one; give a new or empty directory")
    if out:
        _record_compilations()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current["test"] = item.nodeid
    (own, children), start = _cpu(), time.perf_counter()
    yield
    own_after, children_after = _cpu()
    _tests.append((item.nodeid, time.perf_counter() - start, own_after - own, children_after - children))


def pytest_sessionfinish():  # pytest passes only the arguments a hook names
    out = os.environ.get(OUT_ENV)
    if not out or not _tests:
        return
    os.makedirs(out, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(out, f"{worker}.json"), "w") as f:
        json.dump({"tests": _tests, "compiles": _compiles}, f)


def summarize(directory, top=25):
    tests, compiles = [], []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
            tests += data["tests"]
            compiles += data["compiles"]
        except (ValueError, KeyError, TypeError) as e:  # a worker killed while writing, or another JSON
            sys.exit(f"{path}: not a whole profile file ({type(e).__name__}: {e})")
    if not tests:
        sys.exit(f"{directory}: no profile files (run pytest with {OUT_ENV}={directory} -p tools.suite_profile)")
    by_file = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for nodeid, wall, own, children in tests:
        row = by_file[nodeid.split("::")[0]]
        row[0] += 1
        row[1] += wall
        row[2] += own
        row[3] += children
    print(f"{len(tests)} tests: wall {sum(t[1] for t in tests):.0f} s summed, workers' CPU "
          f"{sum(t[2] for t in tests):.0f} s, their children's {sum(t[3] for t in tests):.0f} s")
    for name, (n, wall, own, children) in sorted(by_file.items(), key=lambda kv: -(kv[1][2] + kv[1][3]))[:top]:
        print(f"  {own + children:7.1f} s CPU ({children:6.1f} in children) {wall:7.1f} s wall {n:4d} tests  {name}")
    missed = [c for c in compiles if not c[2]]
    large = [c for c in missed if c[3] > SMALL_S]
    print(f"{len(compiles)} compile requests, {len(missed)} compiled ({sum(c[3] for c in missed):.0f} s CPU), "
          f"{len(large)} of them over {SMALL_S} s ({sum(c[3] for c in large):.0f} s), "
          f"{len(compiles) - len(missed)} read from the cache ({sum(c[3] for c in compiles if c[2]):.0f} s)")
    by_program = collections.defaultdict(lambda: [0, 0.0])
    for _, name, _, cpu in large:
        by_program[name][0] += 1
        by_program[name][1] += cpu
    for name, (n, cpu) in sorted(by_program.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {cpu:7.1f} s CPU {n:4d} compilations  {name}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.suite_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help=f"the directory {OUT_ENV} named")
    parser.add_argument("--top", type=int, default=25, help="rows per table (default 25)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.directory):
        parser.error(f"directory {args.directory}: is not a directory")
    if args.top < 1:
        parser.error(f"--top must be >= 1, got {args.top}")
    summarize(args.directory, args.top)


if __name__ == "__main__":
    main()
