"""Kernels on the CUDA backend: hal.kernels' ``cuda`` dialect compiled by NVRTC (through CuPy).

The translated source is compiled with NVRTC for the device's real architecture
(``-arch=sm_XY``) into a cubin, which hal's compile cache stores and
``cupy.cuda.function.Module.load`` loads. Launches use 256-thread blocks in x (16x16 for
2-D ranges) on the stream's ``cupy.cuda.Stream``; pointer arguments are passed as 64-bit
device addresses (allocation pointer + byte offset). ``hal_f16`` is a 16-bit storage type
converted with ``cvt`` instructions (no CUDA headers are needed).

The backend registers dedicated ops built on CuPy: ``matmul`` and ``dot`` (cuBLAS),
``sum`` (CUB reductions) and ``accumulate`` (elementwise ufuncs).

CuPy is imported inside the functions only, so importing this module never needs a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hal import StreamError
from hal.spi import BufferArg, KernelBuildError, KernelSignature, ProgramImpl

if TYPE_CHECKING:
    from hal.backends.cuda._device import CudaDevice, CudaStream

__all__ = [
    "CudaProgram",
    "compile_program",
    "compiler_info",
    "launch",
    "load_program",
    "register_dedicated",
]


def _arch(device: CudaDevice) -> str:
    return "sm_" + device.compute_capability.replace(".", "")


def compiler_info(device: CudaDevice) -> dict[str, str]:
    """Return device, architecture, NVRTC, driver and CuPy versions (compile-cache key)."""
    import cupy
    from cupy_backends.cuda.api import runtime as rt
    from cupy_backends.cuda.libs import nvrtc

    major, minor = nvrtc.getVersion()
    return {
        "device": f"{device.name} {_arch(device)}",
        "nvrtc": f"{major}.{minor}",
        "driver": str(rt.driverGetVersion()),
        "cupy": str(cupy.__version__),
    }


class CudaProgram(ProgramImpl):
    """A loaded cubin and its kernel functions."""

    def __init__(
        self, device: CudaDevice, cubin: bytes, kernels: Sequence[KernelSignature], build_log: str
    ) -> None:
        import cupy

        self.device = device
        self._cubin = cubin
        self.build_log = build_log
        self.kernels = {s.name: s for s in kernels}
        with device.ctx():
            self.module = cupy.cuda.function.Module()
            self.module.load(cubin)
            self.functions = {s.name: self.module.get_function(s.name) for s in kernels}

    def binary(self) -> bytes:
        """Return the cubin."""
        return self._cubin


def _options(device: CudaDevice, options: Sequence[str]) -> list[str]:
    return [f"-arch={_arch(device)}", "-std=c++14", *options]


def compile_program(
    device: CudaDevice, source: str, options: Sequence[str], kernels: Sequence[KernelSignature]
) -> CudaProgram:
    """Compile ``source`` (``cuda`` dialect) with NVRTC; raise KernelBuildError with the log."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source, "hal_kernels.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, _options(device, options))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise KernelBuildError(
                f"NVRTC failed to compile the kernels ({exc})", build_log=log, device=device.label
            ) from exc
        log = nvrtc.getProgramLog(prog)
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return CudaProgram(device, bytes(cubin), kernels, log or "")


def load_program(
    device: CudaDevice, binary: bytes, kernels: Sequence[KernelSignature]
) -> CudaProgram:
    """Load a cubin from the compile cache."""
    return CudaProgram(device, binary, kernels, "")


