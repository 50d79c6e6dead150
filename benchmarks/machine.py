"""Where a benchmark figure holds: the CPU, its ISA extensions, cores, memory, library
versions and the GEMM backends each library uses.

A speed ratio between torch and JAX on CPU is mostly a ratio between their GEMMs (MKL /
oneDNN for torch; for JAX what XLA:CPU compiles a dot to, YNNPACK by default in jaxlib 0.10)
on that CPU: the same code's train step measured 1.6x on a Zen 5, 0.87x on an Intel Xeon
and within the run's noise on a Zen 4 (docs/benchmarks.md). So every report carries this
description.
"""

import datetime
import os
import platform
import re

# The flags that decide which GEMM kernels run (/proc/cpuinfo names).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
# AMD's x86 families: 0x19 (25) is Zen 3 / Zen 4, 0x1A (26) Zen 5. Within family 25 the model
# tells them apart, by the ranges Linux uses (arch/x86/kernel/cpu/amd.c, bsp_init_amd): Zen 4
# for 0x10-0x1F (EPYC Genoa: model 17) and 0x60-0xAF, Zen 3 for 0x00-0x0F (EPYC Milan: model
# 1) and 0x20-0x5F.
_AMD_FAMILIES = {23: "Zen / Zen 2", 25: "Zen 3 / Zen 4", 26: "Zen 5"}
_ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0xB0))
_ZEN3_MODELS = (range(0x00, 0x10), range(0x20, 0x60))


def _amd_microarchitecture(family, model):
    if family == 25 and model is not None:
        if any(model in r for r in _ZEN4_MODELS):
            return "Zen 4"
        if any(model in r for r in _ZEN3_MODELS):
            return "Zen 3"
    return _AMD_FAMILIES[family]


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
        out["microarchitecture"] = _amd_microarchitecture(out["family"], out.get("model"))
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
        # The accelerator's model ("NVIDIA H100 80GB HBM3"); "cpu" on a CPU.
        "device_kind": device.device_kind,
        "platform_version": getattr(device.client, "platform_version", None),
        "gemm_kernel": xla_gemm_kernel(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
    }


def xla_gemm_kernel():
    """What XLA compiles a float32 matmul to on the default device, read from the compiled
    HLO: a library fusion's kind or custom call's target (jaxlib 0.10's XLA:CPU gives
    ``__ynn_fusion``, YNNPACK, by default; a GPU gives cuBLAS's), or ``dot`` when XLA emits
    the product itself (Eigen on CPU). Which one runs depends on the jaxlib version and
    XLA_FLAGS, so it is read, not assumed."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((256, 256), jnp.float32)
    text = jax.jit(jnp.matmul).lower(x, x).compile().as_text()
    found = re.search(r'"kind":"(__[^"]+)"', text) or re.search(r'custom_call_target="([^"]+)"', text)
    return found.group(1) if found else "dot"


def usable_cores():
    """The cores this process may run on (its affinity: taskset, a container's cpuset), which
    can be fewer than ``os.cpu_count()``, the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def describe():
    """The whole machine description, for the report's header and its JSON."""
    return {"cpu": cpuinfo(), "cores": usable_cores(), "memory_gib": _mem_total_gib(), "python": platform.python_version(),
            "os": platform.platform(), "torch": torch_backends(), "jax": jax_backends()}


def date_utc():
    """Now, as every report and tool heads its figures: '2026-11-27 21:40 UTC'."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def one_line(m):
    """'AMD EPYC (family 26, model 2, Zen 5; avx2 avx512f ...), 2 cores, 7.8 GiB' for a header."""
    c = m["cpu"]
    arch = ", ".join(str(x) for x in (f"family {c.get('family')}" if "family" in c else None,
                                      f"model {c.get('model')}" if "model" in c else None,
                                      c.get("microarchitecture")) if x)
    text = f"{c['model_name']} ({arch}; {' '.join(c.get('isa', [])) or 'no AVX2'}), {m['cores']} cores, {m['memory_gib']} GiB"
    t, j = m.get("torch"), m["jax"]
    if j.get("backend", "cpu") != "cpu":  # the figures are the accelerator's: it comes first
        text = f"{len(j['devices'])} x {j.get('device_kind', j['backend'])}; host {text}"
    if t:
        text += f"\ntorch {t['version']} (BLAS {t['blas']}, oneDNN {t['onednn']}, kernels {t['cpu_capability']}, {t['threads']} threads)"
    text += (f"; jax {j['jax']} / jaxlib {j['jaxlib']} ({j['backend']}, XLA {j['platform_version']}, "
             f"matmul kernel {j.get('gemm_kernel', '?')}), flax {j['flax']}")
    return text
