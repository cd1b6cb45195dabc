"""hal.spi.native: a C file built into a native module in each mode, kept in the compile cache."""

from __future__ import annotations

import os
import shutil
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hal import spi

cffi = pytest.importorskip("cffi")
native = spi.native

if not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
    pytest.skip("no C compiler on PATH", allow_module_level=True)
HEADERS = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
needs_headers = pytest.mark.skipif(not HEADERS, reason="no Python headers here")

EXT = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *arg) {
    (void)self;
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(2 * v);
}
static PyMethodDef methods[] = {{"twice", twice, METH_O, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_hal_test_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit__hal_test_ext(void) { return PyModule_Create(&mod); }
"""
LIB = "int hal_test_add(int a, int b) { return a + b; }\n"
CDEF = "int hal_test_add(int, int);"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A compile cache of the test's own (``HAL_CACHE_DIR``)."""
    monkeypatch.setenv("HAL_CACHE_DIR", str(tmp_path / "cache"))
    assert spi.compile_cache.cache_dir() == tmp_path / "cache"
    return tmp_path / "cache"


def _entries() -> list[tuple[str | None, str | None]]:
    return [(i["backend"], i["device"]) for i in spi.compile_cache.cache_info().items]


def _build_ext(src: Path, compiler: dict[str, str], cc: str | None = None) -> bytes:
    return native.build(
        src,
        name="_hal_test_ext",
        mode="ext",
        backend="test",
        device="ext",
        what="test ext",
        compiler=compiler,
        cc=cc,
    )


@needs_headers
def test_an_extension_module_is_built_cached_and_imported(tmp_path: Path, cache: Path) -> None:
    src = tmp_path / "ext.c"
    src.write_text(EXT)
    data = _build_ext(src, {"cc": "any"})
    assert _entries() == [("test", "ext")]
    mod = native.load(data, name="_hal_test_ext", mode="ext")
    assert mod.mode == "ext" and mod.ffi is None and mod.lib.twice(21) == 42
    # the second build is the cache's: the compiler is never run
    assert _build_ext(src, {"cc": "any"}, cc="/nonexistent/cc") == data
    # a different compiler identity is another key: this one has to compile, and cannot
    with pytest.raises(FileNotFoundError):
        _build_ext(src, {"cc": "other"}, cc="/nonexistent/cc")


@pytest.mark.parametrize("mode", ["api", "abi"])
def test_a_cffi_module_is_built_and_loaded(tmp_path: Path, cache: Path, mode: str) -> None:
    if mode == "api" and not HEADERS:
        pytest.skip("no Python headers here")
    src = tmp_path / "lib.c"
    src.write_text(LIB)
    data = native.build(
        src,
        name=f"_hal_test_{mode}",
        mode=mode,
        backend="test",
        device=mode,
        what=f"test {mode}",
        compiler={"cffi": cffi.__version__},
        ffi=cffi.FFI,
        cdef=CDEF,
    )
    lib = native.load(data, name=f"_hal_test_{mode}", mode=mode, ffi=cffi.FFI, cdef=CDEF)
    assert lib.mode == mode and lib.lib.hal_test_add(2, 3) == 5
    assert int(lib.ffi.cast("int", 7)) == 7
    assert _entries() == [("test", mode)]


def test_a_compiler_error_names_the_file_and_stores_nothing(tmp_path: Path, cache: Path) -> None:
    src = tmp_path / "broken.c"
    src.write_text("int f( {\n")
    with pytest.raises(RuntimeError, match=r"failed on broken\.c: .*error"):
        native.build(
            src,
            name="broken",
            mode="abi",
            backend="t",
            device="d",
            what="x",
            compiler={},
            ffi=cffi.FFI,
        )
    assert _entries() == []


@pytest.mark.parametrize(
    ("mode", "ffi", "named"),
    [
        ("static", cffi.FFI, "mode='static'"),
        ("api", None, "mode='api' needs ffi="),
        ("abi", None, "mode='abi'"),
    ],
)
def test_bad_arguments_are_refused_naming_them(
    tmp_path: Path, cache: Path, mode: str, ffi: Callable[[], Any] | None, named: str
) -> None:
    src = tmp_path / "lib.c"
    src.write_text(LIB)
    with pytest.raises(ValueError, match=named):
        native.build(
            src,
            name="x",
            mode=mode,
            backend="t",
            device="d",
            what="x",
            compiler={},
            ffi=ffi,
        )
    with pytest.raises(ValueError, match=named):
        native.load(b"", name="x", mode=mode, ffi=ffi)
    assert _entries() == []


def test_without_a_compiler_on_path_the_error_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"no C compiler \(cc, gcc or clang\) on PATH"):
        native.c_compiler()


def test_compiler_version_is_the_first_line_of_version_or_unknown(tmp_path: Path) -> None:
    """The toolchain's identity for a cache key: ``cc --version``'s first line, "unknown" if it cannot run."""
    cc = native.c_compiler()
    got = native.compiler_version(cc)
    assert got and got != "unknown" and "\n" not in got
    assert native.compiler_version(str(tmp_path / "no-such-cc")) == "unknown"