def _grid(global_size: tuple[int, ...]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    gs = [*global_size, 1, 1, 1][:3]
    if gs[1] == 1 and gs[2] == 1:
        block = (256, 1, 1)
    elif gs[2] == 1:
        block = (16, 16, 1)
    else:
        block = (8, 8, 4)
    grid = tuple(-(-g // b) for g, b in zip(gs, block, strict=True))
    if grid[0] >= 1 << 31 or grid[1] > 65535 or grid[2] > 65535:
        raise ValueError(f"global_size={tuple(global_size)} exceeds the CUDA grid limits")
    return (grid[0], grid[1], grid[2]), block


def launch(
    stream: CudaStream,
    program: ProgramImpl,
    kernel: str,
    global_size: tuple[int, ...],
    args: Sequence[Any],
) -> None:
    """Enqueue ``kernel`` over ``global_size`` on the stream."""
    assert isinstance(program, CudaProgram)
    fn = program.functions[kernel]
    gs = [*global_size, 1, 1, 1][:3]
    cargs: list[Any] = [np.int64(gs[0]), np.int64(gs[1]), np.int64(gs[2])]
    for a in args:
        if isinstance(a, BufferArg):
            mem = getattr(a.memory, "mem", None)
            if mem is None:
                raise StreamError("kernel argument memory was freed", device=stream.device.label)
            cargs.append(np.uint64(int(mem.ptr) + a.offset))
        else:
            cargs.append(a)
    grid, block = _grid(tuple(global_size))
    with stream.device.ctx():
        fn(grid, block, tuple(cargs), stream=stream.stream)


# -- dedicated ops (CuPy: cuBLAS, CUB) --------------------------------------------------------
def _cp(arr: Any) -> Any:
    """Return a cupy.ndarray viewing a hal.Array on the CUDA backend (zero-copy)."""
    import cupy

    from hal.spi import impl_of

    mem = impl_of(arr.buffer).mem
    return cupy.ndarray(arr.shape, arr.dtype, memptr=cupy.cuda.MemoryPointer(mem, arr.offset))


def _on_stream(call: Any, fn: Any) -> None:
    from hal.spi import impl_of

    stream = impl_of(call.stream)
    with stream.device.ctx(), stream.stream:
        fn()


def _matmul(call: Any) -> None:
    import cupy

    a, b, out = _cp(call.inputs[0]), _cp(call.inputs[1]), _cp(call.out)
    _on_stream(call, lambda: cupy.matmul(a, b, out=out))


def _dot(call: Any) -> None:
    import cupy

    x, y, out = _cp(call.inputs[0]), _cp(call.inputs[1]), _cp(call.out)

    def run() -> None:
        out[...] = cupy.dot(x, y)

    _on_stream(call, run)


def _sum(call: Any) -> None:
    import cupy

    x, out = _cp(call.inputs[0]), _cp(call.out)
    axis = call.params.get("axis")
    _on_stream(call, lambda: cupy.sum(x, axis=axis, out=out))


def _accumulate(call: Any) -> None:
    import cupy

    dst, src = _cp(call.out), _cp(call.inputs[0])
    ufunc = {"sum": cupy.add, "prod": cupy.multiply, "max": cupy.maximum, "min": cupy.minimum}[
        call.params["op"]
    ]
    _on_stream(call, lambda: ufunc(dst, src, out=dst))


def register_dedicated(registry: Any) -> None:
    """Register the CUDA backend's dedicated ops (CuPy: cuBLAS, CUB, ufuncs)."""
    registry.add(
        "matmul",
        "cuda",
        _matmul,
        dtypes=("float16", "float32", "float64"),
        name="cuda:cupy.matmul(cuBLAS)",
    )
    registry.add("dot", "cuda", _dot, dtypes=("float32", "float64"), name="cuda:cupy.dot(cuBLAS)")
    registry.add("sum", "cuda", _sum, dtypes=("float32", "float64"), name="cuda:cupy.sum(CUB)")
    # CuPy computes float16 in float32 and rounds once (as hal's reference). Its bfloat16
    # (ml_dtypes, CuPy 14, experimental) compiles against cuda_bf16.h, a CUDA toolkit header a
    # wheel-only install lacks: bfloat16 takes the host route (no generic bf16 kernel either)
    registry.add(
        "accumulate",
        "cuda",
        _accumulate,
        dtypes=("float16", "float32", "float64", "int8", "uint8", "int32", "int64"),
        name="cuda:cupy ufunc(out=dst)",
    )
