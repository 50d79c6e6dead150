"""``python tests/every_process_caches.py ARGS...``: the CLI, as ``python -m flaxformer_mini
ARGS...``, with the processes of a multi-process run sharing their compiled programs.

Two of JAX's rules make process 1 of every test launch compile every program itself:

- JAX writes the persistent compilation cache from process 0 only (sparing shared filesystems
  concurrent writes), so what process 1 compiles alone is never read back;
- on the CPU each process keys its programs apart from the others' (XLA:CPU's topology
  fingerprint differs per process), so neither the cache nor JAX's binary sharing
  (``jax_share_binary_between_hosts``: process 0 compiles a program that spans the processes
  and hands it to the others through the coordination service) finds process 0's program.

Here every process writes the cache, every process keys a program by the devices it runs on
(their ids and processes, alike in every process), and binary sharing is on. Process 1 then
receives each program that spans the processes from process 0 instead of compiling it, and a
configuration launched again (stopped, killed, resumed) reads every process's programs back.
The programs are the ones JAX compiles for the run; only where they come from changes
(docs/testing.md, "Where the time goes"). tests/test_multiprocess.py's library workers import
this module too.
"""

import inspect
import sys
import warnings

# JAX's internal functions below are replaced only where their parameters are the ones these
# copies expect, so that another JAX release runs these tests unchanged, compiling as JAX does.
import jax
import jax._src.compiler as compiler
from jax._src import cache_key, compilation_cache, config

_CACHE_WRITE_PARAMETERS = ["cache_key", "compile_time_secs", "module_name", "backend", "executable", "host_callbacks"]


def _cache_write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
    """JAX's ``_cache_write`` without its process-0 check."""
    if host_callbacks or compile_time_secs < config.persistent_cache_min_compile_time_secs.value:
        return  # JAX's own rules: host callbacks are baked into the program; short compiles are left out
    try:
        compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend, int(compile_time_secs))
    except Exception as e:  # as JAX does: a cache that cannot be written costs a compilation, not the run
        warnings.warn(f"Error writing persistent compilation cache entry for '{module_name}': {type(e).__name__}: {e}")


def _hash_accelerator_config(hash_obj, accelerators):
    """The devices a program runs on, hashed alike in every process of a run (JAX's own hashes
    the topology this process sees)."""
    for device in accelerators.flat:
        hash_obj.update(f"{device.platform}:{device.device_kind}:{device.id}:{device.process_index};".encode())


def _parameters(function):
    return list(inspect.signature(function).parameters) if callable(function) else None


if _parameters(getattr(compiler, "_cache_write", None)) == _CACHE_WRITE_PARAMETERS:
    compiler._cache_write = _cache_write
if _parameters(getattr(cache_key, "_hash_accelerator_config", None)) == ["hash_obj", "accelerators"]:
    cache_key._hash_accelerator_config = _hash_accelerator_config
    jax.config.update("jax_share_binary_between_hosts", True)

if __name__ == "__main__":
    from flaxformer_mini.cli.main import main

    sys.exit(main())
