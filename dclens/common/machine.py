"""Facts about this machine that decide TensorFlow's float32 bits and speed: the CPU's
model and vector extensions, and whether oneDNN is on.  Benchmarks and reports record
them beside every figure."""

from __future__ import annotations

import platform


def onednn_enabled() -> bool | None:
    """Whether TF's oneDNN CPU optimisations are on in this process, if it can be told.

    TF exposes no public query; ``tensorflow.python.util._pywrap_util_port.IsMklEnabled``
    reports it (it accounts for ``TF_ENABLE_ONEDNN_OPTS`` and the CPU default).  Returns
    None if that private function is missing in this TF build.
    """
    try:
        from tensorflow.python.util import _pywrap_util_port  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    is_enabled = getattr(_pywrap_util_port, "IsMklEnabled", None)
    return None if is_enabled is None else bool(is_enabled())


def cpu_vector_extensions() -> list[str]:
    """The CPU's SIMD extensions that matter to TF's kernels (from /proc/cpuinfo; [] if
    that file is not there)."""
    interesting = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                   "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [name for name in interesting if name in flags]
    except OSError:
        pass
    return []


def cpu_model_name() -> str:
    """The CPU's model name (from /proc/cpuinfo, else the platform's processor string)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
