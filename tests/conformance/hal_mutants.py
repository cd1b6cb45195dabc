"""Deliberately broken backends: each one breaks one promise, and the suite must catch it.

Every mutant is a real backend (the CPU emulator's SPI classes with one method changed),
registered through the ``hal.backends`` entry point of a fixture distribution (see
conftest.py), exactly like a vendor plugin. ``MUTANTS`` maps each backend name to the
requirement ID the suite must fail it on, and says what is broken.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from hal import Capabilities, OutOfMemoryError
from hal.backends.cpu._backend import CpuBackend, CpuDevice, CpuEvent, CpuMemory, CpuStream
from hal.plugins import BackendRegistry, hookimpl
from hal.spi import DeviceImpl, EventImpl, HostSignalImpl, MemoryImpl

CAPACITY = 256 << 20


# -- streams ----------------------------------------------------------------------------------
class H2DShortStream(CpuStream):
    """Host-to-device copies drop their last byte (off by one)."""

    def copy_from_host(self, dst: MemoryImpl, dst_offset: int, src: memoryview, nbytes: int) -> None:
        super().copy_from_host(dst, dst_offset, src, nbytes - 1 if nbytes > 1 else nbytes)


class D2HShiftStream(CpuStream):
    """Device-to-host copies read one byte too far (off by one), where the buffer allows."""

    def copy_to_host(self, dst: memoryview, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        shifted = src_offset + 1 if src_offset + 1 + nbytes <= src.nbytes else src_offset
        super().copy_to_host(dst, src, shifted, nbytes)


class ForwardCopyStream(CpuStream):
    """Same-buffer copies run forward in 8-byte chunks: memmove semantics broken on overlap."""

    def copy(self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
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

    def copy_peer(self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        CpuStream.copy(self, dst, 0, src, src_offset, nbytes)


class PeerEagerStream(CpuStream):
    """Peer copies run at once on the calling thread instead of in stream order."""

    def copy_peer(self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        assert isinstance(dst, CpuMemory) and isinstance(src, CpuMemory)
        np.copyto(dst.bytes(dst_offset, nbytes), src.bytes(src_offset, nbytes))


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


# -- memory -----------------------------------------------------------------------------------
class LeakyMemory(CpuMemory):
    """free() drops the storage but never returns the bytes to the device's accounting."""

    def free(self) -> None:
        self.storage = None


class DlpackOffsetMemory(CpuMemory):
    """DLPack export ignores the view's byte offset."""

    def dlpack(self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any) -> Any:
        return super().dlpack(dtype=dtype, shape=shape, offset=0, stream=stream, max_version=max_version)


class NoDlpackMemory(CpuMemory):
    """No DLPack export at all (the SPI default)."""

    def dlpack_device(self) -> tuple[int, int]:
        return MemoryImpl.dlpack_device(self)

    def dlpack(self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any) -> Any:
        return MemoryImpl.dlpack(self, dtype=dtype, shape=shape, offset=offset, stream=stream, max_version=max_version)


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
        with self._lock:
            free = self.total_memory - self._used
            if nbytes > free:
                raise OutOfMemoryError(f"cannot allocate {nbytes} bytes: {free} free", device=self.label)
            self._used += nbytes
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
        if nbytes > self.total_memory - self._used:
            mem = CpuMemory.__new__(CpuMemory)
            mem.device, mem.nbytes, mem.storage = self, nbytes, np.empty(1, np.uint8)
            return mem
        return super().alloc(nbytes)


class LeakOnOomDevice(MutantDevice):
    """A failed allocation leaks 4 KiB of accounting (a side effect of a rejected call)."""

    def alloc(self, nbytes: int) -> MemoryImpl:
        if nbytes > self.total_memory - self._used:
            with self._lock:
                self._used += 4096
        return super().alloc(nbytes)


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

    caps = {"p2p": False, "absent_reasons": {"p2p": "no peer links on this board", "ipc": "one process"}}


def _backend(name: str, device_cls: type[CpuDevice]) -> type[CpuBackend]:
    def __init__(self: CpuBackend) -> None:
        raw = os.environ.get("HAL_CPU_JITTER")
        jitter = int(raw) if raw else None
        self._devices = [device_cls(i, CAPACITY, jitter) for i in range(2)]

    def devices(self: CpuBackend) -> Sequence[DeviceImpl]:
        return self._devices

    return type(f"Backend_{name}", (CpuBackend,), {"name": name, "__init__": __init__, "devices": devices})


