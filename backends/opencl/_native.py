"""The OpenCL backend's native launch helper: a prepared launch in one C call (``HAL_OPENCL_NATIVE``).

``_launch.c`` (beside this file) is built at first use, as a cffi extension module (API mode:
the cheapest calls) or, where Python's headers are missing, as a plain library opened with
cffi's ABI mode, by ``hal.spi.native`` and kept in hal's verified compile cache
(``hal.spi.compile_cache``). It needs no OpenCL headers and links nothing: :func:`helper`
hands it the ICD loader PyOpenCL loaded (``clSetKernelArg``, ``clEnqueueNDRangeKernel``,
``clFlush`` looked up there), and it works on PyOpenCL's own handles (``int_ptr``).

A prepared launch (``_kernels.bind``) then costs one C call: the arguments that changed since
the launcher's previous launch are set and the kernel is enqueued *with no event* (PyOpenCL
makes and frees a ``cl.Event`` per enqueue). The stream counts those launches: its query and
synchronize enqueue one marker after them (``OpenCLStream._mark``), which completes after them
on the in-order queue and carries a failure of any of them (drivers mark later commands failed).

Without a C compiler or cffi, without the loader's library, or when the build fails,
:func:`helper` returns None, the reason is logged once (logger ``hal.backends.opencl``, level
INFO) and kept in :func:`unavailable_reason` (``hal info`` shows it as the devices'
``native_launch`` property), and launches take PyOpenCL's calls. ``HAL_OPENCL_NATIVE=0`` asks
for those.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import Any

from hal import spi

__all__ = ["CDEF", "FREED", "Helper", "helper", "library_path", "unavailable_reason"]

_log = logging.getLogger("hal.backends.opencl")

CDEF = """
typedef struct hal_ocl_launch hal_ocl_launch;
int hal_ocl_init(const char *);
hal_ocl_launch *hal_ocl_new(uintptr_t, uintptr_t, uint64_t *, unsigned, const size_t *,
                            const size_t *, int, int, const int *, const int *);
int hal_ocl_params(hal_ocl_launch *, int, const int *);
void hal_ocl_free(hal_ocl_launch *);
uintptr_t hal_ocl_pyfast(void);
int hal_ocl_run(hal_ocl_launch *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                int64_t, int64_t, double, double);
"""

#: ``hal_ocl_run``'s answer when an argument's memory is freed (nothing was enqueued)
FREED = 1
#: argument kinds of ``hal_ocl_new`` (``_launch.c``): a cl_mem, an int64, a double
K_MEM, K_I64, K_F64 = 0, 1, 2
#: value slots of ``hal_ocl_run``: integers (cl_mem handles, offsets, int64 scalars), doubles
INTS, DOUBLES = 8, 2
MAX_ARGS = 16

CFLAGS = ("-O2", "-fPIC", "-shared", "-std=gnu11", "-pthread")
#: ... plus, for the extension module, the full C API (not cffi's default limited one: the
#: CPython entry of _launch.c is a METH_FASTCALL builtin)
API_CFLAGS = ("-D_CFFI_NO_LIMITED_API",)
_SOURCE = Path(__file__).with_name("_launch.c")
_MODULE = "_hal_opencl_launch"


class Helper:
    """The loaded helper: ``ffi``, ``lib`` and how it was built (``"api"`` or ``"abi"``)."""

    def __init__(self, ffi: Any, lib: Any, mode: str, library: str) -> None:
        self.ffi = ffi
        self.lib = lib
        self.mode = mode
        self.library = library  # the ICD loader's path (PyOpenCL's)
        #: ``make(state)``: a launcher as a CPython builtin bound to ``state`` (``_launch.c``),
        #: without cffi's GIL release, argument conversion or a Python frame; None in ABI mode
        self.make: Any = None
        if mode == "api":
            address = lib.hal_ocl_pyfast()
            if address:
                import ctypes

                self.make = ctypes.cast(address, ctypes.py_object).value


_lock = threading.Lock()
_helper: Helper | None = None
_reason: str | None = None
_tried = False


def library_path() -> str | None:
    """Return the path of the OpenCL ICD loader PyOpenCL loaded, or None where it is not found."""
    import pyopencl._cl  # noqa: F401 - loads the library

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.rstrip("\n").partition("/")[2]
                if path and "libOpenCL" in os.path.basename(path):
                    return "/" + path
    except OSError:
        pass
    import ctypes.util

    return ctypes.util.find_library("OpenCL")


def _build(mode: str) -> bytes:
    """Compile the helper in ``mode`` (``api``/``abi``), or take it from the compile cache."""
    import cffi

    cc = spi.native.c_compiler()
    return spi.native.build(
        _SOURCE,
        name=_MODULE,
        mode=mode,
        backend="opencl",
        device=f"native-launch-{mode}",
        what=f"opencl native launch helper ({mode})",
        compiler={"cc": cc, "mode": mode, "cffi": cffi.__version__},
        cflags=(*CFLAGS, *API_CFLAGS) if mode == "api" else CFLAGS,
        libs=("-ldl",),
        cc=cc,
        ffi=cffi.FFI,
        cdef=CDEF,
    )


def _open(mode: str) -> spi.native.NativeLib:
    """Build (or take from the compile cache) and load the helper in ``mode``."""
    import cffi

    return spi.native.load(_build(mode), name=_MODULE, mode=mode, ffi=cffi.FFI, cdef=CDEF)


def _make(only: str | None = None) -> Helper:
    """Build and load the helper: the extension module, else the ABI library (``only``: that one)."""
    if importlib.util.find_spec("cffi") is None:
        raise RuntimeError("cffi is not installed (pip install cffi)")
    library = library_path()
    if not library:
        raise RuntimeError("the OpenCL ICD loader PyOpenCL uses was not found")
    try:
        n = _open(only or "api")
    except Exception as exc:  # noqa: BLE001 - no Python headers: the ABI library
        if only is not None:
            raise
        _log.info("opencl native launch: the extension module failed (%s); using ABI mode", exc)
        n = _open("abi")
    rc = n.lib.hal_ocl_init(library.encode())
    if rc != 0:
        raise RuntimeError(f"cannot open the OpenCL entry points in {library} (code {rc})")
    return Helper(n.ffi, n.lib, n.mode, library)


def helper() -> Helper | None:
    """Return the native launch helper, building it at first use; None where it cannot be used.

    None with ``HAL_OPENCL_NATIVE=0`` (asked on every call; streams read it when created) and
    where the helper cannot be built or loaded (the reason logged once and kept in
    :func:`unavailable_reason`).

    Raises:
        hal.ConfigError: ``HAL_OPENCL_NATIVE`` is not a switch.
    """
    global _helper, _reason, _tried
    if not spi.setting("HAL_OPENCL_NATIVE"):
        return None
    if _tried:
        return _helper
    with _lock:
        if _tried:
            return _helper
        try:
            _helper = _make()
        except Exception as exc:  # noqa: BLE001 - any failure: PyOpenCL's calls
            _reason = (
                f"the native launch helper is unavailable ({type(exc).__name__}: {exc}); "
                "kernel launches use PyOpenCL's calls"
            )
            _log.info("%s", _reason)
        _tried = True
        return _helper


def unavailable_reason() -> str | None:
    """Why the native helper is not in use (``HAL_OPENCL_NATIVE=0``, or its build failed), or None."""
    if not spi.setting("HAL_OPENCL_NATIVE"):
        return "HAL_OPENCL_NATIVE=0"
    return _reason
