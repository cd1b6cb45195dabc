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
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hal import BackendUnavailableError, StreamError, spi
from hal.backends.cpu import _faults
from hal.spi import BufferArg, KernelBuildError, KernelSignature, ProgramImpl

__all__ = [
    "CFLAGS",
    "CpuProgram",
    "compile_program",
    "compiler_info",
    "launch",
    "launch_native",
    "load_program",
]

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


@functools.lru_cache(maxsize=1)
def _compiler() -> str:
    env = spi.setting("HAL_CPU_CC") or ""
    for cand in ([env] if env else []) + ["cc", "gcc"]:
        path = shutil.which(cand)
        if path:
            return path
    raise BackendUnavailableError("cpu", "kernels need a C compiler: install gcc or set HAL_CPU_CC")


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
        "compiler": spi.native.compiler_version(cc),
        "cflags": " ".join(CFLAGS),
        "cffi": cffi.__version__,
        "launch": _TRAMPOLINE_ABI,  # libraries carry the native runtime's trampolines
    }


def _max_threads() -> int:
    n = spi.setting("HAL_CPU_KERNEL_THREADS")  # 1..4096 or "auto" (hal.ConfigError)
    if n == "auto":
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - non-Linux
            return os.cpu_count() or 1
    return int(n)


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
        lines.append(f"void {sig.name}{_TRAMPOLINE}(const char*);")
    return "\n".join(lines)


# -- the native runtime's call convention -----------------------------------------------------
#: Every kernel ``k`` gets a trampoline ``void k__hal_launch(const char *block)`` that unpacks an
#: argument block and calls ``k``: the native stream worker calls any kernel through it, with a
#: copy of the block queued beside the operation. The block: the global size (3 x int64), the
#: OpenMP thread count (int32, 4 bytes padding), then one 8-byte slot per parameter (a pointer
#: as an address, a scalar in its C type, zero-padded), native byte order.
_TRAMPOLINE = "__hal_launch"
_TRAMPOLINE_ABI = "block-v1"
_BLOCK_HEAD = "=3qi4x"
_SLOT = {
    "float32": "f4x",
    "float64": "d",
    "int8": "b7x",
    "uint8": "B7x",
    "int32": "i4x",
    "uint32": "I4x",
    "int64": "q",
    "uint64": "Q",
}


def _trampolines(kernels: Sequence[KernelSignature]) -> str:
    """Return the C source of the trampolines of ``kernels`` (appended to the program)."""
    out = ["\n/* hal-sdk cpu native runtime: argument-block trampolines */"]
    for sig in kernels:
        body = [
            f"void {sig.name}{_TRAMPOLINE}(const char* __b) {{",
            "    int64_t __gs[3]; int32_t __th;",
            "    __builtin_memcpy(__gs, __b, 24); __builtin_memcpy(&__th, __b + 24, 4);",
        ]
        names = []
        for i, p in enumerate(sig.params):
            ctype = "void*" if p.pointer else _CDEF_SCALARS[p.dtype]
            body.append(
                f"    {ctype} __a{i}; __builtin_memcpy(&__a{i}, __b + {32 + 8 * i}, sizeof(__a{i}));"
            )
            names.append(f"__a{i}")
        body.append(f"    {sig.name}(__gs, __th{''.join(', ' + n for n in names)});")
        body.append("}")
        out.append("\n".join(body))
    return "\n".join(out) + "\n"


def _packer(sig: KernelSignature) -> struct.Struct:
    return struct.Struct(
        _BLOCK_HEAD + "".join("Q" if p.pointer else _SLOT[p.dtype] for p in sig.params)
    )


Packer = Callable[[int, int, int, int, Sequence[Any], str], tuple[bytes, tuple[Any, ...]]]


