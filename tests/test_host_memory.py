"""keep_freed_memory(): freed host memory is reused, so repeated XLA calls stop page-faulting.

Each case runs in a fresh interpreter: the setting is process-wide and must come before
XLA starts its threads, as it does in ``flaxformer-mini`` and ``python -m benchmarks``.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from flaxformer_mini import host_memory  # only its constants: calling it here would change pytest's allocator

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt's settings are glibc's")

# A jitted call whose 64 MiB output buffer XLA allocates afresh on every call: the same
# pattern as the train step's temporaries, at a size glibc would serve with mmap.
_PROBE = textwrap.dedent("""
    import json, resource, sys, time
    from flaxformer_mini.host_memory import applied as is_applied, keep_freed_memory
    applied = keep_freed_memory()
    assert keep_freed_memory() == applied == is_applied()  # a second call changes nothing
    import jax, jax.numpy as jnp
    f = jax.jit(lambda x: x * 2.0)
    x = jnp.ones((16 * 2**20,), jnp.float32)  # 64 MiB
    faults = []
    for _ in range(12):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        y = f(x).block_until_ready()
        del y
        time.sleep(0.05)  # JAX frees a deleted array's buffer asynchronously
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"applied": applied, "faults": faults}))
""")

PAGES_64MIB = 16 * 2**20 * 4 // 4096  # 16384 pages of 4 KiB


def _probe(switch):
    env = dict(os.environ, **{host_memory.ENV_SWITCH: switch})
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_repeated_calls_reuse_memory_instead_of_faulting_it_in():
    result = _probe("1")
    assert result["applied"] is True
    # The first few outputs of a fresh jitted function stay alive a while (measured: the
    # heap grew for 3 to 6 calls, 16384 faults each, then never again), so look at the
    # steady state: each call's buffer is made of pages an earlier call freed, a few
    # faults for XLA's bookkeeping at most, not 16384 fresh pages.
    assert max(result["faults"][-4:]) < PAGES_64MIB // 20, result


@glibc
def test_without_it_every_call_faults_its_buffer_in():
    # The control: glibc's defaults mmap and munmap the 64 MiB buffer on every call, which
    # is what the test above must not see.
    result = _probe("0")
    assert result["applied"] is False
    assert min(result["faults"][-4:]) > PAGES_64MIB * 0.9, result
