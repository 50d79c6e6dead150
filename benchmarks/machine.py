"""Where a benchmark figure holds: the CPU, its ISA extensions, cores, memory, library
versions and the GEMM backends each library uses.

A speed ratio between torch and JAX on CPU is mostly a ratio between their GEMMs (MKL /
oneDNN for torch, XLA:CPU's own for JAX) on that CPU: the same code measured 1.13x on a Zen 4
and 1.6x on a Zen 5 (docs/benchmarks.md). So every report carries this description.
"""

import os
import platform
import re

# The flags that decide which GEMM kernels run (/proc/cpuinfo names).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
# AMD's x86 families: 0x19 (25) is Zen 3 / Zen 4, 0x1A (26) Zen 5.
_AMD_FAMILIES = {23: "Zen / Zen 2", 25: "Zen 3 / Zen 4", 26: "Zen 5"}


def cpuinfo(text=None):
    """Model name, vendor, family, model, stepping and the ``ISA_FLAGS`` present, from
    /proc/cpuinfo's first processor (``text`` for tests)."""
    if text is None:
        try:
            with open("/proc/cpuinfo") as f:
                text = f.read()
        except OSError:
            return {"model_name": platform.processor() or platform.machine()}
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    out = {"model_name": fields.get("model name", platform.machine()), "vendor": fields.get("vendor_id")}
    for key in ("cpu family", "model", "stepping"):
        if fields.get(key, "").isdigit():
            out[key.replace("cpu ", "")] = int(fields[key])
    flags = set(fields.get("flags", "").split())
    out["isa"] = [f for f in ISA_FLAGS if f in flags]
    if out.get("vendor") == "AuthenticAMD" and out.get("family") in _AMD_FAMILIES:
        out["microarchitecture"] = _AMD_FAMILIES[out["family"]]
    return out


def _mem_total_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def torch_backends():
    """torch's version, threads, BLAS/LAPACK (from ``torch.__config__.show()``), oneDNN and
    the CPU kernels' ISA level; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    onednn = re.search(r"MKL-DNN (v[\d.]+)", config)
    return {
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "blas": blas.group(1) if blas else None,
        "mkl": torch.backends.mkl.is_available(),
        "onednn": (onednn.group(1) if onednn else True) if torch.backends.mkldnn.is_available() else None,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def jax_backends():
    import flax
    import jax
    import jaxlib

    device = jax.devices()[0]
    return {
        "jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
        "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
        "platform_version": getattr(device.client, "platform_version", None),
        # XLA:CPU lowers dots to its own kernels (Eigen contractions, or oneDNN/YNNPACK when
        # XLA_FLAGS turn them on); the flags say which.
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
    }


def describe():
    """The whole machine description, for the report's header and its JSON."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {"cpu": cpuinfo(), "cores": cores, "memory_gib": _mem_total_gib(), "python": platform.python_version(),
            "os": platform.platform(), "torch": torch_backends(), "jax": jax_backends()}


def one_line(m):
    """'AMD EPYC (family 26, model 2, Zen 5; avx2 avx512f ...), 2 cores, 7.8 GiB' for a header."""
    c = m["cpu"]
    arch = ", ".join(str(x) for x in (f"family {c.get('family')}" if "family" in c else None,
                                      f"model {c.get('model')}" if "model" in c else None,
                                      c.get("microarchitecture")) if x)
    text = f"{c['model_name']} ({arch}; {' '.join(c.get('isa', [])) or 'no AVX2'}), {m['cores']} cores, {m['memory_gib']} GiB"
    t, j = m.get("torch"), m["jax"]
    if t:
        text += f"\ntorch {t['version']} (BLAS {t['blas']}, oneDNN {t['onednn']}, kernels {t['cpu_capability']}, {t['threads']} threads)"
    text += f"; jax {j['jax']} / jaxlib {j['jaxlib']} ({j['backend']}, XLA {j['platform_version']}), flax {j['flax']}"
    return text
