"""Portable kernels and the op library (``hal.kernels``).

- Write a kernel once in the portable language (C with HAL macros; docs/kernels.md),
  :func:`compile` it for any device with ``capabilities.kernels`` and launch it on a
  stream with :meth:`Program.launch`. :func:`translate` shows the code a backend compiles.
- The op library (:func:`add`, :func:`sum`, :func:`matmul`, :func:`softmax` ...) runs a
  *dedicated* implementation registered by a plugin (``hal_register_kernels`` hook), else
  the *generic* one written in the portable language, else a *host* fallback. Every call
  is recorded (:func:`trace`); ``HAL_KERNELS_STRICT=1`` forbids fallbacks (:func:`strict`),
  :func:`route` forces one, :func:`plan` shows the route of every op before running it.
- :func:`accumulate` and :func:`scale` are the reduction steps of ``hal.comm``.

This module is the user API. Registering dedicated kernels, defining ops and the op tables
(``KernelRegistry``, ``OpCall``, ``OPS``, ``define_op``, ``register`` ...) are the extension
API, :mod:`hal.kernels.spi`; their old names here work until hal-sdk 2.0, with a warning.
"""

from hal import spi as _hal_spi
from hal.kernels._cache import CacheInfo, cache_dir, cache_info, clear_cache
from hal.kernels._dispatch import (
    DispatchRecord,
    KernelFallbackError,
    route,
    strict,
    trace,
)
from hal.kernels._language import DIALECTS as _DIALECTS
from hal.kernels._language import translate as _translate_dialect
from hal.kernels._ops import (
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
from hal.kernels._options import KernelOptions, configure
from hal.kernels._plan import plan
from hal.kernels._program import Program, cache_stats, compile
from hal.kernels._program import dialect_of as _dialect_of
from hal.spi import KernelBuildError


def translate(source: str, backend: str, *, defines: dict[str, str] | None = None) -> str:
    """Return the exact code ``backend`` compiles for portable ``source``.

    Args:
        source: kernels in the portable language.
        backend: a dialect (``c``, ``opencl``, ``cuda``) or an available backend's name
            (``cpu`` -> ``c``, ``opencl`` -> ``opencl`` ...).
        defines: ``#define`` values put before the source.
    """
    if backend in _DIALECTS:
        return _translate_dialect(source, backend, defines=defines)
    import hal

    dialect = _dialect_of(hal.device(backend))
    if not dialect:
        raise hal.HalError(f"backend {backend!r} has no kernel capability")
    return _translate_dialect(source, dialect, defines=defines)


#: Extension names that moved to :mod:`hal.kernels.spi` in hal-sdk 1.2 (removed here in 2.0).
__getattr__ = _hal_spi.moved_names(
    "hal.kernels",
    "hal.kernels.spi",
    {
        "ACCUMULATE_OPS",
        "DIALECTS",
        "IMPLEMENTATIONS",
        "OPS",
        "KernelRegistry",
        "OpCall",
        "OpSpec",
        "define_op",
        "dialect_of",
        "internal",
        "parse_kernels",
        "reference",
        "register",
        "registry",
    },
)


__all__ = [
    "CacheInfo",
    "DispatchRecord",
    "KernelBuildError",
    "KernelFallbackError",
    "KernelOptions",
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
    "configure",
    "div",
    "dot",
    "exp",
    "gelu",
    "layernorm",
    "matmul",
    "max",
    "min",
    "mul",
    "plan",
    "prod",
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