def _block_function(sig: KernelSignature) -> Packer:
    """Return ``pack(g0, g1, g2, threads, args, label) -> (block, pins)`` for ``sig``, unrolled.

    ``args`` are the SPI's launch arguments (a :class:`hal.spi.BufferArg` for each pointer, a
    number for each scalar); ``pins`` are the buffers' storage arrays (kept alive while queued).
    Generated once per kernel: no loop or type test per argument on the launch path.
    """
    names = [f"a{i}" for i in range(len(sig.params))]
    ptrs = [i for i, p in enumerate(sig.params) if p.pointer]
    lines = ["def pack(g0, g1, g2, th, args, label):"]
    if names:
        lines.append(f"    {', '.join(names)}{',' if len(names) == 1 else ''} = args")
    for i in ptrs:
        lines.append(f"    m{i} = a{i}.memory")
        lines.append(f"    s{i} = m{i}.storage")
    if ptrs:
        freed = " or ".join(f"s{i} is None" for i in ptrs)
        lines.append(f"    if {freed}:")
        lines.append('        raise StreamError("kernel argument memory was freed", device=label)')
    vals = [f"m{i}.addr + a{i}.offset" if p.pointer else f"a{i}" for i, p in enumerate(sig.params)]
    pins = "".join(f"s{i}, " for i in ptrs)
    lines.append(f"    return _pack(g0, g1, g2, th{''.join(', ' + v for v in vals)}), ({pins})")
    scope: dict[str, Any] = {"_pack": _packer(sig).pack, "StreamError": StreamError}
    exec("\n".join(lines), scope)  # generated from the signature: fixed names a0, m0, s0...
    fn: Packer = scope["pack"]
    return fn


class CpuProgram(ProgramImpl):
    """A shared library loaded with cffi; one callable per kernel."""

    def __init__(self, library: bytes, kernels: Sequence[KernelSignature], build_log: str) -> None:
        import cffi

        # dlopen an anonymous private copy so that cache eviction never touches a loaded library
        os.environ.setdefault(
            "GOMP_SPINCOUNT", "10000"
        )  # idle OpenMP threads sleep soon (shared cores)
        # mkstemp: this user's alone (0600, O_EXCL), removed once loaded; no directory lingers after
        # a process killed by a signal (a per-process directory did, and warned at a normal exit)
        fd, path = tempfile.mkstemp(prefix="hal-cpu-", suffix=".so")
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
        self.sizes: dict[tuple[int, ...], Any] = {}  # global size -> int64_t[3] (launch fast path)
        self.from_buffer = self.ffi._backend.from_buffer  # skips cffi's Python wrapper per argument
        self.char_array = self.ffi.typeof("char[]")
        # kernel -> (trampoline address, argument-block packer, pointer flags) for native streams
        self.native: dict[str, tuple[int, Packer]] = {}
        for s in kernels:
            try:
                fn = getattr(self.lib, s.name + _TRAMPOLINE)
            except AttributeError:  # a library without trampolines: the Python launch path
                continue
            addr = int(self.ffi.cast("uintptr_t", fn))
            self.native[s.name] = (addr, _block_function(s))

    def binary(self) -> bytes:
        """Return the shared library's bytes (stored in the compile cache)."""
        return self._library


