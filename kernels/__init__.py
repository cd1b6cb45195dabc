"""Portable kernels and the op library (``hal.kernels``).

- Write a kernel once in the portable language (C with HAL macros; docs/kernels.md),
  :func:`compile` it for any device with ``capabilities.kernels`` and launch it on a
  stream with :meth:`Program.launch`. :func:`translate` shows the code a backend compiles.
- The op library (:func:`add`, :func:`sum`, :func:`matmul`, :func:`softmax` ...) runs a
  *dedicated* implementation registered by a plugin (``hal_register_kernels`` hook), else
  the *generic* one written in the portable language, else a *host* fallback. Every call
  is recorded (:func:`trace`); ``HAL_KERNELS_STRICT=1`` forbids fallbacks.
- :func:`accumulate` and :func:`scale` are the reduction steps of ``hal.comm``.
- :func:`define_op` adds an elementwise op (reference, generic kernel, tolerances); backends
  register dedicated implementations for it like for any op.
"""

from hal.kernels._cache import CacheInfo, cache_dir, cache_info, clear_cache
from hal.kernels._custom import define_op
from hal.kernels._dispatch import (
    IMPLEMENTATIONS,
    DispatchRecord,
    KernelFallbackError,
    KernelRegistry,
    OpCall,
    internal,
    register,
    registry,
    route,
    strict,
    trace,
)
from hal.kernels._language import DIALECTS, parse_kernels
from hal.kernels._language import translate as _translate_dialect
from hal.kernels._ops import (
    ACCUMULATE_OPS,
    OPS,
    OpSpec,
    accumulate,
    add,
    axpy,
    cast,
    div,
    dot,
    exp,
    gelu,
    layernorm,
    matmul,
    max,
    min,
    mul,
    prod,
    relu,
    rmsnorm,
    scale,
    softmax,
    sub,
    sum,
)
from hal.kernels._plan import plan
from hal.kernels._program import Program, cache_stats, compile, dialect_of
from hal.kernels._reference import reference
from hal.spi import KernelBuildError


def translate(source: str, backend: str, *, defines: dict[str, str] | None = None) -> str:
    """Return the exact code ``backend`` compiles for portable ``source``.

    Args:
        source: kernels in the portable language.
        backend: a dialect (``c``, ``opencl``, ``cuda``) or an available backend's name
            (``cpu`` -> ``c``, ``opencl`` -> ``opencl`` ...).
        defines: ``#define`` values put before the source.
    """
    if backend in DIALECTS:
        return _translate_dialect(source, backend, defines=defines)
    import hal

    dialect = dialect_of(hal.device(backend))
    if not dialect:
        raise hal.HalError(f"backend {backend!r} has no kernel capability")
    return _translate_dialect(source, dialect, defines=defines)


__all__ = [
    "ACCUMULATE_OPS",
    "DIALECTS",
    "IMPLEMENTATIONS",
    "OPS",
    "CacheInfo",
    "DispatchRecord",
    "KernelBuildError",
    "KernelFallbackError",
    "KernelRegistry",
    "OpCall",
    "OpSpec",
    "Program",
    "accumulate",
    "add",
    "axpy",
    "cache_dir",
    "cache_info",
    "cache_stats",
    "cast",
    "clear_cache",
    "compile",
    "define_op",
    "dialect_of",
    "div",
    "dot",
    "exp",
    "gelu",
    "internal",
    "layernorm",
    "matmul",
    "max",
    "min",
    "mul",
    "parse_kernels",
    "plan",
    "prod",
    "reference",
    "register",
    "registry",
    "relu",
    "rmsnorm",
    "route",
    "scale",
    "softmax",
    "strict",
    "sub",
    "sum",
    "trace",
    "translate",
]
