"""Native modules: a C source compiled at first use, kept in the compile cache, loaded from it.

Public for plugins as ``hal.spi.native`` (:func:`build`, :func:`load`, :func:`c_compiler`,
:func:`compiler_version`, :class:`NativeLib`). The CPU emulator's stream runtime, the OpenCL
backend's launch helper, hal.kernels' launch-cache hit and hal.comm's shared-memory engine are
built this way; a vendor backend with C code of its own can be too. A module is built in one of three modes:

- ``"ext"``: the C file is a CPython extension module of its own (it defines ``PyInit_<name>``),
  compiled against Python's headers and imported;
- ``"api"``: cffi's API mode: cffi generates an extension module named ``name`` from the
  declarations (``cdef``) and the C file, compiled against Python's headers (the cheapest calls);
- ``"abi"``: cffi's ABI mode: the C file is a plain shared library, opened with ``ffi.dlopen``
  (no Python headers needed).

Each build is looked up in hal's verified compile cache (``hal.spi.compile_cache``, the key
names the source, the flags, the caller's backend/device/compiler identity and, where Python's
headers are used, the interpreter's ABI) and stored there, so later processes only load it. A
binary is loaded from a private temporary copy, removed once loaded.

hal core never imports cffi: the modes that need it take the caller's ``cffi.FFI`` class
(``ffi=cffi.FFI``), which the caller imports when it builds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.machinery
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, final

from hal import _cache

__all__ = ["MODES", "NativeLib", "build", "c_compiler", "compiler_version", "load"]

#: The build modes (see the module's docstring).
MODES = ("ext", "api", "abi")


@final
@dataclasses.dataclass(frozen=True)
class NativeLib:
    """A loaded native module.

    Attributes:
        mode: how it was built (``"ext"``, ``"api"`` or ``"abi"``).
        lib: what to call: the extension module itself (``"ext"``), cffi's ``lib`` (``"api"``:
            the generated module's, ``"abi"``: the opened library's).
        ffi: cffi's ``ffi`` that goes with ``lib`` (``"api"``, ``"abi"``); None for ``"ext"``.
    """

    mode: str
    lib: Any
    ffi: Any = None


def c_compiler() -> str:
    """Return the path of the C compiler on ``PATH``: ``cc``, else ``gcc``, else ``clang``.

    Raises:
        RuntimeError: none of them is on ``PATH``.
    """
    for cand in ("cc", "gcc", "clang"):
        path = shutil.which(cand)
        if path:
            return path
    raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")


@functools.lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    """Return the first line of ``cc --version``, the compiler's identity for a cache key.

    ``"unknown"`` where the compiler cannot run or prints nothing. Asked once per compiler
    path in a process.
    """
    try:
        out = subprocess.run(
            [cc, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        return out.stdout.splitlines()[0].strip() if out.stdout else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _check_mode(mode: str, ffi: Callable[[], Any] | None) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not one of {', '.join(MODES)}")
    if mode != "ext" and ffi is None:
        raise ValueError(f"mode={mode!r} needs ffi= (the cffi.FFI class)")


def _python_include() -> str:
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python.h in {include} (install the Python headers)")
    return include


def _ext_suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def _compile(cmd: list[str], target: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        log = proc.stderr + proc.stdout
        first = next((ln for ln in log.splitlines() if "error" in ln), log.strip()[:200])
        raise RuntimeError(f"{os.path.basename(cmd[0])} failed on {target}: {first.strip()}")


def build(
    source: Path,
    *,
    name: str,
    mode: str,
    backend: str,
    device: str,
    what: str,
    compiler: Mapping[str, str],
    cflags: Sequence[str] = ("-O2", "-fPIC", "-shared", "-std=gnu11"),
    libs: Sequence[str] = (),
    cc: str | None = None,
    ffi: Callable[[], Any] | None = None,
    cdef: str = "",
) -> bytes:
    """Compile the C file ``source`` into a native module, or take it from the compile cache.

    Parameters:
        source: the C file.
        name: the module's name: its ``PyInit_<name>`` (``"ext"``), cffi's ``set_source`` name
            (``"api"``); give the same to :func:`load`.
        mode: ``"ext"``, ``"api"`` or ``"abi"`` (see :mod:`hal.spi.native`).
        backend, device: the compile-cache key's backend and device fields (e.g. your
            backend's name and what the module is, with the mode in it).
        what: a description, stored with the cache entry.
        compiler: the toolchain's identity for the cache key (e.g. ``{"cc": cc}``); the flags
            and, where Python's headers are used, the interpreter's ABI are added to it.
        cflags: the compiler's flags (all of them: add cffi's ``-D_CFFI_NO_LIMITED_API`` for an
            ``"api"`` module whose C code uses CPython's full API).
        libs: linker arguments after the output (``-ldl`` ...).
        cc: the C compiler; default :func:`c_compiler`.
        ffi: the ``cffi.FFI`` class (``"api"`` and ``"abi"``; hal core does not import cffi).
        cdef: cffi's declarations of the C functions (``"api"``: those it binds).

    Raises:
        ValueError: ``mode`` is none of the three, or needs ``ffi``.
        RuntimeError: no C compiler, no Python headers (``"ext"``, ``"api"``), or the compiler
            failed (its first error line in the message).
        OSError, subprocess.SubprocessError: the compiler could not run.
    """
    _check_mode(mode, ffi)
    text = source.read_text(encoding="utf-8")
    include = _python_include() if mode != "abi" else ""
    cc = cc or c_compiler()
    info = {**compiler, "cflags": " ".join(cflags)}
    if include:
        info["python"] = f"{sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}"
    key = _cache.cache_key(source=text, options=[], backend=backend, device=device, compiler=info)
    hit = _cache.load(key)
    if hit is not None:
        return hit
    with tempfile.TemporaryDirectory(prefix=f"hal-build-{name}-") as tmp:
        out = os.path.join(tmp, f"{name}.so")
        if mode == "api":
            assert ffi is not None
            maker = ffi()
            maker.cdef(cdef)
            maker.set_source(name, text)
            gen = os.path.join(tmp, f"{name}.c")
            with contextlib.redirect_stdout(io.StringIO()):  # cffi says "generating ..."
                maker.emit_c_code(gen)
            _compile(
                [cc, *cflags, f"-I{include}", gen, "-o", out, *libs],
                f"the cffi module of {source.name}",
            )
        else:
            head = [f"-I{include}"] if include else []
            _compile([cc, *cflags, *head, str(source), "-o", out, *libs], source.name)
        data = Path(out).read_bytes()
    _cache.store(key, data, {"what": what, "backend": backend, "device": device, "kernels": []})
    return data


def load(
    binary: bytes,
    *,
    name: str,
    mode: str,
    ffi: Callable[[], Any] | None = None,
    cdef: str = "",
) -> NativeLib:
    """Load a module :func:`build` returned, from a private temporary copy (removed once loaded).

    Parameters:
        binary: the module's bytes.
        name, mode: as given to :func:`build`.
        ffi: the ``cffi.FFI`` class (``"abi"``: the library is opened with a fresh one).
        cdef: cffi's declarations of the library's functions (``"abi"``).

    Raises:
        ValueError: ``mode`` is none of the three, or needs ``ffi``.
        ImportError, OSError: the module could not be loaded.
    """
    _check_mode(mode, ffi)
    with tempfile.TemporaryDirectory(prefix=f"hal-load-{name}-") as tmp:
        path = os.path.join(tmp, name + (_ext_suffix() if mode != "abi" else ".so"))
        Path(path).write_bytes(binary)
        if mode == "abi":
            assert ffi is not None
            opener = ffi()
            opener.cdef(cdef)
            return NativeLib(mode, opener.dlopen(path), opener)
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        if spec is None:  # pragma: no cover - a file path with a loader always has one
            raise ImportError(f"cannot load {path} as an extension module")
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        if mode == "api":
            return NativeLib(mode, module.lib, module.ffi)
        return NativeLib(mode, module)