def _dev(**attrs: Any) -> type[MutantDevice]:
    return type("Dev", (MutantDevice,), attrs)


#: backend name -> (device class, requirement the suite must fail, what is broken)
MUTANTS: dict[str, tuple[type[CpuDevice], str, str]] = {
    "mut_h2d_short": (_dev(stream_cls=H2DShortStream), "MEM-COPY-H2D", "H2D copies drop the last byte"),
    "mut_d2h_shift": (_dev(stream_cls=D2HShiftStream), "MEM-COPY-D2H", "D2H copies read one byte late"),
    "mut_d2d_forward": (_dev(stream_cls=ForwardCopyStream), "MEM-COPY-OVERLAP", "overlapping copies are not memmove"),
    "mut_memset_long": (_dev(stream_cls=MemsetLongStream), "MEM-MEMSET", "memset writes one byte too many"),
    "mut_alias": (AliasDevice, "MEM-ALLOC", "allocations overlap"),
    "mut_oom_silent": (SilentOomDevice, "MEM-OOM", "allocation beyond capacity silently succeeds"),
    "mut_oom_leak": (LeakOnOomDevice, "MEM-OOM", "a failed allocation leaks accounting"),
    "mut_free_leak": (_dev(memory_cls=LeakyMemory), "MEM-CLOSE", "close() never releases the memory"),
    "mut_reorder": (_dev(stream_cls=ReorderStream), "STREAM-IN-ORDER", "a stream swaps adjacent operations"),
    "mut_sync_early": (_dev(stream_cls=SyncEarlyStream), "STREAM-SYNC", "synchronize returns before the work is done"),
    "mut_query_true": (_dev(stream_cls=QueryTrueStream), "STREAM-QUERY", "query() is always True"),
    "mut_event_nowait": (_dev(stream_cls=NoWaitStream), "EVENT-CROSS-STREAM", "Stream.wait(event) does not wait"),
    "mut_host_nowait": (_dev(stream_cls=NoHostWaitStream), "STREAM-HOST-SIGNAL", "wait_host() does not wait"),
    "mut_event_local": (_dev(stream_cls=LocalWaitStream), "EVENT-CROSS-DEVICE", "waits ignore other devices' events"),
    "mut_event_early": (_dev(event_cls=EarlyEvent), "EVENT-SYNC", "Event.synchronize returns at once"),
    "mut_timing_back": (_dev(event_cls=BackwardsEvent), "EVENT-TIMING-MONOTONIC", "timing events go backwards"),
    "mut_timing_units": (_dev(event_cls=MicrosecondEvent), "EVENT-TIMING-PLAUSIBLE", "elapsed_ms in microseconds"),
    "mut_peer_lies": (NoPeerLiesDevice, "P2P-QUERY", "reports a peer path while declaring p2p absent"),
    "mut_peer_offset": (_dev(stream_cls=PeerOffsetStream), "P2P-COPY", "peer copies ignore dst_offset"),
    "mut_peer_eager": (_dev(stream_cls=PeerEagerStream), "P2P-COPY", "peer copies ignore stream order"),
    "mut_dlpack_offset": (_dev(memory_cls=DlpackOffsetMemory), "DLPACK-VALUES", "DLPack export ignores the offset"),
    "mut_dlpack_missing": (_dev(memory_cls=NoDlpackMemory), "DLPACK-CONSISTENT", "declares dlpack but cannot export"),
}

#: Correct backends built the same way: a control, and one declaring capabilities absent with reasons.
CONTROLS: dict[str, type[CpuDevice]] = {
    "mut_control": MutantDevice,
    "ok_declared_absent": _dev(
        memory_cls=NoDlpackMemory,
        caps={"dlpack": False, "timing_events": False,
              "absent_reasons": {"dlpack": "fixture: no DLPack on this board", "ipc": "one process"}},
    ),
}


class _Plugin:
    @hookimpl
    def hal_register_backends(self, registry: BackendRegistry) -> None:
        for name, (cls, _, _) in MUTANTS.items():
            registry.add(_backend(name, cls))
        for name, cls in CONTROLS.items():
            registry.add(_backend(name, cls))


plugin = _Plugin()
