"""CUDA IPC for ``Buffer.export_handle`` / ``Device.import_handle``: ``cudaIpcGetMemHandle`` plus a lock file.

CUDA's legacy IPC maps a ``cudaMalloc`` allocation of one process into another
(``cudaIpcOpenMemHandle``), but freeing it in the exporter while an importer still has it
open is undefined behaviour, and a handle opened after the free may map nothing or
someone else's memory. hal's contract (the CPU emulator's) is: importers that opened the
memory keep using it after the exporter closed its buffer; it is freed when the last of
them closes; an import after the close fails with ``hal.HalError``. A lock file per
exported allocation (``/dev/shm/hal-cuda-ipc-<pid>-<n>``) carries that:

- an importer opens the file (gone: the exporter freed the memory), takes a shared
  ``flock`` on it (kept until it unmaps), reads the state byte (``F``: freed) and only then
  calls ``cudaIpcOpenMemHandle``;
- the exporter's ``free()`` unlinks the file (no new importer), then frees for real once it
  gets an exclusive ``flock`` without waiting: marks ``F`` and drops the ``cupy`` memory
  (``cudaFree``). While importers hold their shared locks the free is deferred and retried
  (:func:`reap`) at the next allocation, free, export or import and at exit.

The kernel drops a dead importer's lock, so a crashed importer does not leak memory
forever. In the same process (``import_handle`` of a handle exported here), the import
references the exporter's ``cupy`` memory object itself (CUDA refuses to open a handle in
the process that made it). Limit: the memory belongs to the exporter's CUDA context, so it
lives at most as long as the exporting process; an exporter that exits frees it under its
importers (keep it alive until they close, as with ``torch.multiprocessing``).

Unmapping an import (``cudaIpcCloseMemHandle``) waits, without blocking, for the work that
the device's hal streams had enqueued when the buffer was freed (events polled by
:func:`reap`).
"""

from __future__ import annotations

import atexit
import fcntl
import itertools
import json
import os
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cupy_backends.cuda.api import runtime as rt

from hal import HalError

if TYPE_CHECKING:
    from hal.backends.cuda._device import CudaDevice

__all__ = ["Export", "IpcMapping", "decode", "export", "open_handle", "reap", "retire"]

_FREED = b"F"
_ALIVE = b"A"
_serial = itertools.count()
_lock = threading.Lock()
_deferred: list[tuple[Callable[[], bool], Callable[[], None]]] = []
#: exports of this process by lock-file path: the cupy memory object (same-process imports)
_local: dict[str, Any] = {}


def _dir() -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


class Export:
    """The exporter's side of one exported allocation: its handle, lock file and descriptor."""

    __slots__ = ("fd", "handle", "path", "payload")

    def __init__(self, device: CudaDevice, ptr: int, mem: Any) -> None:
        with device.ctx():
            self.handle = bytes(rt.ipcGetMemHandle(ptr))
        self.path = os.path.join(_dir(), f"hal-cuda-ipc-{os.getpid()}-{next(_serial)}")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.write(self.fd, _ALIVE)
        self.payload = json.dumps(
            {"pid": os.getpid(), "path": self.path, "handle": self.handle.hex()},
            separators=(",", ":"),
        )
        with _lock:
            _local[self.path] = mem


def export(device: CudaDevice, ptr: int, mem: Any) -> Export:
    """Export the allocation at ``ptr`` (a whole ``cudaMalloc`` block owned by ``mem``)."""
    reap()
    try:
        return Export(device, ptr, mem)
    except OSError as exc:  # the lock file (/dev/shm or the temp folder not writable)
        raise HalError(
            f"{device.label}: cannot create the lock file of an IPC export: {exc}"
        ) from exc


