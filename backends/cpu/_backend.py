"""The CPU emulator: each virtual device owns NumPy memory with its own accounting."""

from __future__ import annotations

import ctypes
import functools
import itertools
import mmap
import os
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from hal import HalError, OutOfMemoryError, __version__, spi
from hal.backends.cpu import _arena, _faults, _kernels, _native
from hal.backends.cpu._options import CpuOptions
from hal.backends.cpu._worker import HostWait, Mark, Worker
from hal.spi import (
    BackendImpl,
    Capabilities,
    DeviceImpl,
    EventImpl,
    HostSignalImpl,
    MemoryAccount,
    MemoryImpl,
    StreamImpl,
)

__all__ = ["CpuBackend", "CpuDevice", "parse_size"]


def parse_size(text: str, name: str) -> int:
    """Parse ``"512M"``, ``"4G"``, ``"1048576"``, ``"64KiB"`` into bytes; raise ValueError naming ``name``.

    The one size parser of hal (:func:`hal.spi.parse_size`); its errors are
    :class:`hal.ConfigError` (a ``ValueError``).
    """
    return spi.parse_size(text, name)


class CpuMemory(MemoryImpl):
    """An allocation: a NumPy byte array: in the process's shared arena from 64 KiB
    (``HAL_CPU_ARENA``, backends/cpu/_arena.py), in a memfd of its own with ``HAL_CPU_IPC=1`` (so
    other processes can import it), else private NumPy memory."""

    __slots__ = ("addr", "device", "fd", "nbytes", "storage")

    def __init__(self, device: CpuDevice, nbytes: int) -> None:
        self.device = device
        self.nbytes = nbytes
        self.fd = -1
        self.addr = 0  # the storage's address (the native runtime's copies and kernels use it)
        try:
            self.storage: np.ndarray[Any, Any] | None
            if device.ipc:
                self.fd = os.memfd_create(f"hal-{device.label}", os.MFD_CLOEXEC)
                os.ftruncate(self.fd, max(1, nbytes))
                self.storage = np.frombuffer(
                    mmap.mmap(self.fd, max(1, nbytes)), dtype=np.uint8, count=nbytes
                )
            else:  # the arena's, else (small, no room, no arena) private
                self.storage = _arena.storage(device.arena, nbytes)
                if self.storage is None:
                    self.storage = np.empty(nbytes, dtype=np.uint8)
            self.addr = self.storage.ctypes.data
        except MemoryError as exc:
            self._close_fd()
            raise OutOfMemoryError(f"host refused {nbytes} bytes", device=device.label) from exc
        except OSError as exc:
            self._close_fd()
            raise OutOfMemoryError(
                f"host refused {nbytes} bytes of shared memory: {exc}", device=device.label
            ) from exc

    def _close_fd(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(
                fd
            )  # the memory lives on while mapped (here, by queued work, or by an importer)

    def free(self) -> None:
        if self.storage is not None:
            self.storage = None
            self._close_fd()
            self.device._release(self.nbytes)

    def export_handle(self) -> str:
        """``pid:fd:dev:inode`` of the memfd: an importer of this user opens ``/proc/<pid>/fd/<fd>``."""
        if self.fd < 0:
            raise NotImplementedError(
                f"{self.device.label}: set HAL_CPU_IPC=1 for memory other processes can map"
            )
        st = os.fstat(self.fd)
        return f"{os.getpid()}:{self.fd}:{st.st_dev}:{st.st_ino}"

    def bytes(self, offset: int, nbytes: int) -> np.ndarray[Any, Any]:
        """Return the live byte range (raises if freed)."""
        if self.storage is None:
            raise RuntimeError("memory was freed while work still used it")
        return self.storage[offset : offset + nbytes]

    def dlpack_device(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    def dlpack(
        self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any
    ) -> Any:
        # the work enqueued so far has landed; streams waiting for a host signal count as
        # settled (their later work has not started), so an exporter that will set the signal
        # (a hal.comm engine mid-collective) does not wait for itself
        self.device.settle()
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        view = self.bytes(offset, nbytes).view(dtype).reshape(shape)
        if max_version is None:
            return view.__dlpack__()
        return view.__dlpack__(max_version=max_version)


class AdoptedMemory(CpuMemory):
    """Host memory a DLPack producer owns (a NumPy array, a torch CPU tensor), used zero-copy.

    Not counted in the device's ``memory_in_use``; ``free()`` gives the memory back to its
    producer (drops ``owner``) instead of releasing it.
    """

    __slots__ = ("owner",)

    def __init__(self, device: CpuDevice, address: int, nbytes: int, owner: object) -> None:
        self.device = device
        self.nbytes = nbytes
        self.fd = -1
        self.addr = address
        self.owner: object = owner
        if nbytes:
            raw = (ctypes.c_uint8 * nbytes).from_address(address)
            raw.hal_owner = owner  # type: ignore[attr-defined]  # views of storage keep the producer alive
            self.storage = np.frombuffer(raw, dtype=np.uint8)  # type: ignore[call-overload]
        else:
            self.storage = np.empty(0, dtype=np.uint8)

    def free(self) -> None:
        # the producer gets its memory back once no view of it (an export, queued work) is left
        self.storage = None
        self.owner = None


class ImportedMemory(CpuMemory):
    """Memory of another process's emulated device, mapped here (``Device.import_handle``).

    Not counted in ``memory_in_use``; ``free()`` unmaps it (once no view of it is left).
    """

    __slots__ = ()

    def __init__(self, device: CpuDevice, payload: str, nbytes: int) -> None:
        self.device = device
        self.nbytes = nbytes
        self.fd = -1
        self.addr = 0
        try:
            pid, fd, st_dev, st_ino = (int(x) for x in payload.split(":"))
        except ValueError:
            raise ValueError(
                f"handle payload {payload!r} is not one of the CPU emulator (pid:fd:dev:inode)"
            ) from None
        try:
            own = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise HalError(
                f"{device.label}: cannot open the memory of process {pid} ({exc.strerror}): "
                "the exporter freed it or exited"
            ) from exc
        try:
            st = os.fstat(own)
            if (st.st_dev, st.st_ino) != (st_dev, st_ino):  # the fd number now names something else
                raise HalError(
                    f"{device.label}: the memory of process {pid} was freed (its descriptor "
                    "now names another file)"
                )
            if st.st_size < nbytes:
                raise HalError(
                    f"{device.label}: the exported memory holds {st.st_size} bytes, not {nbytes}"
                )
            self.storage = np.frombuffer(
                mmap.mmap(own, max(1, nbytes)), dtype=np.uint8, count=nbytes
            )
            self.addr = self.storage.ctypes.data
        finally:
            os.close(own)

    def free(self) -> None:
        self.storage = None


class CpuEvent(EventImpl):
    """An event: the mark of its last record."""

    def __init__(self, timing: bool) -> None:
        self.timing = timing
        self.mark: Mark | None = None

    def synchronize(self) -> None:
        mark = self.mark
        if mark is not None:
            mark.done.wait()

    def query(self) -> bool:
        mark = self.mark
        return mark is None or mark.done.is_set()

    def elapsed_ms(self, start: EventImpl) -> float:
        assert isinstance(start, CpuEvent) and start.mark is not None and self.mark is not None
        return (self.mark.time - start.mark.time) * 1e3


class CpuHostSignal(HostSignalImpl):
    """A host signal: the stream's worker thread blocks on a :class:`HostWait` until :meth:`set`."""

    __slots__ = ("wait",)

    def __init__(self, wait: HostWait) -> None:
        self.wait = wait

    def set(self) -> None:
        self.wait.event.set()


_NO_FAST = -1  # CpuStream._epoch of a stream that never takes the native fast path


class CpuStream(StreamImpl):
    """A stream: a worker thread per stream (a native one unless ``HAL_CPU_NATIVE=0``).

    On a native stream copies, memsets, event records and waits and C kernels are queued
    with one cffi call each while the device has no speed change, fault or link model
    (``_faults.epoch`` says when that may have changed); otherwise every operation takes the
    fault model of :class:`hal.backends.cpu._faults.FaultyWorker` as Python callables.
    """

    def __init__(self, device: CpuDevice, ordinal: int) -> None:
        self.device = device
        seed = device.jitter_seed
        jitter = None if seed is None else seed * 1_000_003 + device.index * 1009 + ordinal
        label = f"{device.label}/stream{ordinal}"
        rt = device._native_runtime() if type(self) is CpuStream else None
        worker: Worker | _native.NativeWorker
        self.native: _native.NativeWorker | None
        self._fh2d: Any
        self._fd2h: Any
        self._fd2d: Any
        if rt is not None:
            worker = self.native = _native.NativeWorker(rt, label, jitter)
            # the hot paths, bound once: one cffi call per operation
            self._s = worker._s
            self._h2d, self._d2h, self._d2d = (
                rt.lib.hal_rt_copy_h2d,
                rt.lib.hal_rt_copy_d2h,
                rt.lib.hal_rt_copy,
            )
            self._fill = rt.lib.hal_rt_memset
            self._from_buffer, self._chars = rt.from_buffer, rt.chars
            # small copies on an idle stream: one CPython builtin each (Runtime.fast, None in
            # cffi's ABI mode), else the cffi calls above
            self._sa = worker.address
            self._fh2d, self._fd2h, self._fd2d = rt.fast[:3] if rt.fast else (None, None, None)
            # one call less; in the extension module one builtin (worker._after_sync where needed)
            self.synchronize = rt.fast[4](worker) if rt.fast else worker.synchronize  # type: ignore[method-assign]
        else:
            self.native = None
            worker = Worker(label, jitter, device.slowdown)
            self._sa = 0
            self._fh2d = self._fd2h = self._fd2d = None
        self._rt = rt
        self._index = device.index
        self._epoch = _NO_FAST
        self._rec: _faults.DeviceFaults | None = None
        self.worker = _faults.FaultyWorker(worker, device.index)  # speed and injected faults

    def _fast(self) -> _faults.DeviceFaults | None:
        """The device's fault record when the native fast path applies (counters go there), else None."""
        if self.native is None:
            return None
        epoch = _faults.epoch
        if self._epoch != epoch:
            self._rec = _faults.fast_record(self._index)
            self._epoch = epoch
        return self._rec

    def copy_from_host(self, dst: Any, dst_offset: int, src: memoryview, nbytes: int) -> None:
        rec = self._rec if self._epoch == _faults.epoch else self._fast()
        if rec is not None:  # the native fast path (dst: CpuMemory, as on the path below)
            storage = dst.storage
            if storage is None:
                raise RuntimeError("memory was freed while work still used it")
            rec.ops += 1
            rec.transfers += 1
            fast = self._fh2d
            if fast is not None and fast(self._sa, dst.addr + dst_offset, src, nbytes):
                return
            # the cffi view of ``src`` is a temporary (never a local: a frame kept in a garbage
            # cycle with a memoryview and a live export of it crashes CPython's collector); the
            # memoryview itself is what keeps the host memory alive while the copy is queued
            seq = self._h2d(
                self._s, dst.addr + dst_offset, self._from_buffer(self._chars, src), nbytes, 1
            )
            if seq:
                self.native._queued(seq, (storage, src))  # type: ignore[union-attr]
            return
        assert isinstance(dst, CpuMemory)
        host = np.frombuffer(src, dtype=np.uint8, count=nbytes)
        target = dst.bytes(dst_offset, nbytes)  # taken now: enqueued work outlives a later free
        self.worker.submit(
            lambda: np.copyto(target, host),
            transfer=True,
            inline=True,
            peer=_faults.HOST,
            nbytes=nbytes,
        )

    def copy_from_array(self, dst: Any, dst_offset: int, src: Any, nbytes: int) -> bool:
        """Queue the copy of all of the NumPy array ``src`` with one cffi call (native streams only).

        cffi takes the array's buffer directly (C-contiguous, else False: hal core's usual path
        raises); the cffi view, pinned while the copy is queued, keeps the array's memory.
        """
        rec = self._rec if self._epoch == _faults.epoch else self._fast()
        if rec is None:
            return False
        storage = dst.storage
        if storage is None:
            raise RuntimeError("memory was freed while work still used it")
        fast = self._fh2d
        if fast is not None and fast(self._sa, dst.addr + dst_offset, src, nbytes):
            rec.ops += 1
            rec.transfers += 1
            return True
        try:
            view = self._from_buffer(self._chars, src)
        except (BufferError, TypeError, ValueError):  # not C-contiguous: the usual path says so
            return False
        rec.ops += 1
        rec.transfers += 1
        seq = self._h2d(self._s, dst.addr + dst_offset, view, nbytes, 1)
        if seq:
            self.native._queued(seq, (storage, view))  # type: ignore[union-attr]
        return True

    def copy_to_array(self, dst: Any, src: Any, src_offset: int, nbytes: int) -> bool:
        """Queue a copy into the NumPy array ``dst`` with one cffi call (native streams only)."""
        rec = self._rec if self._epoch == _faults.epoch else self._fast()
        if rec is None:
            return False
        storage = src.storage
        if storage is None:
            raise RuntimeError("memory was freed while work still used it")
        fast = self._fd2h
        if fast is not None and fast(self._sa, dst, src.addr + src_offset, nbytes):
            rec.ops += 1
            rec.transfers += 1
            return True
        try:
            view = self._from_buffer(self._chars, dst, True)
        except (BufferError, TypeError, ValueError):  # not C-contiguous or read-only
            return False
        rec.ops += 1
        rec.transfers += 1
        seq = self._d2h(self._s, view, src.addr + src_offset, nbytes, 1)
        if seq:
            self.native._queued(seq, (storage, view))  # type: ignore[union-attr]
        return True

    def copy_to_host(self, dst: memoryview, src: Any, src_offset: int, nbytes: int) -> None:
        rec = self._rec if self._epoch == _faults.epoch else self._fast()
        if rec is not None:  # the native fast path (src: CpuMemory)
            storage = src.storage
            if storage is None:
                raise RuntimeError("memory was freed while work still used it")
            rec.ops += 1
            rec.transfers += 1
            fast = self._fd2h
            if fast is not None and fast(self._sa, dst, src.addr + src_offset, nbytes):
                return
            seq = self._d2h(  # the cffi view a temporary, as in copy_from_host
                self._s, self._from_buffer(self._chars, dst, True), src.addr + src_offset, nbytes, 1
            )
            if seq:
                self.native._queued(seq, (storage, dst))  # type: ignore[union-attr]
            return
        assert isinstance(src, CpuMemory)
        host = np.frombuffer(dst, dtype=np.uint8, count=nbytes)
        source = src.bytes(src_offset, nbytes)
        self.worker.submit(
            lambda: np.copyto(host, source),
            transfer=True,
            inline=True,
            peer=_faults.HOST,
            nbytes=nbytes,
        )

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        rec = self._rec if self._epoch == _faults.epoch else self._fast()
        if rec is not None:  # the native fast path (dst, src: CpuMemory)
            ds, ss = dst.storage, src.storage
            if ds is None or ss is None:
                raise RuntimeError("memory was freed while work still used it")
            rec.ops += 1
            if dst.device is not src.device:
                rec.transfers += 1
            fast = self._fd2d
            if fast is not None and fast(
                self._sa, dst.addr + dst_offset, src.addr + src_offset, nbytes
            ):
                return
            seq = self._d2d(self._s, dst.addr + dst_offset, src.addr + src_offset, nbytes, 1)
            if seq:
                self.native._queued(seq, (ds, ss))  # type: ignore[union-attr]
            return
        assert isinstance(dst, CpuMemory) and isinstance(src, CpuMemory)
        cross = dst.device is not src.device
        target, source = dst.bytes(dst_offset, nbytes), src.bytes(src_offset, nbytes)
        other = (src.device if dst.device is self.device else dst.device).index if cross else None
        self.worker.submit(
            lambda: np.copyto(target, source),
            transfer=cross,
            inline=True,
            peer=other,
            nbytes=nbytes,
        )

    copy_peer = copy

    def memset(self, dst: Any, offset: int, value: int, nbytes: int) -> None:
        rec = self._rec if self._epoch == _faults.epoch else self._fast()
        if rec is not None:  # the native fast path (dst: CpuMemory)
            storage = dst.storage
            if storage is None:
                raise RuntimeError("memory was freed while work still used it")
            rec.ops += 1
            seq = self._fill(self._s, dst.addr + offset, value, nbytes, 1)
            if seq:
                self.native._queued(seq, storage)  # type: ignore[union-attr]
            return
        assert isinstance(dst, CpuMemory)
        target = dst.bytes(offset, nbytes)
        self.worker.submit(lambda: target.fill(value), inline=True)

    def record(self, event: EventImpl) -> None:
        if isinstance(event, _native.NativeEvent):
            assert self._rt is not None or _native.runtime() is not None
            rt = self._rt or _native.runtime()
            assert rt is not None
            mark = _native.new_mark(rt)
            event.mark = mark
            if self.native is not None:
                self.native.record(mark)
            else:  # a Python stream fires the native mark (never faulted)
                self.worker._worker.submit(functools.partial(rt.lib.hal_rt_mark_fire, mark))
            return
        assert isinstance(event, CpuEvent)
        pmark = Mark()
        event.mark = pmark
        self.worker.submit(pmark.fire)

    def wait(self, event: EventImpl) -> None:
        if isinstance(event, _native.NativeEvent):
            nmark = event.mark
            if nmark is None:
                return
            if self.native is not None:
                self.native.wait_mark(nmark)
            else:
                self.worker._worker.submit(functools.partial(event._lib.hal_rt_mark_wait, nmark))
            return
        assert isinstance(event, CpuEvent)
        mark = event.mark
        if mark is not None:
            self.worker.submit(mark.done.wait)

    def wait_host(self) -> HostSignalImpl:
        """Queue a wait for the host (never faulted; jitter applies as to any op)."""
        if self.native is not None and self._rt is not None:
            mark = _native.new_mark(self._rt)
            self.native.wait_host(mark)
            return _native.NativeHostSignal(self._rt, mark)
        worker = self.worker._worker
        assert isinstance(worker, Worker)  # the Python path (the native one returned above)
        wait = HostWait(worker)
        self.worker.submit(wait.wait)
        return CpuHostSignal(wait)

    def launch(
        self,
        program: Any,
        kernel: str,
        global_size: tuple[int, ...],
        args: Sequence[Any],
        work: int | None = None,
    ) -> None:
        """Enqueue a kernel of a compiled ``c``-dialect program on this stream's worker."""
        rec = self._rec if self._epoch == _faults.epoch else self._fast()
        if rec is not None and _kernels.launch_native(
            self.native, self.device.label, program, kernel, global_size, args, work
        ):
            rec.ops += 1
            return
        _kernels.launch(
            self.worker.submit, self.device.label, program, kernel, global_size, args, work
        )

    def launcher(
        self,
        program: Any,
        kernel: str,
        global_size: tuple[int, ...],
        work: int | None = None,
    ) -> Any:
        """Return the prepared native launch of ``kernel`` (``_kernels.bind_native``), or None.

        None on Python streams (``HAL_CPU_NATIVE=0``, derived devices): hal.kernels then calls
        :meth:`launch`.
        """
        if self.native is None:
            return None
        return _kernels.bind_native(self, program, kernel, global_size, work)

    def submit(self, op: Any) -> None:
        """Queue a host callable on this stream (used by the emulator's kernels and tests)."""
        self.worker.submit(op)

    def synchronize(self) -> None:
        native = self.native
        if native is not None:
            native.synchronize()
        else:
            self.worker.synchronize()

    def query(self) -> bool:
        return self.worker.idle()

    def close(self) -> None:
        self.worker.close()


class CpuDevice(DeviceImpl):
    """A virtual device with its own memory capacity and accounting."""

    def __init__(
        self,
        index: int,
        capacity: int,
        jitter_seed: int | None,
        slowdown: float = 1.0,
        devices: int = 1,
    ) -> None:
        self.index = index
        self.label = f"cpu:{index}"
        self.name = f"CPU emulator device {index}"
        self.vendor = "hal-sdk"
        self.total_memory = capacity
        self.jitter_seed = jitter_seed
        self.slowdown = slowdown
        no_kernels = _kernels.unavailable_reason()  # hal.kernels needs cffi and a C compiler
        self.ipc = bool(spi.setting("HAL_CPU_IPC")) and hasattr(os, "memfd_create")
        #: the process's shared arena for memory of 64 KiB and more (None: private NumPy
        #: memory; with HAL_CPU_IPC=1 each allocation is a memfd of its own, as before)
        self.arena = (
            _arena.arena(_arena.arena_size(capacity, devices))
            if spi.setting("HAL_CPU_ARENA") and not self.ipc
            else None
        )
        self.capabilities = Capabilities(
            p2p=True,
            ipc=self.ipc,
            timing_events=True,
            kernels=no_kernels is None,
            dlpack=True,
            fp64=True,
            fp16=True,
            concurrent_streams=True,
            host_signal=True,
            absent_reasons={
                **(
                    {}
                    if self.ipc
                    else {
                        "ipc": "emulated memory is private to its process unless HAL_CPU_IPC=1 "
                        "(memfd-backed, Linux)"
                    }
                ),
                **({"kernels": no_kernels} if no_kernels else {}),
            },
        )
        self.account = MemoryAccount(capacity, self.label, "raise HAL_CPU_MEMORY for more")
        self._streams: weakref.WeakSet[CpuStream] = weakref.WeakSet()
        self._ordinals = itertools.count()

    def alloc(self, nbytes: int) -> MemoryImpl:
        return self.account.allocate(nbytes, CpuMemory, self, nbytes)

    def _release(self, nbytes: int) -> None:
        self.account.release(nbytes)

    def memory_in_use(self) -> int:
        return self.account.in_use

    def create_stream(self) -> StreamImpl:
        stream = CpuStream(self, next(self._ordinals))
        self._streams.add(stream)
        return stream

    def create_event(self, timing: bool) -> EventImpl:
        rt = self._native_runtime()
        return CpuEvent(timing) if rt is None else _native.NativeEvent(rt, timing)

    def _native_runtime(self) -> _native.Runtime | None:
        """The native runtime for new streams and events of this device, or None (Python workers).

        None with ``HAL_CPU_NATIVE=0``, where the runtime cannot be built, for subclasses
        (fault-model mutants and other derived devices keep the Python path) and slowed devices.
        """
        if type(self) is not CpuDevice or self.slowdown != 1.0:
            return None
        if not spi.setting("HAL_CPU_NATIVE"):
            return None
        return _native.runtime()

    def can_access_peer(self, other: DeviceImpl) -> bool:
        return isinstance(other, CpuDevice)

    def adopt(
        self, *, dl_device: tuple[int, int], address: int, nbytes: int, owner: object
    ) -> MemoryImpl | None:
        """Adopt host memory (DLPack ``kDLCPU``) zero-copy: the emulator's memory is host memory."""
        if dl_device[0] != 1:
            return None
        return AdoptedMemory(self, address, nbytes, owner)

    def import_handle(self, payload: str, nbytes: int) -> MemoryImpl:
        """Map memory exported by another process (``HAL_CPU_IPC=1`` there and here)."""
        if not self.ipc:
            raise NotImplementedError(
                f"{self.label}: set HAL_CPU_IPC=1 to open memory of other processes"
            )
        return ImportedMemory(self, payload, nbytes)

    def synchronize(self) -> None:
        for stream in list(self._streams):
            stream.synchronize()

    def settle(self) -> None:
        """Wait until each stream is idle or waits for a host signal (see ``Worker.settle``)."""
        for stream in list(self._streams):
            stream.worker.settle()

    kernel_dialect = "c"

    def compiler_info(self) -> dict[str, str]:
        return _kernels.compiler_info()

    def compile(self, source: str, *, options: Sequence[str], kernels: Sequence[Any]) -> Any:
        return _kernels.compile_program(self.label, source, options, kernels)

    def load_program(
        self, binary: bytes, *, source: str, options: Sequence[str], kernels: Sequence[Any]
    ) -> Any:
        return _kernels.load_program(binary, kernels)

    def health(self) -> dict[str, int]:
        """The emulator's error counter: operations failed by injected faults (HAL_CPU_CONFIG)."""
        return {"errors": _faults.faults(self.index).errors}

    def properties(self) -> dict[str, Any]:
        rec = _faults.faults(self.index)
        native = self._native_runtime() is not None
        return {
            "jitter_seed": self.jitter_seed,
            "slowdown": self.slowdown,
            "native_runtime": native,
            **(
                {}
                if native
                else {"native_reason": _native.unavailable_reason() or "HAL_CPU_NATIVE=0"}
            ),
            "memory_in_use": self.memory_in_use(),
            "speed": rec.speed,
            **rec.counters(),
        }


class CpuBackend(BackendImpl):
    """The CPU emulator backend (always available; the embedded default)."""

    name = "cpu"
    api_version = (1, 2)
    emulator = True

    def __init__(self) -> None:
        opts = CpuOptions.from_env()  # every HAL_CPU_* checked: hal.ConfigError fails the backend
        count, capacity, jitter = int(opts.devices or 0), int(opts.memory or 0), opts.jitter
        _faults.configure(count)  # HAL_CPU_SPEED, HAL_CPU_CONFIG
        self._devices = [CpuDevice(i, capacity, jitter, devices=count) for i in range(count)]

    def devices(self) -> Sequence[DeviceImpl]:
        return self._devices

    def version_info(self) -> dict[str, str]:
        return {"numpy": np.__version__, "hal-sdk": __version__}

    def close(self) -> None:
        """Drop the row programs compiled for this backend's devices (``hal.runtime().reset()``, exit).

        Their devices keep working: a row op on one of them compiles its program again.
        """
        _kernels.forget_programs(self._devices)
