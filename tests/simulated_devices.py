"""The environment of a worker process that sees ``n`` simulated CPU devices.

The 8-device tests run their checks in one subprocess each: XLA's device count is fixed
when its CPU backend starts, and the pytest worker's backend has started (and must keep
one device, the default of other tests); ``tests/test_sharding.py``'s docstring says more.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker_env(num_devices):
    """``os.environ`` plus CPU only, ``num_devices`` simulated devices and the project on the path
    (``XLA_FLAGS`` keeps the tests' optimisation level: tests/conftest.py)."""
    return dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS"), f"--xla_force_host_platform_device_count={num_devices}"])),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
