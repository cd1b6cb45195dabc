"""OpenCL streams (in-order command queues) and events (markers)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from hal import HalError
from hal.backends.opencl._errors import translate_cl_error, translate_status
from hal.spi import EventImpl, HostSignalImpl, MemoryImpl, StreamImpl

if TYPE_CHECKING:
    import pyopencl as cl

    from hal.backends.opencl._backend import OpenCLDevice, OpenCLMemory

__all__ = ["OpenCLEvent", "OpenCLHostSignal", "OpenCLStream"]

_COMPLETE = 0  # CL_COMPLETE
_PRUNE_AT = 64  # drop completed commands once this many are pending


class OpenCLEvent(EventImpl):
    """An event: the marker enqueued by the last ``record``."""

    def __init__(self, device: OpenCLDevice, timing: bool) -> None:
        self.device = device
        self.timing = timing
        self.marker: cl.Event | None = None
        self.context: cl.Context | None = None

    def synchronize(self) -> None:
        marker = self.marker
        if marker is None:
            return
        import pyopencl as cl

        try:
            marker.wait()
        except cl.Error as exc:
            raise translate_cl_error(
                exc, device=self.device.label, what="waiting for an event"
            ) from exc
        status = marker.command_execution_status
        if status < 0:
            raise translate_status(status, device=self.device.label, what="work before an event")

    def query(self) -> bool:
        marker = self.marker
        # a negative status is "done, with an error": synchronize() raises it
        return marker is None or marker.command_execution_status <= _COMPLETE

    def elapsed_ms(self, start: EventImpl) -> float:
        assert (
            isinstance(start, OpenCLEvent) and start.marker is not None and self.marker is not None
        )
        import pyopencl as cl

        try:
            end_ns = self.marker.profile.end
            start_ns = start.marker.profile.end
        except cl.Error as exc:
            raise translate_cl_error(
                exc, device=self.device.label, what="reading event timestamps", stream=False
            ) from exc
        return (int(end_ns) - int(start_ns)) / 1e6

    def close(self) -> None:
        self.marker = None


class OpenCLHostSignal(HostSignalImpl):
    """A ``cl.UserEvent`` that a barrier of the stream's queue waits for."""

    def __init__(self, device: OpenCLDevice, user_event: cl.UserEvent) -> None:
        self.device = device
        self.user_event = user_event

    def set(self) -> None:
        import pyopencl as cl

        try:
            self.user_event.set_status(cl.command_execution_status.COMPLETE)
        except cl.Error as exc:
            raise translate_cl_error(
                exc, device=self.device.label, what="setting a host signal", stream=False
            ) from exc


