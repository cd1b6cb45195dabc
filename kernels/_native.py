"""Build and load the launch cache's hit in C (``_hit.c``, ``HAL_KERNELS_NATIVE``).

``_hit.c`` (beside this file) is compiled at first use into a CPython extension module with the
C compiler on ``PATH`` and Python's headers, and kept in hal's verified compile cache
(``hal.spi.compile_cache``): later processes load it from there (a few milliseconds). Without a
compiler or headers, or when the build fails, :func:`load` returns None, the reason is logged
once (logger ``hal.kernels``, level INFO) and kept in :func:`unavailable_reason`, and the
launch cache keeps its Python functions (the same checks and effects).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
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


def _compiler() -> str:
    for cand in ("cc", "gcc", "clang"):
        path = shutil.which(cand)
        if path:
            return path
    raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")


def _build(tmp: str) -> bytes:
    """Compile ``_hit.c``, or take it from the compile cache."""
    source = _SOURCE.read_text(encoding="utf-8")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python.h in {include} (install the Python headers)")
    cc = _compiler()
    info = {
        "cc": cc,
        "cflags": " ".join(CFLAGS),
        "python": f"{sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}",
    }
    cache = spi.compile_cache
    key = cache.cache_key(
        source=source, options=[], backend="kernels", device="native-hit", compiler=info
    )
    hit = cache.load(key)
    if hit is not None:
        return hit
    out = os.path.join(tmp, "hit.so")
    cmd = [cc, *CFLAGS, f"-I{include}", str(_SOURCE), "-o", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        log = proc.stderr + proc.stdout
        first = next((ln for ln in log.splitlines() if "error" in ln), log.strip()[:200])
        raise RuntimeError(f"{os.path.basename(cc)} failed on _hit.c: {first.strip()}")
    data = Path(out).read_bytes()
    cache.store(key, data, {"what": "hal.kernels native launch-cache hit", "kernels": []})
    return data


def _make() -> Any:
    with tempfile.TemporaryDirectory(prefix="hal-kernels-hit-") as tmp:
        data = _build(tmp)
        path = os.path.join(tmp, MODULE + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
        Path(path).write_bytes(data)
        loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
        spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
        if spec is None:  # pragma: no cover - a file path with a loader always has one
            raise RuntimeError(f"cannot load {path} as an extension module")
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module


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
