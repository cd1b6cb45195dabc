"""CUDA devices, memory, streams and events over CuPy (imported only once CuPy is known to load).

Everything here calls the CUDA runtime through ``cupy_backends.cuda.api.runtime`` with the
device made current for the call (:class:`_OnDevice`), and translates CuPy's exceptions
into the hal error tree at that boundary.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import cupy
import numpy as np
from cupy_backends.cuda.api import runtime as rt

from hal import BackendUnavailableError, OutOfMemoryError, StreamError, spi
from hal.backends.cuda._errors import is_cuda_error, translate_cuda_error
from hal.backends.cuda._signal import (
    CudaHostSignal,
    HostSignalSlab,
    driver_wait_value,
    enabled_from_env,
)
from hal.spi import (
    Capabilities,
    DeviceImpl,
    EventImpl,
    HostSignalImpl,
    MemoryAccount,
    MemoryImpl,
    StreamImpl,
)

__all__ = [
    "AdoptedCudaMemory",
    "CudaDevice",
    "CudaEvent",
    "CudaMemory",
    "CudaStream",
    "ImportedCudaMemory",
    "host_pointer",
    "is_pinned",
]

_H2D = 1  # cudaMemcpyHostToDevice
_D2H = 2  # cudaMemcpyDeviceToHost
_D2D = 3  # cudaMemcpyDeviceToDevice
_PEER_ALREADY_ENABLED = 704  # cudaErrorPeerAccessAlreadyEnabled
_MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost: page-locked (pinned or registered) host memory
_MEMORY_TYPE_DEVICE = 2  # cudaMemoryTypeDevice
_MEMORY_TYPE_MANAGED = 3  # cudaMemoryTypeManaged
_DL_CUDA = 2  # DLPack kDLCUDA

STAGING_CHUNK = 4 << 20
"""Bytes per pinned staging slot for host->device copies from pageable memory."""
STAGING_SLOTS = 4
"""Pinned staging slots per device (a ring: chunk k+1 is filled while chunk k is in flight)."""


class _OnDevice:
    """Make a CUDA device current for a block and translate CuPy errors raised inside it."""

    __slots__ = ("_label", "_ordinal", "_prev")

    def __init__(self, ordinal: int, label: str) -> None:
        self._ordinal = ordinal
        self._label = label
        self._prev = -1

    def __enter__(self) -> None:
        try:
            prev = rt.getDevice()
            if prev != self._ordinal:
                rt.setDevice(self._ordinal)
        except Exception as exc:
            if is_cuda_error(exc):
                raise translate_cuda_error(exc, device=self._label) from exc
            raise
        self._prev = prev

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        prev, self._prev = self._prev, -1
        if prev not in (-1, self._ordinal):
            try:
                rt.setDevice(prev)
            except Exception:  # noqa: BLE001 - restoring the caller's device is best effort
                pass
        if ev is not None and isinstance(ev, Exception) and is_cuda_error(ev):
            raise translate_cuda_error(ev, device=self._label) from ev


def _ipc_loaded() -> bool:
    """True once this process exported or imported CUDA memory (so deferred IPC frees may be due)."""
    return "hal.backends.cuda._ipc" in sys.modules


def host_pointer(view: memoryview) -> tuple[int, np.ndarray[Any, Any]]:
    """Return the address of a contiguous byte view and a NumPy array over it (keeps it alive)."""
    arr = np.frombuffer(view, dtype=np.uint8)
    return int(arr.__array_interface__["data"][0]), arr


def is_pinned(ptr: int) -> bool:
    """Return True if ``ptr`` points into page-locked host memory known to CUDA."""
    try:
        return int(rt.pointerGetAttributes(ptr).type) == _MEMORY_TYPE_HOST
    except Exception as exc:  # older drivers answer cudaErrorInvalidValue for pageable memory
        if is_cuda_error(exc):
            return False
        raise


class CudaMemory(MemoryImpl):
    """A device allocation: a ``cupy.cuda.Memory`` (``cudaMalloc``) owned by hal.

    ``mem`` is the cupy memory object every user of the allocation references (kernels,
    DLPack views, ``cupy.cuda.MemoryPointer``); the subclasses put a
    ``cupy.cuda.UnownedMemory`` there for memory hal does not own.
    """

    __slots__ = ("_export", "device", "mem", "nbytes", "ptr")

    def __init__(self, device: CudaDevice, nbytes: int) -> None:
        self.device = device
        self.nbytes = nbytes
        self._export: Any = None
        with device.ctx():
            self.mem: Any = cupy.cuda.Memory(nbytes)
        self.ptr = int(self.mem.ptr)

    def free(self) -> None:
        # cudaFree waits for the device's outstanding work, so enqueued copies that still use
        # the memory complete first. A DLPack consumer holding a view keeps the cupy Memory
        # (and so the allocation) alive until it lets go; an exported allocation is freed once
        # its importers closed it (_ipc.retire).
        mem, self.mem = self.mem, None
        if mem is not None:
            exp, self._export = self._export, None
            if exp is not None:
                from hal.backends.cuda import _ipc

                _ipc.retire(exp, mem)
            del mem
            self.device._release(self.nbytes)

    def export_handle(self) -> str:
        """A ``cudaIpcGetMemHandle`` handle and the lock file that carries the lifetime (see _ipc.py)."""
        from hal.backends.cuda import _ipc

        with self.device._lock:  # one export (one lock file) per allocation, whichever thread asks
            if self._export is None:
                mem = self.mem
                if mem is None:
                    raise NotImplementedError("the memory was freed")
                self._export = _ipc.export(self.device, self.ptr, mem)
            return str(self._export.payload)

    def dlpack_device(self) -> tuple[int, int]:
        return (2, self.device.ordinal)  # kDLCUDA, CUDA device ordinal

    def dlpack(
        self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any
    ) -> Any:
        if stream is not None and (
            isinstance(stream, bool) or not isinstance(stream, int) or stream < -1 or stream == 0
        ):
            raise BufferError(
                f"stream={stream!r}: on CUDA the DLPack consumer stream is -1, 1, 2 or a stream pointer"
            )
        mem = self.mem
        if mem is None:
            raise BufferError("the memory was freed")
        dt = np.dtype(dtype)
        with self.device.ctx():
            if stream != -1:
                # The consumer's stream waits for everything enqueued so far on hal's streams of
                # this device (None means the legacy default stream, as in the DLPack spec).
                self.device.order_before(1 if stream is None else int(stream))
            kwargs: dict[str, Any] = {"stream": stream}
            if max_version is not None:
                kwargs["max_version"] = max_version
            try:
                view = cupy.ndarray(shape, dt, memptr=cupy.cuda.MemoryPointer(mem, offset))
                return view.__dlpack__(**kwargs)
            except (TypeError, ValueError) as exc:
                raise BufferError(
                    f"cannot export dtype={dt} shape={shape} through DLPack: {exc}"
                ) from exc


class AdoptedCudaMemory(CudaMemory):
    """CUDA memory a DLPack producer owns (a torch or CuPy array on this device), used zero-copy.

    Not counted in ``memory_in_use``; ``free()`` drops hal's reference (the producer's
    ``owner`` stays referenced by DLPack views made from it until they go).
    """

    __slots__ = ("owner",)

    def __init__(self, device: CudaDevice, address: int, nbytes: int, owner: object) -> None:
        self.device = device
        self.nbytes = nbytes
        self._export = None
        self.owner: object = owner
        self.mem = cupy.cuda.UnownedMemory(address, nbytes, owner, device.ordinal)
        self.ptr = address

    def free(self) -> None:
        self.mem = None
        self.owner = None

    def export_handle(self) -> str:
        raise NotImplementedError(
            "memory adopted from a DLPack producer is the producer's: copy it into a hal buffer to share it"
        )


class ImportedCudaMemory(CudaMemory):
    """Memory of another process mapped by ``cudaIpcOpenMemHandle`` (``Device.import_handle``).

    Not counted in ``memory_in_use``; ``free()`` drops hal's reference, and the mapping is
    closed once no DLPack view of it is left and the device's streams passed the work
    enqueued before (see _ipc.py).
    """

    __slots__ = ()

    def __init__(self, device: CudaDevice, payload: str, nbytes: int) -> None:
        from hal.backends.cuda import _ipc

        self.device = device
        self.nbytes = nbytes
        self._export = None
        mapping = _ipc.open_handle(device, payload, nbytes)
        self.mem = cupy.cuda.UnownedMemory(mapping.ptr, nbytes, mapping, device.ordinal)
        self.ptr = mapping.ptr

    def free(self) -> None:
        self.mem = None

    def export_handle(self) -> str:
        raise NotImplementedError("memory imported from another process cannot be exported again")


class CudaEvent(EventImpl):
    """A ``cupy.cuda.Event`` (``cudaEventDisableTiming`` unless ``timing``)."""

    def __init__(self, device: CudaDevice, timing: bool) -> None:
        self.device = device
        self.timing = timing
        with device.ctx():
            self.event: Any = cupy.cuda.Event(block=False, disable_timing=not timing)
        self.ptr = int(self.event.ptr)

    def synchronize(self) -> None:
        with self.device.ctx(), _SyncErrors(self.device):
            rt.eventSynchronize(self.ptr)

    def query(self) -> bool:
        with self.device.ctx():
            return bool(self.event.done)

    def elapsed_ms(self, start: EventImpl) -> float:
        assert isinstance(start, CudaEvent)
        with self.device.ctx():
            return float(rt.eventElapsedTime(start.ptr, self.ptr))

    def close(self) -> None:
        self.event = None


class _SyncErrors:
    """Turn a CUDA failure surfacing at a synchronization point into ``hal.StreamError``."""

    __slots__ = ("_device",)

    def __init__(self, device: CudaDevice) -> None:
        self._device = device

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if ev is not None and isinstance(ev, Exception) and is_cuda_error(ev):
            err = translate_cuda_error(ev, device=self._device.label)
            if type(err) is not StreamError and not isinstance(
                err, (OutOfMemoryError, BackendUnavailableError)
            ):
                err = StreamError(
                    f"work on the stream failed: {err}",
                    device=self._device.label,
                    code=getattr(err, "code", None),
                )
            raise err from ev


class CudaStream(StreamImpl):
    """A non-blocking ``cupy.cuda.Stream``: no implicit ordering with the legacy default stream."""

    def __init__(self, device: CudaDevice) -> None:
        self.device = device
        with device.ctx():
            self.stream: Any = cupy.cuda.Stream(non_blocking=True)
            self._tail: Any = cupy.cuda.Event(block=False, disable_timing=True)
        self.ptr = int(self.stream.ptr)

    # -- copies --------------------------------------------------------------------------
    def copy_from_host(
        self, dst: MemoryImpl, dst_offset: int, src: memoryview, nbytes: int
    ) -> None:
        assert isinstance(dst, CudaMemory)
        ptr, arr = host_pointer(src)
        dev = self.device
        with dev.ctx():
            if not dev.staging_enabled or is_pinned(ptr):
                rt.memcpyAsync(dst.ptr + dst_offset, ptr, nbytes, _H2D, self.ptr)
            else:
                dev.staging().copy_from_host(self.ptr, dst.ptr + dst_offset, arr, nbytes)

    def copy_to_host(self, dst: memoryview, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        assert isinstance(src, CudaMemory)
        ptr, _ = host_pointer(dst)
        with self.device.ctx():
            # Pinned destination: fully asynchronous. Pageable: the driver stages the copy and
            # returns when it has completed.
            rt.memcpyAsync(ptr, src.ptr + src_offset, nbytes, _D2H, self.ptr)

    def copy(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        assert isinstance(dst, CudaMemory) and isinstance(src, CudaMemory)
        d, s = dst.ptr + dst_offset, src.ptr + src_offset
        with self.device.ctx():
            if (
                d != s and abs(d - s) < nbytes
            ):  # overlapping ranges (one allocation, or aliases of it)
                self._copy_overlapping(d, s, nbytes)
            elif d != s:
                rt.memcpyAsync(d, s, nbytes, _D2D, self.ptr)

    def _copy_overlapping(self, d: int, s: int, nbytes: int) -> None:
        """Copy between overlapping ranges (cudaMemcpy is undefined there) via a temporary."""
        distance = abs(d - s)
        if distance >= (1 << 20) or nbytes // distance <= 8:
            # Few pieces: copy in chunks of ``distance`` bytes, in the safe direction.
            starts = range(0, nbytes, distance)
            for off in starts if d < s else reversed(starts):
                rt.memcpyAsync(d + off, s + off, min(distance, nbytes - off), _D2D, self.ptr)
            return
        try:
            tmp = rt.mallocAsync(nbytes, self.ptr)
        except Exception as exc:  # no stream-ordered allocator on this device: use chunks
            if not is_cuda_error(exc):
                raise
            starts = range(0, nbytes, distance)
            for off in starts if d < s else reversed(starts):
                rt.memcpyAsync(d + off, s + off, min(distance, nbytes - off), _D2D, self.ptr)
            return
        try:
            rt.memcpyAsync(tmp, s, nbytes, _D2D, self.ptr)
            rt.memcpyAsync(d, tmp, nbytes, _D2D, self.ptr)
        finally:
            rt.freeAsync(tmp, self.ptr)

    def copy_peer(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        assert isinstance(dst, CudaMemory) and isinstance(src, CudaMemory)
        dev = self.device
        other = src.device if dst.device is dev else dst.device
        dev.enable_peer_access(other)
        with dev.ctx():
            rt.memcpyPeerAsync(
                dst.ptr + dst_offset,
                dst.device.ordinal,
                src.ptr + src_offset,
                src.device.ordinal,
                nbytes,
                self.ptr,
            )

    def memset(self, dst: MemoryImpl, offset: int, value: int, nbytes: int) -> None:
        assert isinstance(dst, CudaMemory)
        with self.device.ctx():
            rt.memsetAsync(dst.ptr + offset, value, nbytes, self.ptr)

    # -- ordering ------------------------------------------------------------------------
    def record(self, event: EventImpl) -> None:
        assert isinstance(event, CudaEvent)
        with self.device.ctx():
            rt.eventRecord(event.ptr, self.ptr)

    def wait(self, event: EventImpl) -> None:
        assert isinstance(event, CudaEvent)
        with self.device.ctx():
            rt.streamWaitEvent(self.ptr, event.ptr, 0)

    def wait_host(self) -> HostSignalImpl:
        """Enqueue ``cuStreamWaitValue32`` on a pinned word that ``set`` writes (see _signal.py)."""
        with self.device.ctx():
            return CudaHostSignal(self.device.signal_slab(), self.ptr)

    def order_before(self, consumer: int) -> None:
        """Make the stream handle ``consumer`` wait for the work enqueued here so far."""
        if consumer == self.ptr:
            return
        rt.eventRecord(self._tail.ptr, self.ptr)
        rt.streamWaitEvent(consumer, self._tail.ptr, 0)

    def launch(
        self,
        program: Any,
        kernel: str,
        global_size: tuple[int, ...],
        args: Sequence[Any],
        work: int | None = None,
    ) -> None:
        from hal.backends.cuda import _kernels

        _kernels.launch(self, program, kernel, global_size, args)

    def synchronize(self) -> None:
        with self.device.ctx(), _SyncErrors(self.device):
            rt.streamSynchronize(self.ptr)

    def query(self) -> bool:
        with self.device.ctx():
            return bool(self.stream.done)

    def close(self) -> None:
        # cudaStreamDestroy returns at once; the stream's work still completes.
        self.stream = None
        self._tail = None


class _Staging:
    """A ring of pinned host buffers for host->device copies from pageable memory.

    Chunk k is copied (host memcpy) into a free slot and its DMA enqueued; the slot's event,
    recorded after the DMA, tells when the slot may be refilled. So the copy returns without
    waiting for the stream, and the caller's host memory can change as soon as it returns.
    """

    def __init__(self, device: CudaDevice) -> None:
        self._device = device
        self._lock = threading.Lock()
        self._slots: list[tuple[Any, np.ndarray[Any, Any], Any]] = []
        self._next = 0

    def _slot(self, i: int) -> tuple[Any, np.ndarray[Any, Any], Any]:
        while len(self._slots) <= i:
            pinned = cupy.cuda.alloc_pinned_memory(STAGING_CHUNK)
            raw = (ctypes.c_ubyte * STAGING_CHUNK).from_address(int(pinned.ptr))
            view = np.frombuffer(
                memoryview(raw), dtype=np.uint8
            )  # `pinned` (kept in the slot) owns it
            event = cupy.cuda.Event(block=False, disable_timing=True)
            self._slots.append((pinned, view, event))
        return self._slots[i]

    def copy_from_host(
        self, stream_ptr: int, dst_ptr: int, src: np.ndarray[Any, Any], nbytes: int
    ) -> None:
        """Enqueue ``nbytes`` from ``src`` to device address ``dst_ptr`` on ``stream_ptr``."""
        with self._lock:
            for off in range(0, nbytes, STAGING_CHUNK):
                k = min(STAGING_CHUNK, nbytes - off)
                pinned, view, event = self._slot(self._next)
                self._next = (self._next + 1) % STAGING_SLOTS
                rt.eventSynchronize(event.ptr)  # the slot's previous DMA has completed
                np.copyto(view[:k], src[off : off + k])
                rt.memcpyAsync(dst_ptr + off, int(pinned.ptr), k, _H2D, stream_ptr)
                rt.eventRecord(event.ptr, stream_ptr)


class CudaDevice(DeviceImpl):
    """One CUDA device (an ordinal of the CUDA runtime) as a hal device."""

    kernel_dialect = "cuda"  # hal.kernels: compiled by NVRTC (see _kernels.py)

    def __init__(self, index: int, ordinal: int, staging: bool) -> None:
        self.index = index
        self.ordinal = ordinal
        self.label = f"cuda:{index}"
        props = rt.getDeviceProperties(ordinal)
        name = props.get("name", b"")
        self.name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        self.vendor = "NVIDIA"
        self.total_memory = int(props.get("totalGlobalMem", 0))
        self.compute_capability = f"{props.get('major', 0)}.{props.get('minor', 0)}"
        self.multiprocessors = int(props.get("multiProcessorCount", 0))
        pci = (props.get("pciDomainID", 0), props.get("pciBusID", 0), props.get("pciDeviceID", 0))
        self.pci_bus_id = "{:04x}:{:02x}:{:02x}.0".format(*pci)
        self.staging_enabled = staging
        self.capabilities = Capabilities()  # set by the backend once the peers are known
        self._peers: dict[int, bool] = {}
        self._enabled: set[int] = set()
        self._lock = threading.Lock()
        # hal-side accounting (cudaMalloc is the limit; this counts what hal holds, thread-safely)
        self.account = MemoryAccount(self.total_memory, self.label)
        self._staging: _Staging | None = None
        self._signal_slab: HostSignalSlab | None = None
        self._streams: weakref.WeakSet[CudaStream] = weakref.WeakSet()
        self._ecc = _EccCounters(self.pci_bus_id)  # the baseline: counts since the backend loaded

    def ctx(self) -> _OnDevice:
        """Return a context manager making this device current (and translating CUDA errors)."""
        return _OnDevice(self.ordinal, self.label)

    def declare(self, peers: Sequence[CudaDevice]) -> None:
        """Compute peer access to ``peers`` and set :attr:`capabilities`."""
        for other in peers:
            if other.ordinal != self.ordinal:
                self._peers[other.ordinal] = bool(
                    rt.deviceCanAccessPeer(self.ordinal, other.ordinal)
                )
        p2p = any(self._peers.values())
        absent: dict[str, str] = {}
        if not p2p:
            absent["p2p"] = (
                "no other visible CUDA device"
                if not self._peers
                else "cudaDeviceCanAccessPeer is 0 for every other visible device"
            )
        no_signal = enabled_from_env() or driver_wait_value()[1]
        if no_signal:
            absent["host_signal"] = no_signal
        self.capabilities = Capabilities(
            p2p=p2p,
            ipc=True,
            timing_events=True,
            kernels=True,
            dlpack=True,
            fp64=True,
            fp16=True,
            concurrent_streams=True,
            host_signal=no_signal is None,
            absent_reasons=absent,
        )

    # -- memory --------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> MemoryImpl:
        if _ipc_loaded():
            from hal.backends.cuda import _ipc

            _ipc.reap()  # frees deferred until importers closed, now possible
        return self.account.allocate(nbytes, self._cuda_malloc, nbytes)

    def _cuda_malloc(self, nbytes: int) -> CudaMemory:
        """``cudaMalloc`` ``nbytes`` (counted by the caller); a refusal says what is free."""
        try:
            return CudaMemory(self, nbytes)
        except OutOfMemoryError as exc:
            free, total = self._mem_info()
            raise OutOfMemoryError(
                f"cannot allocate {nbytes} bytes on {self.name}: {free} of {total} bytes free ({exc.code})",
                device=self.label,
                code=exc.code,
            ) from exc

    def _release(self, nbytes: int) -> None:
        self.account.release(nbytes)

    def adopt(
        self, *, dl_device: tuple[int, int], address: int, nbytes: int, owner: object
    ) -> MemoryImpl | None:
        """Adopt memory of this CUDA device (DLPack ``kDLCUDA`` with this ordinal) zero-copy.

        The address must be device (or managed) memory of this device, as
        ``cudaPointerGetAttributes`` says; anything else is None (not ours). The producer
        exported with ``stream=None``, i.e. ordered its pending work before the legacy default
        stream (DLPack); hal's streams are non-blocking, so that stream is synchronized here
        before hal's streams may touch the memory.
        """
        if tuple(dl_device) != (_DL_CUDA, self.ordinal):
            return None
        if nbytes:
            try:
                with self.ctx():
                    attrs = rt.pointerGetAttributes(address)
                    if int(attrs.type) not in (_MEMORY_TYPE_DEVICE, _MEMORY_TYPE_MANAGED):
                        return None
                    if int(attrs.device) != self.ordinal:
                        return None
                    rt.streamSynchronize(rt.streamLegacy)
            except (ValueError, OSError):
                return None  # cudaErrorInvalidValue: not a CUDA pointer
        return AdoptedCudaMemory(self, address, nbytes, owner)

    def import_handle(self, payload: str, nbytes: int) -> MemoryImpl:
        """Map memory another process exported (``cudaIpcOpenMemHandle``; lifetimes in _ipc.py)."""
        return ImportedCudaMemory(self, payload, nbytes)

    def fence(self) -> list[Any]:
        """Record an event on every live hal stream of this device now; return the events."""
        events = []
        with self.ctx():
            for stream in list(self._streams):
                handle = stream.stream
                if handle is not None:
                    ev = cupy.cuda.Event(block=False, disable_timing=True)
                    rt.eventRecord(ev.ptr, int(handle.ptr))
                    events.append(ev)
        return events

    def alloc_host(self, nbytes: int) -> Any:
        """Page-locked host memory (CuPy's pinned memory pool): copies skip the staging ring."""
        try:
            with self.ctx():
                return cupy.cuda.alloc_pinned_memory(nbytes)
        except Exception as exc:
            if (
                isinstance(exc, OutOfMemoryError)
                or type(exc).__name__ == "OutOfMemoryError"
                or (is_cuda_error(exc) and "memory" in str(exc).lower())
            ):
                raise OutOfMemoryError(
                    f"cannot pin {nbytes} bytes of host memory: {exc}", device=self.label
                ) from exc
            raise

    def memory_in_use(self) -> int:
        return self.account.in_use

    def health(self) -> dict[str, int]:
        """ECC error counts (NVML, volatile) since the backend loaded, where the driver reports them, else {}."""
        return self._ecc.read()

    def _mem_info(self) -> tuple[int, int]:
        try:
            with self.ctx():
                free, total = rt.memGetInfo()
        except Exception:  # noqa: BLE001 - only used to word an error message
            return -1, self.total_memory
        return int(free), int(total)

    def staging(self) -> _Staging:
        """Return this device's pinned staging ring (created on first use)."""
        with self._lock:
            if self._staging is None:
                self._staging = _Staging(self)
            return self._staging

    def signal_slab(self) -> HostSignalSlab:
        """Return the pinned words of this device's host signals (created on first use)."""
        with self._lock:
            if self._signal_slab is None:
                self._signal_slab = HostSignalSlab(self.label)
            return self._signal_slab

    # -- streams and events --------------------------------------------------------------
    def create_stream(self) -> StreamImpl:
        stream = CudaStream(self)
        self._streams.add(stream)
        return stream

    def create_event(self, timing: bool) -> EventImpl:
        return CudaEvent(self, timing)

    def order_before(self, consumer: int) -> None:
        """Make stream handle ``consumer`` wait for all work enqueued so far on hal's streams here."""
        for stream in list(self._streams):
            if stream.stream is not None:
                stream.order_before(consumer)

    def synchronize(self) -> None:
        with self.ctx(), _SyncErrors(self):
            rt.deviceSynchronize()

    # -- peers ---------------------------------------------------------------------------
    def can_access_peer(self, other: DeviceImpl) -> bool:
        return isinstance(other, CudaDevice) and self._peers.get(other.ordinal, False)

    def enable_peer_access(self, other: DeviceImpl) -> None:
        """Enable access from this device to ``other`` and back (idempotent)."""
        assert isinstance(other, CudaDevice)
        for a, b in ((self, other), (other, self)):
            if b.ordinal in a._enabled or not a._peers.get(b.ordinal, False):
                continue
            with a.ctx():
                try:
                    rt.deviceEnablePeerAccess(b.ordinal)
                except Exception as exc:
                    if int(getattr(exc, "status", -1)) != _PEER_ALREADY_ENABLED:
                        raise
            a._enabled.add(b.ordinal)

    # -- kernels (hal.kernels; implemented in _kernels.py) ----------------------------------
    def compiler_info(self) -> dict[str, str]:
        from hal.backends.cuda import _kernels

        return _kernels.compiler_info(self)

    def compile(self, source: str, *, options: Sequence[str], kernels: Sequence[Any]) -> Any:
        from hal.backends.cuda import _kernels

        return _kernels.compile_program(self, source, options, kernels)

    def load_program(
        self, binary: bytes, *, source: str, options: Sequence[str], kernels: Sequence[Any]
    ) -> Any:
        from hal.backends.cuda import _kernels

        return _kernels.load_program(self, binary, kernels)

    # -- reports -------------------------------------------------------------------------
    def properties(self) -> dict[str, Any]:
        free, _ = self._mem_info()
        return {
            "cuda_ordinal": self.ordinal,
            "compute_capability": self.compute_capability,
            "multiprocessors": self.multiprocessors,
            "pci_bus_id": self.pci_bus_id,
            "memory_free": free,
            "memory_in_use": self.memory_in_use(),
            "peers": sorted(o for o, ok in self._peers.items() if ok),
            "pinned_staging": self.staging_enabled,
        }


def staging_from_env() -> bool:
    """Return whether pageable host->device copies go through pinned staging (``HAL_CUDA_STAGING``)."""
    return bool(spi.setting("HAL_CUDA_STAGING"))  # hal.ConfigError (a ValueError) names a bad value


_nvml_lock = threading.Lock()
_nvml_state: list[Any] = []  # [pynvml] once initialized, [None] when NVML is unusable here


def _nvml() -> Any:
    """Return the initialized ``pynvml`` module (initialized once per process), or None."""
    with _nvml_lock:
        if not _nvml_state:
            try:
                import pynvml

                pynvml.nvmlInit()
                _nvml_state.append(pynvml)
            except Exception:  # noqa: BLE001 - NVML is optional (no nvidia-ml-py, no driver)
                _nvml_state.append(None)
        return _nvml_state[0]


class _EccCounters:
    """``ecc_corrected``/``ecc_uncorrected`` of one board from NVML, minus the counts at load.

    Optional: needs ``pynvml`` (nvidia-ml-py) and a board with ECC enabled; any failure
    (no NVML, ECC off, a GeForce board) gives ``{}``. The NVML handle is looked up once; a
    read is two cheap driver queries (no device synchronization).
    """

    _KINDS = (
        ("ecc_corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
        ("ecc_uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
    )

    def __init__(self, pci_bus_id: str) -> None:
        self._pci = pci_bus_id
        self._handle: Any = None
        self._failed = False
        self._base = self._raw()

    def _raw(self) -> dict[str, int]:
        if self._failed:
            return {}
        nvml = _nvml()
        try:
            if nvml is None:
                raise RuntimeError("no NVML")
            if self._handle is None:
                self._handle = nvml.nvmlDeviceGetHandleByPciBusId(self._pci.encode())
            return {
                key: int(
                    nvml.nvmlDeviceGetTotalEccErrors(
                        self._handle, getattr(nvml, kind), nvml.NVML_VOLATILE_ECC
                    )
                )
                for key, kind in self._KINDS
            }
        except Exception:  # noqa: BLE001 - counters are optional; none is a valid answer
            self._failed = True
            return {}

    def read(self) -> dict[str, int]:
        """Return the counters since the backend loaded, or {} when NVML has none for this board."""
        now = self._raw()
        return {k: max(0, v - self._base.get(k, 0)) for k, v in now.items()} if self._base else {}
