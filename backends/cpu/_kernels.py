"""Kernels on the CPU emulator: the ``c`` dialect compiled by gcc into a shared library, called through cffi.

hal.kernels translates each portable kernel into an entry point that loops over the
global range (split across cores with OpenMP when the launch is large enough). The
library is built with ``-O3 -march=native -fopenmp -fno-math-errno -fwrapv`` and loaded
with cffi's ABI mode (``ffi.dlopen``); calls release the GIL. Environment:

- ``HAL_CPU_CC``: the C compiler (default ``cc``, then ``gcc``).
- ``HAL_CPU_KERNEL_THREADS``: OpenMP threads per large launch (default 1; ``auto`` = the CPUs
  this process may use). Measured on a shared 2-core machine, a second thread made
  memory-bound kernels slower as often as faster, and the emulator often runs several
  streams and processes at once; so it is opt-in.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from hal._errors import BackendUnavailableError, StreamError
from hal.spi import BufferArg, KernelBuildError, KernelSignature, ProgramImpl

__all__ = ["CFLAGS", "CpuProgram", "compile_program", "compiler_info", "launch", "load_program"]

CFLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fno-math-errno",
    "-fwrapv",
    "-fPIC",
    "-shared",
    "-std=gnu11",
)
_PAR_MIN_WORK = 1 << 18  # elementary operations per launch before a second thread pays
_PER_THREAD_WORK = 1 << 17
_INLINE_MAX_WORK = 1 << 22  # about a millisecond of work: larger launches stay asynchronous
_tmp_lock = threading.Lock()
_tmp_dir: tempfile.TemporaryDirectory[str] | None = None


def _private_dir() -> str:
    global _tmp_dir
    with _tmp_lock:
        if _tmp_dir is None:
            _tmp_dir = tempfile.TemporaryDirectory(prefix="hal-cpu-kernels-")
        return _tmp_dir.name


@functools.lru_cache(maxsize=1)
def _compiler() -> str:
    env = os.environ.get("HAL_CPU_CC", "").strip()
    for cand in ([env] if env else []) + ["cc", "gcc"]:
        path = shutil.which(cand)
        if path:
            return path
    raise BackendUnavailableError("cpu", "kernels need a C compiler: install gcc or set HAL_CPU_CC")


@functools.lru_cache(maxsize=1)
def _compiler_version(cc: str) -> str:
    try:
        out = subprocess.run(
            [cc, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        return out.stdout.splitlines()[0].strip() if out.stdout else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.lru_cache(maxsize=1)
def _host_cpu() -> str:
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = value.strip()
                    break
    except OSError:
        pass
    digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return f"{platform.machine()} {model or platform.processor()} flags:{digest}"


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Return why this machine cannot run kernels on the emulator (no cffi, no C compiler), or None."""
    import importlib.util

    if importlib.util.find_spec("cffi") is None:
        return "cffi is not installed (pip install cffi)"
    try:
        _compiler()
    except BackendUnavailableError as exc:
        return exc.reason
    return None


def compiler_info() -> dict[str, str]:
    """Return the identity of the C toolchain and host CPU (the compile-cache key uses it)."""
    cc = _compiler()
    import cffi

    return {
        "device": f"host-cpu {_host_cpu()}",
        "compiler": _compiler_version(cc),
        "cflags": " ".join(CFLAGS),
        "cffi": cffi.__version__,
    }


def _max_threads() -> int:
    raw = os.environ.get("HAL_CPU_KERNEL_THREADS", "").strip()
    if not raw:
        return 1
    if raw == "auto":
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - non-Linux
            return os.cpu_count() or 1
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(
            f"HAL_CPU_KERNEL_THREADS={raw!r} must be a positive integer or 'auto'"
        ) from None
    if n < 1:
        raise ValueError(f"HAL_CPU_KERNEL_THREADS={raw!r} must be a positive integer or 'auto'")
    return n


_CDEF_SCALARS = {
    "float32": "float",
    "float64": "double",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int32": "int32_t",
    "uint32": "uint32_t",
    "int64": "int64_t",
    "uint64": "uint64_t",
}


def _cdef(kernels: Sequence[KernelSignature]) -> str:
    lines = []
    for sig in kernels:
        params = ["const int64_t*", "int32_t"]
        params += ["void*" if p.pointer else _CDEF_SCALARS[p.dtype] for p in sig.params]
        lines.append(f"void {sig.name}({', '.join(params)});")
    return "\n".join(lines)


class CpuProgram(ProgramImpl):
    """A shared library loaded with cffi; one callable per kernel."""

    def __init__(self, library: bytes, kernels: Sequence[KernelSignature], build_log: str) -> None:
        import cffi

        # dlopen an anonymous private copy so that cache eviction never touches a loaded library
        os.environ.setdefault(
            "GOMP_SPINCOUNT", "10000"
        )  # idle OpenMP threads sleep soon (shared cores)
        fd, path = tempfile.mkstemp(suffix=".so", dir=_private_dir())
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(library)
            self.ffi = cffi.FFI()
            self.ffi.cdef(_cdef(kernels))
            self.lib = self.ffi.dlopen(path)
        finally:
            os.unlink(path)
        self._library = library
        self.build_log = build_log
        self.kernels = {s.name: s for s in kernels}
        self.functions = {s.name: getattr(self.lib, s.name) for s in kernels}

    def binary(self) -> bytes:
        """Return the shared library's bytes (stored in the compile cache)."""
        return self._library


