"""Build and load the launch cache's hit in C (``_hit.c``, ``HAL_KERNELS_NATIVE``).

``_hit.c`` (beside this file) is compiled at first use into a CPython extension module with the
C compiler on ``PATH`` and Python's headers (``hal.spi.native``), and kept in hal's verified
compile cache (``hal.spi.compile_cache``): later processes load it from there (a few milliseconds). Without a
compiler or headers, or when the build fails, :func:`load` returns None, the reason is logged
once (logger ``hal.kernels``, level INFO) and kept in :func:`unavailable_reason`, and the
launch cache keeps its Python functions (the same checks and effects).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from hal import spi

__all__ = ["MODULE", "load", "unavailable_reason"]

_log = logging.getLogger("hal.kernels")
_SOURCE = Path(__file__).with_name("_hit.c")
#: the extension module's name (its ``PyInit_`` function)
MODULE = "_hal_kernels_hit"
CFLAGS = ("-O2", "-fPIC", "-shared", "-std=gnu11")

_lock = threading.Lock()
_module: Any = None
_reason: str | None = None
_tried = False


def _make() -> Any:
    """Compile ``_hit.c`` (or take it from the compile cache) and import it."""
    cc = spi.native.c_compiler()
    data = spi.native.build(
        _SOURCE,
        name=MODULE,
        mode="ext",
        backend="kernels",
        device="native-hit",
        what="hal.kernels native launch-cache hit",
        compiler={"cc": cc},
        cflags=CFLAGS,
        cc=cc,
    )
    return spi.native.load(data, name=MODULE, mode="ext").lib


def load() -> Any:
    """Return the extension module (``setup``, ``fast1``, ``fast2``), building it at first use.

    None where it cannot be built or loaded (the reason logged once and kept in
    :func:`unavailable_reason`).
    """
    global _module, _reason, _tried
    if _tried:
        return _module
    with _lock:
        if not _tried:
            try:
                _module = _make()
            except Exception as exc:  # noqa: BLE001 - any failure: the Python functions
                _reason = (
                    f"the native launch-cache hit is unavailable ({type(exc).__name__}: {exc}); "
                    "op calls use the Python hit"
                )
                _log.info("%s", _reason)
            _tried = True
    return _module


def unavailable_reason() -> str | None:
    """Why the native hit could not be built or loaded, or None (not tried yet, or loaded)."""
    return _reason
