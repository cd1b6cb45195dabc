"""hal.kernels' compile cache: the verified on-disk cache of core (``hal.spi.compile_cache``).

The cache lives in core because backends and hal.comm compile native code into it too (the
CPU emulator's native runtime, hal.comm's native engine), and backends sit below hal.kernels.
This module re-exports it for hal.kernels (:func:`hal.kernels.cache_info`,
:func:`hal.kernels.clear_cache` ...) and hands the cache hal.kernels' settings in force:
:class:`hal.kernels.KernelOptions` ``cache_dir`` / ``cache_max_bytes`` (code > environment >
default).
"""

from __future__ import annotations

from hal.kernels._options import options as kernel_options
from hal.spi import compile_cache as _store

__all__ = [
    "CacheInfo",
    "cache_dir",
    "cache_info",
    "cache_key",
    "clear_cache",
    "evict",
    "load",
    "max_bytes",
    "store",
]

CacheInfo = _store.CacheInfo
cache_dir = _store.cache_dir
cache_info = _store.cache_info
cache_key = _store.cache_key
clear_cache = _store.clear_cache
evict = _store.evict
load = _store.load
max_bytes = _store.max_bytes
store = _store.store


def _options() -> tuple[str | None, int | None]:
    opts = kernel_options()
    return opts.cache_dir, opts.cache_max_bytes


_store.set_options_source(_options)
