"""Deliberately broken backends: each one breaks one promise, and the suite must catch it.

Every mutant is a real backend (the CPU emulator's SPI classes with one method changed),
registered through the ``hal.backends`` entry point of a fixture distribution (see
conftest.py), exactly like a vendor plugin. ``MUTANTS`` maps each backend name to the
requirement ID the suite must fail it on, and says what is broken.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hal import Capabilities, OutOfMemoryError
from hal.backends.cpu._backend import (
    AdoptedMemory,
    CpuBackend,
    CpuDevice,
    CpuEvent,
    CpuMemory,
    CpuStream,
)
from hal.backends.cpu._worker import Mark
from hal.plugins import BackendRegistry, hookimpl
from hal.spi import DeviceImpl, EventImpl, HostSignalImpl, MemoryImpl

CAPACITY = 256 << 20

#: mutant backend name -> whether the suite caught it, filled in by the tests (the catch rate)
CATCHES: dict[str, bool] = {}


# -- streams ----------------------------------------------------------------------------------
class H2DShortStream(CpuStream):
    """Host-to-device copies drop their last byte (off by one)."""

    def copy_from_host(
        self, dst: MemoryImpl, dst_offset: int, src: memoryview, nbytes: int
    ) -> None:
        super().copy_from_host(dst, dst_offset, src, nbytes - 1 if nbytes > 1 else nbytes)


class D2HShiftStream(CpuStream):
    """Device-to-host copies read one byte too far (off by one), where the buffer allows."""

    def copy_to_host(self, dst: memoryview, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        shifted = src_offset + 1 if src_offset + 1 + nbytes <= src.nbytes else src_offset
        super().copy_to_host(dst, src, shifted, nbytes)


class ForwardCopyStream(CpuStream):
    """Same-buffer copies run forward in 8-byte chunks: memmove semantics broken on overlap."""

    def copy(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        assert isinstance(dst, CpuMemory) and isinstance(src, CpuMemory)

        def run() -> None:
            for i in range(0, nbytes, 8):
                k = min(8, nbytes - i)
                dst.bytes(dst_offset + i, k)[:] = src.bytes(src_offset + i, k)

        self.worker.submit(run)


class MemsetLongStream(CpuStream):
    """memset writes one byte too many (where the buffer allows)."""

    def memset(self, dst: MemoryImpl, offset: int, value: int, nbytes: int) -> None:
        super().memset(dst, offset, value, min(nbytes + 1, dst.nbytes - offset))


class ReorderStream(CpuStream):
    """Swaps each pair of consecutive data operations (flushed before record/wait/sync)."""

    def __init__(self, device: CpuDevice, ordinal: int) -> None:
        super().__init__(device, ordinal)
        self._held: Any = None

    def _data(self, op: Any) -> None:
        if self._held is None:
            self._held = op
        else:
            held, self._held = self._held, None
            op()
            held()

    def _flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            held()

    def copy_from_host(self, *a: Any) -> None:
        self._data(lambda: CpuStream.copy_from_host(self, *a))

    def copy_to_host(self, *a: Any) -> None:
        self._data(lambda: CpuStream.copy_to_host(self, *a))

    def copy(self, *a: Any) -> None:
        self._data(lambda: CpuStream.copy(self, *a))

    def memset(self, *a: Any) -> None:
        self._data(lambda: CpuStream.memset(self, *a))

    def record(self, event: EventImpl) -> None:
        self._flush()
        super().record(event)

    def wait(self, event: EventImpl) -> None:
        self._flush()
        super().wait(event)

    def synchronize(self) -> None:
        self._flush()
        super().synchronize()

    def query(self) -> bool:
        self._flush()
        return super().query()

    def close(self) -> None:
        self._flush()
        super().close()


class SyncEarlyStream(CpuStream):
    """synchronize() returns at once, before the work is done."""

    def synchronize(self) -> None:
        return None


class QueryTrueStream(CpuStream):
    """query() always says the work is done."""

    def query(self) -> bool:
        return True


class NoWaitStream(CpuStream):
    """wait(event) does nothing: cross-stream ordering is lost."""

    def wait(self, event: EventImpl) -> None:
        return None


class _NoWait(HostSignalImpl):
    def set(self) -> None:
        return None


class NoHostWaitStream(CpuStream):
    """wait_host() enqueues nothing: the work after it runs before the host sets the signal."""

    def wait_host(self) -> HostSignalImpl:
        return _NoWait()


class LocalWaitStream(CpuStream):
    """wait(event) ignores events recorded on another device."""

    def record(self, event: EventImpl) -> None:
        event.recorded_on = self.device  # type: ignore[attr-defined]
        super().record(event)

    def wait(self, event: EventImpl) -> None:
        if getattr(event, "recorded_on", self.device) is self.device:
            super().wait(event)


class PeerOffsetStream(CpuStream):
    """Peer copies ignore the destination offset."""

    def copy_peer(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        CpuStream.copy(self, dst, 0, src, src_offset, nbytes)


class PeerEagerStream(CpuStream):
    """Peer copies run at once on the calling thread instead of in stream order."""

    def copy_peer(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        assert isinstance(dst, CpuMemory) and isinstance(src, CpuMemory)
        np.copyto(dst.bytes(dst_offset, nbytes), src.bytes(src_offset, nbytes))


# -- issue #14: what vendors really get wrong -------------------------------------------------
class CallTimeStream(CpuStream):
    """record() stamps the event when it is called, not when the stream reaches it."""

    def record(self, event: EventImpl) -> None:
        assert isinstance(event, CpuEvent)
        mark = Mark()
        mark.time = time.perf_counter()
        event.mark = mark
        self.worker.submit(mark.done.set)


class LazyWaitStream(CpuStream):
    """wait(event) looks the event up only when the stream reaches the wait."""

    def wait(self, event: EventImpl) -> None:
        assert isinstance(event, CpuEvent)

        def run() -> None:
            mark = event.mark
            if mark is not None:
                mark.done.wait()

        self.worker.submit(run)


class _Dropper:
    """A worker proxy whose queued operations turn into no-ops once ``dropped`` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dropped = False

    def submit(self, op: Any, **kwargs: Any) -> None:
        self.inner.submit(lambda: None if self.dropped else op(), **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class GcDropStream(CpuStream):
    """close() without a synchronize first (the garbage collector's path) drops queued work."""

    def __init__(self, device: CpuDevice, ordinal: int) -> None:
        super().__init__(device, ordinal)
        self.dropper = _Dropper(self.worker)
        setattr(self, "worker", self.dropper)  # noqa: B010 - the proxy stands in for the worker

    def close(self) -> None:
        self.dropper.dropped = True
        super().close()


_CHUNK = 4 << 20


def _chunked(nbytes: int) -> int:
    """Bytes a chunk loop with an off-by-one moves: the partial last chunk is lost above 4 MiB."""
    return nbytes if nbytes <= _CHUNK else nbytes // _CHUNK * _CHUNK


class TruncateStream(CpuStream):
    """Copies and memsets above 4 MiB lose their partial last chunk."""

    def copy_from_host(
        self, dst: MemoryImpl, dst_offset: int, src: memoryview, nbytes: int
    ) -> None:
        super().copy_from_host(dst, dst_offset, src, _chunked(nbytes))

    def copy_to_host(self, dst: memoryview, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        super().copy_to_host(dst, src, src_offset, _chunked(nbytes))

    def copy(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        super().copy(dst, dst_offset, src, src_offset, _chunked(nbytes))

    def memset(self, dst: MemoryImpl, offset: int, value: int, nbytes: int) -> None:
        super().memset(dst, offset, value, _chunked(nbytes))


class BlockingQueryStream(CpuStream):
    """query() waits for the work to finish, then says True."""

    def query(self) -> bool:
        self.worker.synchronize()
        return True


class DoNothingStream(CpuStream):
    """Copies, memsets, records and waits do nothing at all."""

    def copy_from_host(self, *a: Any) -> None:
        return None

    def copy_to_host(self, *a: Any) -> None:
        return None

    def copy(self, *a: Any) -> None:
        return None

    copy_peer = copy

    def memset(self, *a: Any) -> None:
        return None

    def record(self, event: EventImpl) -> None:
        return None

    def wait(self, event: EventImpl) -> None:
        return None

    def wait_host(self) -> HostSignalImpl:
        return _NoWait()


class LyingStream(CpuStream):
    """Does the work late (on its worker, after a delay) but says it is done at once."""

    def __init__(self, device: CpuDevice, ordinal: int) -> None:
        super().__init__(device, ordinal)
        inner = self.worker._worker
        inner._rng = None  # no jitter: a fixed delay instead,
        inner.slowdown = 1.0 + 1e-9  # and never inline: the work always runs late on the worker

    def _late(self) -> None:
        self.worker.submit(lambda: time.sleep(0.0002))

    def copy_from_host(self, *a: Any) -> None:
        self._late()
        super().copy_from_host(*a)

    def copy_to_host(self, *a: Any) -> None:
        self._late()
        super().copy_to_host(*a)

    def copy(self, *a: Any) -> None:
        self._late()
        super().copy(*a)

    copy_peer = copy

    def memset(self, *a: Any) -> None:
        self._late()
        super().memset(*a)

    def record(self, event: EventImpl) -> None:
        assert isinstance(event, CpuEvent)
        event.mark = Mark()
        event.mark.fire()  # "complete" before the work before it

    def wait(self, event: EventImpl) -> None:
        return None

    def wait_host(self) -> HostSignalImpl:
        return _NoWait()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


# -- events -----------------------------------------------------------------------------------
class EarlyEvent(CpuEvent):
    """synchronize() returns at once and query() is always True."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class BackwardsEvent(CpuEvent):
    """elapsed_ms has its sign flipped: time runs backwards."""

    def elapsed_ms(self, start: EventImpl) -> float:
        return -super().elapsed_ms(start)


class MicrosecondEvent(CpuEvent):
    """elapsed_ms reports microseconds (a unit error, 1000x too large)."""

    def elapsed_ms(self, start: EventImpl) -> float:
        return super().elapsed_ms(start) * 1000.0


class SecondsEvent(CpuEvent):
    """elapsed_ms reports seconds (a unit error, 1000x too small)."""

    def elapsed_ms(self, start: EventImpl) -> float:
        return super().elapsed_ms(start) / 1000.0


class DoNothingEvent(CpuEvent):
    """Never waits, always done, no time passes."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_ms(self, start: EventImpl) -> float:
        return 0.0


class LyingEvent(CpuEvent):
    """Says every interval took 1 ms."""

    def elapsed_ms(self, start: EventImpl) -> float:
        return 1.0


# -- memory -----------------------------------------------------------------------------------
class LeakyMemory(CpuMemory):
    """free() drops the storage but never returns the bytes to the device's accounting."""

    def free(self) -> None:
        self.storage = None


class DlpackOffsetMemory(CpuMemory):
    """DLPack export ignores the view's byte offset."""

    def dlpack(
        self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any
    ) -> Any:
        return super().dlpack(
            dtype=dtype, shape=shape, offset=0, stream=stream, max_version=max_version
        )


class NoDlpackMemory(CpuMemory):
    """No DLPack export at all (the SPI default)."""

    def dlpack_device(self) -> tuple[int, int]:
        return MemoryImpl.dlpack_device(self)

    def dlpack(
        self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any
    ) -> Any:
        return MemoryImpl.dlpack(
            self, dtype=dtype, shape=shape, offset=offset, stream=stream, max_version=max_version
        )


class SnapshotExportMemory(CpuMemory):
    """export_handle() shares a copy of the memory taken at the export, not the memory itself."""

    def export_handle(self) -> str:
        fd = os.memfd_create(
            "hal-snapshot", os.MFD_CLOEXEC
        )  # kept open: the importer opens it by pid:fd
        os.ftruncate(fd, max(1, self.nbytes))
        os.pwrite(fd, self.bytes(0, self.nbytes).tobytes(), 0)
        st = os.fstat(fd)
        return f"{os.getpid()}:{fd}:{st.st_dev}:{st.st_ino}"


class WrongDlpackDeviceMemory(CpuMemory):
    """__dlpack_device__ names kDLCUDA for host memory (the capsule says kDLCPU)."""

    def dlpack_device(self) -> tuple[int, int]:
        return (2, 0)


_KDL_EXT = 12  # kDLExtDev: a device type the host cannot read


def _retag(capsule: Any, device_type: int, device_id: int) -> Any:
    """Rewrite an unconsumed capsule's DLPack device (as a non-CPU backend's export would say)."""
    from hal import _dlpack

    api = _dlpack._api
    if api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        tensor = _dlpack._ManagedVersioned.from_address(
            api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        ).dl_tensor
    else:
        tensor = _dlpack._Managed.from_address(
            api.PyCapsule_GetPointer(capsule, b"dltensor")
        ).dl_tensor
    tensor.device.device_type = device_type
    tensor.device.device_id = device_id
    return capsule


class ExtDeviceMemory(CpuMemory):
    """Honest export as a device type the host cannot read (kDLExtDev), read back through adopt()."""

    def dlpack_device(self) -> tuple[int, int]:
        return (_KDL_EXT, self.device.index)

    def dlpack(
        self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any
    ) -> Any:
        capsule = super().dlpack(
            dtype=dtype, shape=shape, offset=offset, stream=stream, max_version=max_version
        )
        return _retag(capsule, _KDL_EXT, self.device.index)


class ExtDeviceOffsetMemory(ExtDeviceMemory):
    """The kDLExtDev export ignores the view's byte offset: caught only if values are read back."""

    def dlpack(
        self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any
    ) -> Any:
        return super().dlpack(
            dtype=dtype, shape=shape, offset=0, stream=stream, max_version=max_version
        )


# -- devices ----------------------------------------------------------------------------------
class MutantDevice(CpuDevice):
    """A CPU-emulator device whose stream, event and memory classes are swappable."""

    stream_cls: type[CpuStream] = CpuStream
    event_cls: type[CpuEvent] = CpuEvent
    memory_cls: type[CpuMemory] = CpuMemory
    caps: dict[str, Any] = {}

    def __init__(self, index: int, capacity: int, jitter_seed: int | None) -> None:
        super().__init__(index, capacity, jitter_seed)
        if self.caps:
            caps: Capabilities = self.capabilities  # type: ignore[has-type]
            self.capabilities = dataclasses.replace(caps, **self.caps)

    def alloc(self, nbytes: int) -> MemoryImpl:
        self.account.reserve(nbytes)
        return self.memory_cls(self, nbytes)

    def create_stream(self) -> CpuStream:
        stream = self.stream_cls(self, next(self._ordinals))
        self._streams.add(stream)
        return stream

    def create_event(self, timing: bool) -> EventImpl:
        return self.event_cls(timing)


class SilentOomDevice(MutantDevice):
    """Allocations beyond the capacity succeed silently (nothing is accounted)."""

    def alloc(self, nbytes: int) -> MemoryImpl:
        if nbytes > self.account.free:
            mem = CpuMemory.__new__(CpuMemory)
            mem.device, mem.nbytes, mem.storage = self, nbytes, np.empty(1, np.uint8)
            return mem
        return super().alloc(nbytes)


class LeakOnOomDevice(MutantDevice):
    """A failed allocation leaks 4 KiB of accounting (a side effect of a rejected call)."""

    def alloc(self, nbytes: int) -> MemoryImpl:
        if nbytes > self.account.free:
            self.account.release(-4096)  # counts 4 KiB more in use
        return super().alloc(nbytes)


class IpcDevice(MutantDevice):
    """Memory in memfds, shareable with other processes (``ipc``), whatever HAL_CPU_IPC says."""

    def __init__(self, index: int, capacity: int, jitter_seed: int | None) -> None:
        super().__init__(index, capacity, jitter_seed)
        self.ipc = hasattr(os, "memfd_create")
        caps: Capabilities = self.capabilities
        reasons = {k: v for k, v in caps.absent_reasons.items() if k != "ipc"}
        if self.ipc:
            self.capabilities = dataclasses.replace(caps, ipc=True, absent_reasons=reasons)


class AliasDevice(MutantDevice):
    """Allocations come from an arena and overlap their neighbours by half."""

    def __init__(self, index: int, capacity: int, jitter_seed: int | None) -> None:
        super().__init__(index, capacity, jitter_seed)
        self._arena = np.empty(64 << 20, np.uint8)
        self._pos = 0

    def alloc(self, nbytes: int) -> MemoryImpl:
        mem = super().alloc(nbytes)
        assert isinstance(mem, CpuMemory)
        if nbytes <= 1 << 20:
            if self._pos + nbytes > self._arena.size:
                self._pos = 0
            mem.storage = self._arena[self._pos : self._pos + nbytes]
            self._pos += nbytes // 2 + 1
        return mem


class NoPeerLiesDevice(MutantDevice):
    """Declares p2p absent but still reports peer access (so copy_path says 'peer')."""

    caps = {
        "p2p": False,
        "absent_reasons": {"p2p": "no peer links on this board", "ipc": "one process"},
    }


class RacyAccountingDevice(MutantDevice):
    """Memory accounting without a lock: read, (a driver call), write."""

    def alloc(self, nbytes: int) -> MemoryImpl:
        free = self.total_memory - self._racy
        if nbytes > free:
            raise OutOfMemoryError(
                f"cannot allocate {nbytes} bytes: {free} free", device=self.label
            )
        used = self._racy
        time.sleep(0.0001)
        self._racy = used + nbytes
        return self.memory_cls(self, nbytes)

    _racy = 0

    def _release(self, nbytes: int) -> None:
        used = self._racy
        time.sleep(0.0001)
        self._racy = used - nbytes

    def memory_in_use(self) -> int:
        return self._racy


class OneStreamSyncDevice(MutantDevice):
    """Device.synchronize waits for one of its streams only."""

    def synchronize(self) -> None:
        streams = list(self._streams)
        if streams:
            streams[0].synchronize()


class OneWayPeerDevice(MutantDevice):
    """Declares p2p, but peer access works one way only (0 -> 1)."""

    def can_access_peer(self, other: DeviceImpl) -> bool:
        return isinstance(other, CpuDevice) and self.index < other.index


class ExtDevice(MutantDevice):
    """Adopts its own kDLExtDev exports (the way a GPU backend adopts kDLCUDA memory)."""

    memory_cls = ExtDeviceMemory

    def adopt(
        self, *, dl_device: tuple[int, int], address: int, nbytes: int, owner: object
    ) -> MemoryImpl | None:
        if dl_device != (_KDL_EXT, self.index):
            return None
        return AdoptedMemory(self, address, nbytes, owner)


_NOTHING_CAPS = {
    "kernels": False,
    "absent_reasons": {"kernels": "fixture: no kernels"},
}


def _backend(name: str, device_cls: type[CpuDevice]) -> type[CpuBackend]:
    def __init__(self: CpuBackend) -> None:
        raw = os.environ.get("HAL_CPU_JITTER")
        jitter = int(raw) if raw else None
        self._devices = [device_cls(i, CAPACITY, jitter) for i in range(2)]

    def devices(self: CpuBackend) -> Sequence[DeviceImpl]:
        return self._devices

    return type(
        f"Backend_{name}", (CpuBackend,), {"name": name, "__init__": __init__, "devices": devices}
    )


def _dev(**attrs: Any) -> type[MutantDevice]:
    return type("Dev", (MutantDevice,), attrs)


def _ipc_dev(**attrs: Any) -> type[MutantDevice]:
    return type("Dev", (IpcDevice,), attrs)  # MEM-IPC-* run on it too


#: backend name -> (device class, requirement the suite must fail, what is broken)
MUTANTS: dict[str, tuple[type[CpuDevice], str, str]] = {
    "mut_h2d_short": (
        _dev(stream_cls=H2DShortStream),
        "MEM-COPY-H2D",
        "H2D copies drop the last byte",
    ),
    "mut_d2h_shift": (
        _dev(stream_cls=D2HShiftStream),
        "MEM-COPY-D2H",
        "D2H copies read one byte late",
    ),
    "mut_d2d_forward": (
        _dev(stream_cls=ForwardCopyStream),
        "MEM-COPY-OVERLAP",
        "overlapping copies are not memmove",
    ),
    "mut_memset_long": (
        _dev(stream_cls=MemsetLongStream),
        "MEM-MEMSET",
        "memset writes one byte too many",
    ),
    "mut_alias": (AliasDevice, "MEM-ALLOC", "allocations overlap"),
    "mut_oom_silent": (SilentOomDevice, "MEM-OOM", "allocation beyond capacity silently succeeds"),
    "mut_oom_leak": (LeakOnOomDevice, "MEM-OOM", "a failed allocation leaks accounting"),
    "mut_free_leak": (
        _dev(memory_cls=LeakyMemory),
        "MEM-CLOSE",
        "close() never releases the memory",
    ),
    "mut_reorder": (
        _dev(stream_cls=ReorderStream),
        "STREAM-IN-ORDER",
        "a stream swaps adjacent operations",
    ),
    "mut_sync_early": (
        _dev(stream_cls=SyncEarlyStream),
        "STREAM-SYNC",
        "synchronize returns before the work is done",
    ),
    "mut_query_true": (_dev(stream_cls=QueryTrueStream), "STREAM-QUERY", "query() is always True"),
    "mut_event_nowait": (
        _dev(stream_cls=NoWaitStream),
        "EVENT-CROSS-STREAM",
        "Stream.wait(event) does not wait",
    ),
    "mut_host_nowait": (
        _dev(stream_cls=NoHostWaitStream),
        "STREAM-HOST-SIGNAL",
        "wait_host() does not wait",
    ),
    # issue #14: the classes of bugs a planted-bug campaign found the suite missing
    "mut_timing_seconds": (
        _dev(event_cls=SecondsEvent),
        "EVENT-TIMING-BOUNDS",
        "elapsed_ms in seconds",
    ),
    "mut_timing_at_call": (
        _dev(stream_cls=CallTimeStream),
        "EVENT-TIMING-EXECUTION",
        "timestamps taken when record() is called",
    ),
    "mut_wait_lazy": (
        _dev(stream_cls=LazyWaitStream),
        "EVENT-WAIT-SNAPSHOT",
        "wait(event) looks the event up when the stream reaches it",
    ),
    "mut_gc_drop": (
        _dev(stream_cls=GcDropStream),
        "STREAM-GC",
        "a garbage-collected stream drops its queued work",
    ),
    "mut_large_truncate": (
        _dev(stream_cls=TruncateStream),
        "MEM-COPY-LARGE",
        "copies above 4 MiB lose their tail",
    ),
    "mut_query_blocks": (
        _dev(stream_cls=BlockingQueryStream),
        "STREAM-QUERY-NONBLOCKING",
        "query() blocks",
    ),
    "mut_dlpack_devtype": (
        _dev(memory_cls=WrongDlpackDeviceMemory),
        "DLPACK-DEVICE",
        "__dlpack_device__ names the wrong device type",
    ),
    "mut_dlpack_ext_offset": (
        type("Dev", (ExtDevice,), {"memory_cls": ExtDeviceOffsetMemory}),
        "DLPACK-VALUES",
        "a non-host DLPack export ignores the offset",
    ),
    "mut_accounting_race": (
        RacyAccountingDevice,
        "MEM-THREADS",
        "memory accounting without a lock",
    ),
    "mut_devsync_one": (
        OneStreamSyncDevice,
        "STREAM-DEVICE-SYNC",
        "Device.synchronize waits for one stream",
    ),
    "mut_ipc_snapshot": (
        type("Dev", (IpcDevice,), {"memory_cls": SnapshotExportMemory}),
        "MEM-IPC-SHARE",
        "export_handle shares a snapshot copy, not the memory itself",
    ),
    "mut_peer_oneway": (OneWayPeerDevice, "P2P-QUERY", "peer access declared, but one way only"),
    "mut_event_local": (
        _dev(stream_cls=LocalWaitStream),
        "EVENT-CROSS-DEVICE",
        "waits ignore other devices' events",
    ),
    "mut_event_early": (
        _dev(event_cls=EarlyEvent),
        "EVENT-SYNC",
        "Event.synchronize returns at once",
    ),
    "mut_timing_back": (
        _dev(event_cls=BackwardsEvent),
        "EVENT-TIMING-MONOTONIC",
        "timing events go backwards",
    ),
    "mut_timing_units": (
        _dev(event_cls=MicrosecondEvent),
        "EVENT-TIMING-PLAUSIBLE",
        "elapsed_ms in microseconds",
    ),
    "mut_peer_lies": (
        NoPeerLiesDevice,
        "P2P-QUERY",
        "reports a peer path while declaring p2p absent",
    ),
    "mut_peer_offset": (
        _dev(stream_cls=PeerOffsetStream),
        "P2P-COPY",
        "peer copies ignore dst_offset",
    ),
    "mut_peer_eager": (
        _dev(stream_cls=PeerEagerStream),
        "P2P-COPY",
        "peer copies ignore stream order",
    ),
    "mut_dlpack_offset": (
        _dev(memory_cls=DlpackOffsetMemory),
        "DLPACK-VALUES",
        "DLPack export ignores the offset",
    ),
    "mut_dlpack_missing": (
        _dev(memory_cls=NoDlpackMemory),
        "DLPACK-CONSISTENT",
        "declares dlpack but cannot export",
    ),
}

#: Correct backends built the same way: a control, and one declaring capabilities absent with reasons.
CONTROLS: dict[str, type[CpuDevice]] = {
    "mut_control": IpcDevice,  # with ipc, so that it passes MEM-IPC-* (the mutants' requirements)
    "ok_ext_dlpack": ExtDevice,
    "ok_declared_absent": _dev(
        memory_cls=NoDlpackMemory,
        caps={
            "dlpack": False,
            "timing_events": False,
            "absent_reasons": {"dlpack": "fixture: no DLPack on this board", "ipc": "one process"},
        },
    ),
}


#: The suite's power: backends that get everything about data, ordering and time wrong.
POWER: dict[str, type[CpuDevice]] = {
    "mut_do_nothing": _ipc_dev(
        stream_cls=DoNothingStream, event_cls=DoNothingEvent, caps=_NOTHING_CAPS
    ),
    "mut_lying": _ipc_dev(
        stream_cls=LyingStream,
        event_cls=LyingEvent,
        caps=_NOTHING_CAPS,
        synchronize=lambda self: None,
        settle=lambda self: None,
    ),
}


class _Plugin:
    @hookimpl
    def hal_register_backends(self, registry: BackendRegistry) -> None:
        for name, (cls, _, _) in MUTANTS.items():
            registry.add(_backend(name, cls))
        for name, cls in {**CONTROLS, **POWER}.items():
            registry.add(_backend(name, cls))


plugin = _Plugin()