def retire(exp: Export, mem: Any) -> None:
    """The exporter freed its buffer: no new import; ``cudaFree`` once no importer holds it."""
    with _lock:
        _local.pop(exp.path, None)
    try:
        os.unlink(exp.path)
    except OSError:
        pass
    holder = [mem]  # the cupy memory: dropping the last reference is the cudaFree

    def unused() -> bool:
        try:
            fcntl.flock(exp.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    def free() -> None:
        try:
            os.pwrite(
                exp.fd, _FREED, 0
            )  # an importer that opened the file before the unlink sees it
        finally:
            holder.clear()
            os.close(exp.fd)  # releases the exclusive lock after the free

    _defer(unused, free)


def _defer(ready: Callable[[], bool], action: Callable[[], None]) -> None:
    with _lock:
        _deferred.append((ready, action))
    reap()


def reap() -> None:
    """Run the deferred frees and unmaps whose conditions now hold (never blocks)."""
    with _lock:
        items = list(_deferred)
    for item in items:
        ready, action = item
        try:
            ok = ready()
        except Exception:  # noqa: BLE001 - a failed check (device lost) lets the action run at exit
            ok = False
        if not ok:
            continue
        with _lock:
            try:
                _deferred.remove(item)
            except ValueError:
                continue  # another thread took it
        try:
            action()
        except Exception:  # noqa: BLE001 - a free at teardown must not raise into the caller
            pass


def _at_exit() -> None:
    """Exit: run what can run; unlink the lock files of exports still deferred (the memory dies now)."""
    reap()
    with _lock:
        items = list(_deferred)
        _deferred.clear()
        paths = list(_local)
        _local.clear()
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
    del items  # the cupy memory objects go with the process's CUDA context


atexit.register(_at_exit)


def decode(payload: str) -> tuple[int, str, bytes]:
    """Return ``(pid, path, handle)`` of a payload, or raise ``ValueError`` naming it."""
    try:
        head = json.loads(payload)
        pid, path, handle = int(head["pid"]), str(head["path"]), bytes.fromhex(head["handle"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"handle payload {payload[:80]!r} is not one of the cuda backend ({exc})"
        ) from None
    if (
        len(handle) != 64
        or os.path.dirname(path) != _dir()
        or not os.path.basename(path).startswith(f"hal-cuda-ipc-{pid}-")
    ):
        raise ValueError(f"handle payload {payload[:80]!r} is not one of the cuda backend")
    return pid, path, handle


class IpcMapping:
    """The importer's side: a mapped pointer, or the exporter's memory object in the same process.

    Used as the ``owner`` of the ``cupy.cuda.UnownedMemory`` that hal's memory and DLPack views
    hold: when the last of them goes, the mapping is closed once the device's streams have
    passed the work enqueued until then (:func:`reap`).
    """

    __slots__ = ("__weakref__", "local", "ptr")

    def __init__(self, ptr: int, local: Any) -> None:
        self.ptr = ptr
        self.local = local


def open_handle(device: CudaDevice, payload: str, nbytes: int) -> IpcMapping:
    """Map the memory named by ``payload`` on ``device``; raise ``hal.HalError`` when it is gone."""
    pid, path, handle = decode(payload)
    reap()
    label = device.label
    if pid == os.getpid():
        with _lock:
            mem = _local.get(path)
        if mem is None:
            raise HalError(
                f"{label}: the memory of this process's handle was freed (its buffer was closed)"
            )
        if int(mem.size) < nbytes:
            raise ValueError(f"handle names {nbytes} bytes but the allocation has {int(mem.size)}")
        return IpcMapping(int(mem.ptr), mem)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise HalError(
            f"{label}: cannot open the memory of process {pid} ({exc.strerror}): the exporter freed it or exited"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # the exporter holds its exclusive lock only while freeing
        if os.pread(fd, 1, 0) != _ALIVE:
            raise HalError(
                f"{label}: the memory of process {pid} was freed (its buffer was closed)"
            )
        try:
            with device.ctx():
                ptr = int(rt.ipcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess))
        except HalError as exc:
            raise HalError(
                f"{label}: cannot open the memory of process {pid}: {exc} (did the exporter exit?)"
            ) from exc
    except BaseException:
        os.close(fd)
        raise
    mapping = IpcMapping(ptr, None)
    weakref.finalize(mapping, _close_later, device, ptr, fd)
    return mapping


def _close_later(device: CudaDevice, ptr: int, fd: int) -> None:
    """Unmap ``ptr`` once the device's streams passed the work enqueued so far; then drop the lock."""
    try:
        events = device.fence()
    except Exception:  # noqa: BLE001 - a lost device: unmap at once
        events = []

    def passed() -> bool:
        return all(bool(e.done) for e in events)

    def close() -> None:
        try:
            with device.ctx():
                rt.ipcCloseMemHandle(ptr)
        finally:
            os.close(fd)  # the exporter may free now

    _defer(passed, close)
