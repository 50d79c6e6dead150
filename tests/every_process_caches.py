"""``python tests/every_process_caches.py ARGS...``: the CLI, as ``python -m flaxformer_mini
ARGS...``, with every process of a multi-process run writing JAX's persistent compilation cache.

JAX writes the cache from process 0 only (sparing shared filesystems concurrent writes), and on
the CPU every other process keys its programs apart from process 0's (XLA:CPU's topology
fingerprint differs per process), so process 1 of a test's multi-process run compiled every
program at every launch. The suite launches one configuration again and again (a run stopped,
killed, resumed): with this entry point process 1 reads its own programs back from the second
launch on, as process 0 reads its. The programs are the same ones; only where they come from
changes (docs/testing.md, "Where the time goes").
"""

import inspect
import sys
import warnings

# _cache_write is JAX's internal function: replaced only where its parameters are the ones this
# copy expects, so that another JAX release runs these tests unchanged, compiling as before.
import jax._src.compiler as compiler
from jax._src import compilation_cache, config

_PARAMETERS = ["cache_key", "compile_time_secs", "module_name", "backend", "executable", "host_callbacks"]


def _cache_write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
    """JAX's ``_cache_write`` without its process-0 check."""
    if host_callbacks or compile_time_secs < config.persistent_cache_min_compile_time_secs.value:
        return  # JAX's own rules: host callbacks are baked into the program; short compiles are left out
    try:
        compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend, int(compile_time_secs))
    except Exception as e:  # as JAX does: a cache that cannot be written costs a compilation, not the run
        warnings.warn(f"Error writing persistent compilation cache entry for '{module_name}': {type(e).__name__}: {e}")


if list(inspect.signature(getattr(compiler, "_cache_write", lambda: None)).parameters) == _PARAMETERS:
    compiler._cache_write = _cache_write

if __name__ == "__main__":
    from flaxformer_mini.cli.main import main

    sys.exit(main())
