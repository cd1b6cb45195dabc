"""The extension API of hal.kernels: registries, op definitions and kernel registration hooks.

hal.kernels' user API (the ops, :func:`hal.kernels.compile`, dispatch records, the compile
cache) is :mod:`hal.kernels`; this module is for backends, vendor plugins and the layers
built on hal.kernels:

- **dedicated kernels**: a plugin's ``hal_register_kernels(registry)`` hook receives the
  :class:`KernelRegistry` and calls ``registry.add(op, backend, impl, dtypes=...)``; ``impl``
  gets an :class:`OpCall` and enqueues on ``call.stream``. A backend compiles portable
  kernels for it with ``registry.compile(...)`` (backends never import hal.kernels).
  In-process: :func:`register`; the process-wide registry: :func:`registry`.
- **op definitions**: :data:`OPS` (each an :class:`OpSpec`: dtypes, tolerances),
  :data:`IMPLEMENTATIONS` (the routes, in preference order), :func:`reference` (the NumPy
  reference of an op), :func:`define_op` (add an elementwise op from outside hal).
- **the portable language**: :data:`DIALECTS`, :func:`parse_kernels` (signatures),
  :func:`dialect_of` (a device's dialect).
- **upper layers**: ``with internal():`` marks op calls made by a library on behalf of its
  user (hal.comm's reduction steps), which never count as the user's fallbacks.

See docs/kernels.md, "Writing an op" and "Dedicated kernels from a plugin".
"""

from hal.kernels._builtin import plugin_system
from hal.kernels._custom import define_op
from hal.kernels._dispatch import (
    IMPLEMENTATIONS,
    Impl,
    KernelRegistry,
    OpCall,
    internal,
    register,
    registry,
)
from hal.kernels._language import DIALECTS, parse_kernels
from hal.kernels._ops import ACCUMULATE_OPS, OPS, OpSpec
from hal.kernels._program import dialect_of
from hal.kernels._reference import reference

__all__ = [
    "ACCUMULATE_OPS",
    "DIALECTS",
    "IMPLEMENTATIONS",
    "OPS",
    "Impl",
    "KernelRegistry",
    "OpCall",
    "OpSpec",
    "define_op",
    "dialect_of",
    "internal",
    "parse_kernels",
    "plugin_system",
    "reference",
    "register",
    "registry",
]