def compile_program(
    label: str, source: str, options: Sequence[str], kernels: Sequence[KernelSignature]
) -> CpuProgram:
    """Compile ``source`` (``c`` dialect) with the host C compiler; raise KernelBuildError on failure."""
    cc = _compiler()
    with tempfile.TemporaryDirectory(prefix="hal-build-") as tmp:  # 0700, removed on return
        src = os.path.join(tmp, "kernels.c")
        lib = os.path.join(tmp, "kernels.so")
        with open(src, "w", encoding="utf-8") as fh:
            fh.write(source)
            fh.write(_trampolines(kernels))
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
    try:
        return CpuProgram(data, kernels, log)
    # it compiled but does not load: an undefined function (a misspelt builtin)
    except OSError as exc:
        undefined = re.search(r"undefined symbol: (\w+)", str(exc))
        what = (
            f"undefined function {undefined.group(1)!r} (a misspelt builtin?)"
            if undefined
            else str(exc)
        )
        raise KernelBuildError(
            f"the compiled kernels do not load: {what}", build_log=log, device=label
        ) from None


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
    gs = program.sizes.get(global_size)
    if gs is None:  # read only by the kernels: one array per distinct range, kept by the program
        gs = ffi.new("int64_t[3]", list(global_size) + [1] * (3 - len(global_size)))
        if len(program.sizes) < 256:
            program.sizes[global_size] = gs
    cargs: list[Any] = []
    from_buffer = program.from_buffer
    char_array = program.char_array
    for a in args:
        if type(a) is BufferArg:
            storage = getattr(a.memory, "storage", None)
            if storage is None:
                raise StreamError("kernel argument memory was freed", device=label)
            # the cdata keeps ``storage`` alive until the call has run
            cargs.append(from_buffer(char_array, storage) + a.offset)
        else:
            cargs.append(a.item() if isinstance(a, np.generic) else a)
    total = work if work is not None else math.prod(global_size)
    threads = 1
    if total >= _PAR_MIN_WORK:
        threads = max(1, min(_max_threads(), total // _PER_THREAD_WORK))

    def run(_program: Any = program) -> None:  # the program's library stays loaded until it ran
        fn(gs, threads, *cargs)

    # a short launch on an idle stream runs on the caller's thread: completing early is a
    # valid outcome, and it saves the thread hand-off that dominates small kernels
    submit(run, inline=total <= _INLINE_MAX_WORK)


def launch_native(
    worker: Any,
    label: str,
    program: ProgramImpl,
    kernel: str,
    global_size: tuple[int, ...],
    args: Sequence[Any],
    work: int | None = None,
) -> bool:
    """Queue a kernel on a native stream ``worker`` through its trampoline; False if it has none.

    The argument block is packed here (buffer addresses, scalars) and copied by the runtime;
    the buffers' storage stays pinned until the kernel has run.
    """
    entry = program.native.get(kernel) if type(program) is CpuProgram else None
    if entry is None:
        return False
    if len(global_size) == 3:
        g0, g1, g2 = global_size
    else:
        g0, g1, g2 = (*global_size, 1, 1)[:3]
    total = work if work is not None else g0 * g1 * g2
    threads = 1
    if total >= _PAR_MIN_WORK:
        threads = max(1, min(_max_threads(), total // _PER_THREAD_WORK))
    block, pins = entry[1](g0, g1, g2, threads, args, label)
    seq = worker._kernel(worker._s, entry[0], block, len(block), total <= _INLINE_MAX_WORK)
    if seq:  # the buffers, and the program's library, stay alive until the kernel has run
        worker._queued(seq, (pins, program))
    return True


def bind_native(
    stream: Any,
    program: ProgramImpl,
    kernel: str,
    global_size: tuple[int, ...],
    work: int | None,
) -> Callable[..., None] | None:
    """Return the prepared launch of ``kernel`` on the native stream ``stream`` (``StreamImpl.launcher``).

    Generated once per call kind from the kernel's signature: its parameters are two per
    pointer (the :class:`CpuMemory` and the byte offset) and one per scalar; per call it
    checks the memory is not freed, packs the argument block (the head, sizes and thread
    count, packed once) and queues it with one cffi call, as :func:`launch_native` does. While
    the device's fault model is on (``_faults.epoch`` says when that changes) it hands the same
    arguments to ``stream.launch`` (the Python-callable path). None: no trampoline (the program
    has none) or a large launch (threads counted per call by :func:`launch_native`).
    """
    if type(program) is not CpuProgram:
        return None
    entry = program.native.get(kernel)
    sig = program.kernels.get(kernel)
    worker = stream.native
    if entry is None or sig is None or worker is None:
        return None
    g0, g1, g2 = (*global_size, 1, 1)[:3]
    total = work if work is not None else g0 * g1 * g2
    if total >= _PAR_MIN_WORK:  # threads follow HAL_CPU_KERNEL_THREADS per call: launch_native
        return None
    head = struct.pack(_BLOCK_HEAD, g0, g1, g2, 1)
    params = []  # the bound function's parameters
    slots = []  # the argument block's values
    ptrs = []
    slow = []  # the SPI launch's arguments
    for i, p in enumerate(sig.params):
        if p.pointer:
            params += [f"m{i}", f"o{i}"]
            slots.append(f"m{i}.addr + o{i}")
            ptrs.append(i)
            slow.append(f"_arg(m{i}, o{i})")
        else:
            params.append(f"a{i}")
            slots.append(f"a{i}")
            slow.append(f"a{i}")
    body = [
        f"def bound({', '.join(params)}):",
        "    rec = stream._rec if stream._epoch == _faults.epoch else stream._fast()",
        "    if rec is None:  # the fault model: the Python-callable path",
        f"        return stream.launch(program, kernel, global_size, [{', '.join(slow)}], work)",
    ]
    for i in ptrs:
        body.append(f"    s{i} = m{i}.storage")
    if ptrs:
        body.append(f"    if {' or '.join(f's{i} is None' for i in ptrs)}:")
        body.append('        raise StreamError("kernel argument memory was freed", device=label)')
    packed = f"_pack({', '.join(slots)})" if slots else "b''"
    body += [
        f"    block = head + {packed}",
        "    seq = _kernel(_s, addr, block, len(block), inline)",
        "    if seq:  # the buffers, and the program's library, stay alive until the kernel has run",
        f"        _queued(seq, (({''.join(f's{i}, ' for i in ptrs)}), program))",
        "    rec.ops += 1",
    ]
    scope: dict[str, Any] = {
        "stream": stream,
        "program": program,
        "kernel": kernel,
        "global_size": global_size,
        "work": work,
        "label": stream.device.label,
        "head": head,
        "addr": entry[0],
        "inline": total <= _INLINE_MAX_WORK,
        "_pack": struct.Struct(
            "=" + "".join("Q" if p.pointer else _SLOT[p.dtype] for p in sig.params)
        ).pack,
        "_kernel": worker._kernel,
        "_s": worker._s,
        "_queued": worker._queued,
        "_faults": _faults,
        "_arg": BufferArg,
        "StreamError": StreamError,
    }
    exec("\n".join(body), scope)  # generated from the signature: fixed names m0, o0, a1, s0...
    fn: Callable[..., None] = scope["bound"]
    return fn


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
    """Register the CPU emulator's dedicated ops: NumPy ufuncs and BLAS (via NumPy), and C kernels
    (softmax, layernorm, rmsnorm, full sum/max/min) where a C compiler is available."""
    global _compile
    # hal.kernels.compile, handed over by the registry: backends never import hal.kernels
    _compile = registry.compile
    registry.add("accumulate", "cpu", _accumulate, name="cpu:numpy.ufunc(out=dst)")
    registry.add(
        "matmul", "cpu", _matmul, dtypes=("float32", "float64"), name="cpu:numpy.matmul(BLAS)"
    )
    registry.add("dot", "cpu", _dot, dtypes=("float32", "float64"), name="cpu:numpy.dot(BLAS)")
    if unavailable_reason() is not None:  # the C kernels below need cffi and a C compiler
        return
    for op in ("softmax", "layernorm", "rmsnorm"):
        registry.add(
            op,
            "cpu",
            _rows_op,
            dtypes=("float32", "float64"),
            name=f"cpu:c.{op}(simd)",
            prepare=_prepare_softmax if op == "softmax" else None,
        )
    for op in ("sum", "max", "min"):
        registry.add(
            op,
            "cpu",
            _full_reduction,
            dtypes=("float32", "float64"),
            name=f"cpu:c.{op}_full(simd)",
            when=_whole_array,
            when_text="axis=None",
            prepare=_prepare_full_reduction,
        )


def _whole_array(call: Any) -> bool:
    """The dedicated reductions cover ``axis=None``; other axes take the generic kernel."""
    return call.params.get("axis") is None


# -- dedicated row and reduction kernels (C, vectorised; one row per work item, rows over OpenMP) --
#: The emulator's dedicated softmax / layernorm / rmsnorm and full reductions, in the portable
#: language's ``c`` dialect (compiled through hal.kernels' compile cache). The generic row
#: kernels run scalar libm ``exp`` and one accumulator; these vectorise every pass
#: (``omp simd`` reductions, a branch-free polynomial ``expf`` that GCC turns into AVX code).
ROWS_SOURCE = r"""
HAL_DEVICE float rows_expf(float x) {
    /* exp(x) = 2^n * p(r), r = x - n*ln2 in [-ln2/2, ln2/2] (Cephes expf, ~1 ulp). Branch-free
       selects only (no libm call): with -fno-trapping-math GCC vectorises the loops calling it. */
    float xc = x < -87.33654f ? -87.33654f : x;
    xc = xc > 88.72283f ? 88.72283f : xc;
    int32_t ni = (int32_t)(xc * 1.44269504088896341f + 128.5f) - 128; /* round to nearest */
    float fn = (float)ni;
    float r = xc - fn * 0.693359375f;
    r = r + fn * 2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = (ni + 127) << 23;
    float scale;
    __builtin_memcpy(&scale, &bits, 4);
    float y = p * scale;
    y = x < -87.33654f ? 0.0f : y;
    y = x > 88.72283f ? HAL_INF : y;
    return x == x ? y : x;
}
#if HAL_ROWS_DOUBLE
#define ROW_EXP(v) exp(v)
#else
#define ROW_EXP(v) rows_expf(v)
#endif
HAL_KERNEL void softmax(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, hal_i64 cols) {
    hal_i64 r = HAL_GLOBAL_ID(0);
    const T* HAL_RESTRICT row = x + r * cols;
    T* HAL_RESTRICT dst = out + r * cols;
    T m = (T)(-HAL_INF);
    int nan = 0;
    #pragma omp simd reduction(max:m) reduction(|:nan)
    for (hal_i64 k = 0; k < cols; ++k) { T v = row[k]; m = v > m ? v : m; nan |= (v != v); }
    if (nan) m = (T)HAL_NAN;
    if (m == (T)(-HAL_INF)) m = 0;
    hal_f64 s = 0;
    #pragma omp simd reduction(+:s)
    for (hal_i64 k = 0; k < cols; ++k) { T e = ROW_EXP(row[k] - m); dst[k] = e; s += (hal_f64)e; }
    T inv = (T)(1.0 / s);
    #pragma omp simd
    for (hal_i64 k = 0; k < cols; ++k) dst[k] *= inv;
}
HAL_KERNEL void layernorm(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, HAL_GLOBAL const T* w,
                          HAL_GLOBAL const T* b, hal_i64 cols, hal_f64 eps, hal_i32 has_w, hal_i32 has_b) {
    hal_i64 r = HAL_GLOBAL_ID(0);
    const T* HAL_RESTRICT row = x + r * cols;
    T* HAL_RESTRICT dst = out + r * cols;
    hal_f64 mean = 0, var = 0;
#if HAL_ROWS_DOUBLE
    #pragma omp simd reduction(+:mean)
    for (hal_i64 k = 0; k < cols; ++k) mean += (hal_f64)row[k];
    mean /= (hal_f64)cols;
    #pragma omp simd reduction(+:var)
    for (hal_i64 k = 0; k < cols; ++k) { hal_f64 d = (hal_f64)row[k] - mean; var += d * d; }
    var /= (hal_f64)cols;
#else
    /* float32 in double, one pass: sums of x - K and (x - K)^2, shifted by K = x[0] so that
       the variance does not cancel when the mean is large beside the spread */
    hal_f64 sq = 0, K = (hal_f64)row[0];
    K = (K - K == 0) ? K : 0; /* an infinite or NaN first element: no shift */
    #pragma omp simd reduction(+:mean) reduction(+:sq)
    for (hal_i64 k = 0; k < cols; ++k) { hal_f64 v = (hal_f64)row[k] - K; mean += v; sq += v * v; }
    mean /= (hal_f64)cols;
    var = sq / (hal_f64)cols - mean * mean;
    mean += K;
    var = var < 0 ? 0 : var; /* rounding; NaN stays NaN */
#endif
    hal_f64 rstd = 1.0 / sqrt(var + eps);
    /* x - mean in T with the mean split in two (hi + lo): exact where x is close to the mean */
    T a = (T)rstd, mh = (T)mean, ml = (T)(mean - (hal_f64)mh);
    if (has_w && has_b) {
        #pragma omp simd
        for (hal_i64 k = 0; k < cols; ++k) dst[k] = (((row[k] - mh) - ml) * a) * w[k] + b[k];
    } else if (has_w) {
        #pragma omp simd
        for (hal_i64 k = 0; k < cols; ++k) dst[k] = (((row[k] - mh) - ml) * a) * w[k];
    } else if (has_b) {
        #pragma omp simd
        for (hal_i64 k = 0; k < cols; ++k) dst[k] = ((row[k] - mh) - ml) * a + b[k];
    } else {
        #pragma omp simd
        for (hal_i64 k = 0; k < cols; ++k) dst[k] = ((row[k] - mh) - ml) * a;
    }
}
HAL_KERNEL void rmsnorm(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, HAL_GLOBAL const T* w,
                        hal_i64 cols, hal_f64 eps, hal_i32 has_w) {
    hal_i64 r = HAL_GLOBAL_ID(0);
    const T* HAL_RESTRICT row = x + r * cols;
    T* HAL_RESTRICT dst = out + r * cols;
    hal_f64 ss = 0;
    #pragma omp simd reduction(+:ss)
    for (hal_i64 k = 0; k < cols; ++k) { hal_f64 v = (hal_f64)row[k]; ss += v * v; }
    T rrms = (T)(1.0 / sqrt(ss / (hal_f64)cols + eps));
    if (has_w) {
        #pragma omp simd
        for (hal_i64 k = 0; k < cols; ++k) dst[k] = (row[k] * rrms) * w[k];
    } else {
        #pragma omp simd
        for (hal_i64 k = 0; k < cols; ++k) dst[k] = row[k] * rrms;
    }
}
/* full reductions (axis=None): 32 lanes in T per block of 4096 elements (four AVX registers of
   float32), the block results combined in double: float32 sums stay within ~1e-7 relative of
   an exact sum for ordinary data, at float speed. max/min flag NaN on the side (it propagates). */
#define RED_BLOCK 4096
HAL_KERNEL void sum_full(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, hal_i64 n) {
    hal_f64 total = 0;
    for (hal_i64 b = 0; b < n; b += RED_BLOCK) {
        hal_i64 e = b + RED_BLOCK < n ? b + RED_BLOCK : n, k = b;
        T a[32];
        for (int j = 0; j < 32; ++j) a[j] = 0;
        for (; k + 32 <= e; k += 32) {
            #pragma omp simd
            for (int j = 0; j < 32; ++j) a[j] += x[k + j];
        }
        hal_f64 part = 0;
        for (; k < e; ++k) part += (hal_f64)x[k];
        for (int j = 0; j < 32; ++j) part += (hal_f64)a[j];
        total += part;
    }
    out[0] = (T)total;
}
""" + "".join(
    f"""
HAL_KERNEL void {name}_full(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, hal_i64 n) {{
    T a[32];
    int nan[32];
    for (int j = 0; j < 32; ++j) {{ a[j] = {init}; nan[j] = 0; }}
    hal_i64 k = 0;
    for (; k + 32 <= n; k += 32) {{
        #pragma omp simd
        for (int j = 0; j < 32; ++j) {{
            T v = x[k + j];
            a[j] = (v {cmp} a[j]) ? v : a[j];
            nan[j] |= (v != v);
        }}
    }}
    T m = {init};
    int any = 0;
    for (; k < n; ++k) {{ T v = x[k]; m = (v {cmp} m) ? v : m; any |= (v != v); }}
    for (int j = 0; j < 32; ++j) {{ m = (a[j] {cmp} m) ? a[j] : m; any |= nan[j]; }}
    out[0] = any ? (T)HAL_NAN : m;
}}
"""
    for name, cmp, init in (("max", ">", "(T)(-HAL_INF)"), ("min", "<", "(T)HAL_INF"))
)

#: FP exceptions are not observable through hal: without trapping math GCC if-converts the selects
ROWS_OPTIONS = ("-fno-trapping-math",)
_row_programs: dict[tuple[Any, np.dtype[Any]], Any] = {}
#: ``KernelRegistry.compile`` of the registry this backend registered its ops with
_compile: Any = None
_row_lock = threading.Lock()


def forget_programs(devices: Sequence[Any]) -> None:
    """Drop the row programs of these devices (``DeviceImpl`` objects; their backend closed)."""
    mine = {id(d) for d in devices}
    with _row_lock:
        for key in [k for k in _row_programs if id(spi.impl_of(k[0])) in mine]:
            del _row_programs[key]


def _row_program(device: Any, dtype: np.dtype[Any]) -> Any:
    key = (device, dtype)  # the dtype itself: its ``name`` is a Python property of NumPy's
    prog = _row_programs.get(key)
    if prog is None:
        t = {"float32": "hal_f32", "float64": "hal_f64"}[dtype.name]
        defines = {"T": t, "HAL_ROWS_DOUBLE": "1" if dtype.name == "float64" else "0"}
        prog = _compile(ROWS_SOURCE, device, defines=defines, options=ROWS_OPTIONS)
        with _row_lock:
            prog = _row_programs.setdefault(key, prog)
    return prog


def _full_reduction(call: Any) -> None:
    p = _row_program(call.device, call.dtype)
    x = call.inputs[0]
    name = f"{call.op}_full"
    p.launch(name, 1, [call.out, x, x.size], stream=call.stream, work=x.size)


def _prepare_one_input(
    p: Any, name: str, size: int, scalar: int, stream: Any, work: int
) -> Callable[..., None] | None:
    """The launch cache's run for ``name(out, x, scalar)`` over ``size`` items.

    Per call: each array's memory and offset handed to the stream's prepared launch
    (``Program.launcher``); memory freed since the cache's check takes ``Program.launch``,
    which raises the usual error. Without a prepared launch: ``Program.launch`` itself.
    """
    bound = p.launcher(name, size, stream=stream, work=work)
    launch = p.launch
    live = spi.stream_impl
    if bound is None:  # a Python stream (or a large launch): Program.launch, no OpCall

        def run_launch(stream: Any, ins: Any, out: Any, sc: Any) -> None:
            launch(name, size, [out, ins[0], scalar], stream=stream, work=work)

        return run_launch

    def run(stream: Any, ins: Any, out: Any, sc: Any) -> None:
        x = ins[0]
        mo, mx = out.spi_buffer.spi_memory, x.spi_buffer.spi_memory
        if mo is None or mx is None:
            launch(name, size, [out, x, scalar], stream=stream, work=work)
            return
        live(stream)  # open, past any fallback host wait, counted (as Program.launch)
        bound(mo, out.spi_offset, mx, x.spi_offset, scalar)

    return run


def _prepare_full_reduction(call: Any) -> Callable[..., None] | None:
    """``prepare`` of the full reductions: later sums of one kind are one prepared launch."""
    p = _row_program(call.device, call.dtype)
    n = call.inputs[0].size
    return _prepare_one_input(p, f"{call.op}_full", 1, n, call.stream, n)


def _prepare_softmax(call: Any) -> Callable[..., None] | None:
    """``prepare`` of softmax: later calls of one kind are one prepared launch."""
    p = _row_program(call.device, call.dtype)
    x = call.inputs[0]
    cols = x.shape[-1]
    return _prepare_one_input(p, "softmax", x.size // cols, cols, call.stream, x.size * 2)


def _rows_op(call: Any) -> None:
    p = _row_program(call.device, call.dtype)
    x = call.inputs[0]
    cols = x.shape[-1]
    rows = x.size // cols
    work = x.size * 2
    if call.op == "softmax":
        p.launch("softmax", rows, [call.out, x, cols], stream=call.stream, work=work)
    elif call.op == "layernorm":
        w, b = call.params.get("weight"), call.params.get("bias")
        args = [
            call.out,
            x,
            x if w is None else w,
            x if b is None else b,
            cols,
            float(call.params["eps"]),
            int(w is not None),
            int(b is not None),
        ]
        p.launch("layernorm", rows, args, stream=call.stream, work=work)
    else:
        w = call.params.get("weight")
        args = [
            call.out,
            x,
            x if w is None else w,
            cols,
            float(call.params["eps"]),
            int(w is not None),
        ]
        p.launch("rmsnorm", rows, args, stream=call.stream, work=work)