def compile_program(
    label: str, source: str, options: Sequence[str], kernels: Sequence[KernelSignature]
) -> CpuProgram:
    """Compile ``source`` (``c`` dialect) with the host C compiler; raise KernelBuildError on failure."""
    cc = _compiler()
    with tempfile.TemporaryDirectory(prefix="hal-build-", dir=_private_dir()) as tmp:
        src = os.path.join(tmp, "kernels.c")
        lib = os.path.join(tmp, "kernels.so")
        with open(src, "w", encoding="utf-8") as fh:
            fh.write(source)
        cmd = [cc, *CFLAGS, *options, src, "-o", lib, "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            raise KernelBuildError(f"running {cc} failed: {exc}", device=label) from exc
        log = (proc.stderr + proc.stdout).replace(src, "kernel.c")
        if proc.returncode != 0:
            first = next((ln for ln in log.splitlines() if "error" in ln), "see the build log")
            raise KernelBuildError(
                f"{os.path.basename(cc)} failed to compile the kernels: {first.strip()}",
                build_log=log,
                device=label,
            )
        with open(lib, "rb") as fh:
            data = fh.read()
    return CpuProgram(data, kernels, log)


def load_program(binary: bytes, kernels: Sequence[KernelSignature]) -> CpuProgram:
    """Load a library from the compile cache."""
    return CpuProgram(binary, kernels, "")


def launch(
    submit: Any,
    label: str,
    program: ProgramImpl,
    kernel: str,
    global_size: tuple[int, ...],
    args: Sequence[Any],
    work: int | None = None,
) -> None:
    """Enqueue a kernel call through ``submit`` (the stream's worker)."""
    assert isinstance(program, CpuProgram)
    fn = program.functions[kernel]
    ffi = program.ffi
    gs = ffi.new("int64_t[3]", list(global_size) + [1] * (3 - len(global_size)))
    cargs: list[Any] = []
    from_buffer = ffi.from_buffer
    for a in args:
        if isinstance(a, BufferArg):
            storage = getattr(a.memory, "storage", None)
            if storage is None:
                raise StreamError("kernel argument memory was freed", device=label)
            # the cdata keeps ``storage`` alive until the call has run
            cargs.append(from_buffer("char[]", storage) + a.offset)
        else:
            cargs.append(a.item() if isinstance(a, np.generic) else a)
    total = work if work is not None else math.prod(global_size)
    threads = 1
    if total >= _PAR_MIN_WORK:
        threads = max(1, min(_max_threads(), total // _PER_THREAD_WORK))

    def run() -> None:
        fn(gs, threads, *cargs)

    # a short launch on an idle stream runs on the caller's thread: completing early is a
    # valid outcome, and it saves the thread hand-off that dominates small kernels
    submit(run, inline=total <= _INLINE_MAX_WORK)


# -- dedicated ops (registered through the cpu plugin's hal_register_kernels hook) ------------
def _view(arr: Any) -> np.ndarray[Any, Any]:
    """Return the NumPy view of a hal.Array on the CPU emulator (zero-copy)."""
    from hal.spi import impl_of

    mem = impl_of(arr.buffer)
    return mem.bytes(arr.offset, arr.nbytes).view(arr.dtype).reshape(arr.shape)


def _submit(call: Any, fn: Any, work: int) -> None:
    from hal.spi import impl_of

    def run() -> None:
        with np.errstate(all="ignore"):  # IEEE results (inf, nan) as the generic kernels give them
            fn()

    impl_of(call.stream).worker.submit(run, inline=work <= _INLINE_MAX_WORK)


def _accumulate(call: Any) -> None:
    dst, src = _view(call.out), _view(call.inputs[0])
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[
        call.params["op"]
    ]
    _submit(call, lambda: ufunc(dst, src, out=dst), dst.size)


def _matmul(call: Any) -> None:
    a, b, out = _view(call.inputs[0]), _view(call.inputs[1]), _view(call.out)
    # BLAS does ~30 multiply-adds per ns here: count a multiply-add as 1/8 of an element op
    _submit(call, lambda: np.matmul(a, b, out=out), a.shape[0] * a.shape[1] * b.shape[1] // 8)


def _dot(call: Any) -> None:
    x, y, out = _view(call.inputs[0]), _view(call.inputs[1]), _view(call.out)

    def run() -> None:
        out[()] = np.dot(x, y)

    _submit(call, run, x.size)


def register_dedicated(registry: Any) -> None:
    """Register the CPU emulator's dedicated ops: NumPy ufuncs and BLAS (via NumPy)."""
    registry.add("accumulate", "cpu", _accumulate, name="cpu:numpy.ufunc(out=dst)")
    registry.add(
        "matmul", "cpu", _matmul, dtypes=("float32", "float64"), name="cpu:numpy.matmul(BLAS)"
    )
    registry.add("dot", "cpu", _dot, dtypes=("float32", "float64"), name="cpu:numpy.dot(BLAS)")