class OpenCLStream(StreamImpl):
    """A stream: one in-order ``cl.CommandQueue`` with profiling enabled.

    Every enqueued command's event is kept (with the host memory it reads or writes) until
    the command is seen complete, so non-blocking host copies never lose their memory and
    :meth:`query` never blocks. Each command starts without waiting for a synchronization (as
    a CUDA stream's would): it is flushed at once, except on drivers that submit every command
    when it is enqueued (``OpenCLDevice.submits_on_enqueue``: PoCL), where a ``clFlush`` per
    command only cost time (about 11 us per launch, and a wake-up of the driver's threads).
    """

    #: OpenCL retains the memory objects of an enqueued kernel until it completes
    launches_retain_memory = True

    def __init__(self, device: OpenCLDevice) -> None:
        import pyopencl as cl

        from hal import spi

        self.device = device
        #: prepared launches may use the native helper (``HAL_OPENCL_NATIVE``, read here: a bad
        #: value fails the stream's creation, not a later op call)
        self.native = bool(spi.setting("HAL_OPENCL_NATIVE"))
        try:
            if device.profiling:
                props = cl.command_queue_properties.PROFILING_ENABLE
                self.queue = cl.CommandQueue(device.context, device.cl_device, properties=props)
            else:
                self.queue = cl.CommandQueue(device.context, device.cl_device)
        except cl.Error as exc:
            raise translate_cl_error(
                exc, device=device.label, what="creating a command queue", stream=False
            ) from exc
        # bound once: the hot path does no imports or attribute chains
        self._cl_error: type[Exception] = cl.Error
        self._copy = cl.enqueue_copy
        self._fill = cl.enqueue_fill_buffer
        self._marker = cl.enqueue_marker
        self._barrier = cl.enqueue_barrier
        self._status_info = cl.event_info.COMMAND_EXECUTION_STATUS
        self._pending: collections.deque[tuple[cl.Event, object]] = collections.deque()
        self._error: HalError | None = None
        self._lock = threading.Lock()
        self._flush_each = not device.submits_on_enqueue
        self._prune_at = _PRUNE_AT  # prune when this many commands are pending
        #: launches the native helper enqueued without an event (a C ``uint64_t[1]``, made by
        #: the first native launcher) and how many of them a marker already follows
        self._launched: Any = None
        self._marked = 0

    # -- bookkeeping ------------------------------------------------------------------
    def _mark(self) -> None:
        """Enqueue a marker after the launches enqueued without an event since the last one (lock held).

        The marker completes after them (in-order queue) and fails when one of them failed
        (the driver marks later commands failed), so :meth:`query` and :meth:`synchronize`
        see them through it.
        """
        launched = self._launched
        if launched is None:
            return
        count = launched[0]  # read first: a launch counted later may follow the marker
        if count == self._marked:
            return
        try:
            event = self._marker(self.queue)
            if self._flush_each:
                self.queue.flush()
        except self._cl_error as exc:
            raise translate_cl_error(
                exc, device=self.device.label, what="marking kernel launches"
            ) from exc
        self._marked = count
        self._pending.append((event, None))

    def _prune(self) -> None:
        """Drop completed commands from the front of the queue; remember the first failure.

        The next prune comes ``_PRUNE_AT`` commands later (not at the next command while the
        device lags behind: one status query per command then).
        """
        pending = self._pending
        try:
            self._prune_front(pending)
        finally:
            self._prune_at = len(pending) + _PRUNE_AT

    def _prune_front(self, pending: collections.deque[tuple[cl.Event, object]]) -> None:
        info = self._status_info  # Event.get_info itself: the property is a Python call more
        while pending:
            status: int = pending[0][0].get_info(info)  # type: ignore[assignment,unused-ignore]  # int
            if status > _COMPLETE:
                return
            pending.popleft()
            if status < 0 and self._error is None:
                self._error = translate_status(
                    status, device=self.device.label, what="a command on the stream"
                )

    def _enqueue(self, what: str, fn: Any, *args: Any, keep: object = None, **kwargs: Any) -> Any:
        with self._lock:
            try:
                event = fn(self.queue, *args, **kwargs)
                if self._flush_each:
                    self.queue.flush()
            except self._cl_error as exc:
                raise translate_cl_error(exc, device=self.device.label, what=what) from exc
            pending = self._pending
            pending.append((event, keep))
            if len(pending) > self._prune_at:
                self._prune()
        return event

    def _launch(
        self,
        name: str,
        knl: Any,
        lock: threading.Lock,
        gs: tuple[int, ...],
        ls: tuple[int, ...] | None,
        cl_args: list[Any],
    ) -> None:
        """Enqueue a kernel launch: the hot path of :meth:`_enqueue` (no closure, no keep).

        The buffers need no keeping: OpenCL retains the memory objects of an enqueued
        kernel until it completes (``clReleaseMemObject`` defers the free).
        """
        with self._lock:
            try:
                with lock:  # one cl.Kernel's arguments and enqueue must not interleave
                    event = knl(self.queue, gs, ls, *cl_args)
                if self._flush_each:
                    self.queue.flush()
            except self._cl_error as exc:
                raise translate_cl_error(
                    exc, device=self.device.label, what=f"launching kernel {name}"
                ) from exc
            pending = self._pending
            pending.append((event, None))
            if len(pending) > self._prune_at:
                self._prune()

    # -- SPI ----------------------------------------------------------------------------
    def copy_from_host(
        self, dst: MemoryImpl, dst_offset: int, src: memoryview, nbytes: int
    ) -> None:
        buffer = cast("OpenCLMemory", dst).buffer
        self._enqueue(
            "copy host->device",
            self._copy,
            buffer,
            src,
            dst_offset=dst_offset,
            is_blocking=False,
            keep=src,
        )

    def copy_to_host(self, dst: memoryview, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        buffer = cast("OpenCLMemory", src).buffer
        self._enqueue(
            "copy device->host",
            self._copy,
            dst,
            buffer,
            src_offset=src_offset,
            is_blocking=False,
            keep=dst,
        )

    def copy(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        d, s = cast("OpenCLMemory", dst).buffer, cast("OpenCLMemory", src).buffer
        overlap = d is s and src_offset < dst_offset + nbytes and dst_offset < src_offset + nbytes
        if overlap and src_offset == dst_offset:
            return  # the same bytes onto themselves
        if overlap:
            # clEnqueueCopyBuffer refuses overlapping regions (MEM_COPY_OVERLAP): bounce on the device
            import pyopencl as cl

            try:
                tmp = cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, nbytes)
            except cl.Error as exc:
                raise translate_cl_error(
                    exc, device=self.device.label, what="overlapping copy"
                ) from exc
            what = "overlapping copy device->device"
            self._enqueue(
                what,
                self._copy,
                tmp,
                s,
                byte_count=nbytes,
                src_offset=src_offset,
                dst_offset=0,
                keep=tmp,
            )
            self._enqueue(
                what,
                self._copy,
                d,
                tmp,
                byte_count=nbytes,
                src_offset=0,
                dst_offset=dst_offset,
                keep=tmp,
            )
            return
        self._enqueue(
            "copy device->device",
            self._copy,
            d,
            s,
            byte_count=nbytes,
            src_offset=src_offset,
            dst_offset=dst_offset,
        )

    def copy_peer(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        # both buffers live in one context (can_access_peer): the runtime moves the bytes directly
        d, s = cast("OpenCLMemory", dst).buffer, cast("OpenCLMemory", src).buffer
        self._enqueue(
            "peer copy",
            self._copy,
            d,
            s,
            byte_count=nbytes,
            src_offset=src_offset,
            dst_offset=dst_offset,
        )

    def memset(self, dst: MemoryImpl, offset: int, value: int, nbytes: int) -> None:
        pattern = np.array([value], dtype=np.uint8)  # copied by clEnqueueFillBuffer
        self._enqueue(
            "memset", self._fill, cast("OpenCLMemory", dst).buffer, pattern, offset, nbytes
        )

    def record(self, event: EventImpl) -> None:
        assert isinstance(event, OpenCLEvent)
        launched = self._launched
        count = None if launched is None else launched[0]
        marker = self._enqueue("recording an event", self._marker)
        if count is not None:  # the marker follows the launches counted before it was enqueued
            self._marked = count
        event.marker = marker
        event.context = self.device.context

    def wait(self, event: EventImpl) -> None:
        assert isinstance(event, OpenCLEvent)
        marker = event.marker
        if marker is None:
            return
        if event.context is not self.device.context:
            # events cannot cross OpenCL contexts (devices of different platforms): wait on the host
            event.synchronize()
            return
        self._enqueue("waiting for an event", self._barrier, wait_for=[marker], keep=marker)

    def wait_host(self) -> HostSignalImpl:
        """Enqueue a barrier waiting for a new user event; ``set`` completes the user event.

        Always CL_COMPLETE, never a negative status (whose effect on the waiting commands
        is implementation-defined): hal core reports a failed signal at synchronize.
        """
        import pyopencl as cl

        try:
            user_event = cl.UserEvent(self.device.context)
        except cl.Error as exc:
            raise translate_cl_error(
                exc, device=self.device.label, what="creating a host signal", stream=False
            ) from exc
        self._enqueue(
            "waiting for a host signal", self._barrier, wait_for=[user_event], keep=user_event
        )
        return OpenCLHostSignal(self.device, user_event)

    def launch(
        self,
        program: Any,
        kernel: str,
        global_size: tuple[int, ...],
        args: Any,
        work: int | None = None,
    ) -> None:
        launch = _launcher[0] if _launcher else _bind_launcher()
        launch(self, program, kernel, global_size, args)

    def launcher(
        self,
        program: Any,
        kernel: str,
        global_size: tuple[int, ...],
        work: int | None = None,
    ) -> Callable[..., None] | None:
        """Return the prepared launch of ``kernel`` on this queue (``_kernels.bind``)."""
        from hal.backends.opencl._kernels import bind

        return bind(self, program, kernel, global_size)

    def synchronize(self) -> None:
        if self._launched is not None and self._launched[0] != self._marked:
            with self._lock:
                self._mark()
        try:
            self.queue.finish()
        except self._cl_error as exc:
            raise translate_cl_error(
                exc, device=self.device.label, what="synchronizing the stream"
            ) from exc
        with self._lock:
            self._prune()
            error, self._error = self._error, None
        if error is not None:
            raise error

    def query(self) -> bool:
        with self._lock:
            self._mark()
            self._prune()
            return not self._pending

    def close(self) -> None:
        try:
            self.queue.finish()
        finally:
            with self._lock:
                self._pending.clear()


_launcher: list[Any] = []


def _bind_launcher() -> Any:
    """Import ``_kernels.launch`` once (on the first launch, not with the stream module)."""
    from hal.backends.opencl._kernels import launch

    _launcher[:] = [launch]
    return launch
