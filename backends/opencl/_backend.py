"""The OpenCL backend: one HAL device per OpenCL device, one context per platform.

PyOpenCL is imported only when the backend is probed (``OpenCLBackend()``), never when
the plugin is imported.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hal import BackendUnavailableError, __version__
from hal.backends.opencl._errors import translate_cl_error
from hal.backends.opencl._select import import_pyopencl, select_devices
from hal.backends.opencl._stream import OpenCLEvent, OpenCLStream
from hal.spi import (
    BackendImpl,
    Capabilities,
    DeviceImpl,
    EventImpl,
    MemoryAccount,
    MemoryImpl,
    StreamImpl,
)

if TYPE_CHECKING:
    import pyopencl as cl

__all__ = ["OpenCLBackend", "OpenCLDevice", "OpenCLMemory"]


class OpenCLMemory(MemoryImpl):
    """An allocation: a ``cl.Buffer`` made resident on its device when allocated."""

    __slots__ = ("buffer", "device", "handle", "nbytes")

    def __init__(self, device: OpenCLDevice, buffer: cl.Buffer, nbytes: int) -> None:
        self.device = device
        self.buffer: cl.Buffer | None = buffer
        self.nbytes = nbytes
        #: the ``cl_mem`` (``int_ptr``) for the native launch helper; 0 once freed
        self.handle: int = buffer.int_ptr

    def free(self) -> None:
        self.handle = 0
        buffer, self.buffer = self.buffer, None
        if buffer is not None:
            # clReleaseMemObject: commands already enqueued keep the object alive until done
            buffer.release()
            self.device._release(self.nbytes)


class OpenCLDevice(DeviceImpl):
    """One OpenCL device, sharing a context with the other selected devices of its platform."""

    def __init__(
        self, index: int, platform: cl.Platform, cl_device: cl.Device, context: cl.Context
    ) -> None:
        import pyopencl as cl

        self.index = index
        self.label = f"opencl:{index}"
        self.platform = platform
        self.cl_device = cl_device
        self.context = context
        self.name = cl_device.name.strip()
        self.vendor = cl_device.vendor.strip()
        self.total_memory = int(cl_device.global_mem_size)
        self.max_alloc = int(cl_device.max_mem_alloc_size)
        self.profiling = bool(
            cl_device.queue_properties & cl.command_queue_properties.PROFILING_ENABLE
        )
        extensions = set(cl_device.extensions.split())
        self.extensions = extensions
        fp64 = "cl_khr_fp64" in extensions or bool(getattr(cl_device, "double_fp_config", 0))
        fp16 = "cl_khr_fp16" in extensions
        #: a CPU device (PoCL): the driver chooses work-group sizes (``_kernels.local_size``)
        self.is_cpu = bool(int(cl_device.type) & int(cl.device_type.CPU))
        #: the driver submits each command when it is enqueued, so no ``clFlush`` per command is
        #: needed for work to start (PoCL, checked: a launch completes with no flush or wait)
        self.submits_on_enqueue = "portable computing language" in platform.name.strip().lower()
        self.peers: list[OpenCLDevice] = []  # filled by the backend: devices sharing ``context``
        self._fp = (fp64, fp16)
        self._lock = threading.Lock()
        self.account = MemoryAccount(
            self.total_memory,
            self.label,
            "CL_DEVICE_GLOBAL_MEM_SIZE, enforced by hal because drivers such as PoCL overcommit",
        )
        self._streams: weakref.WeakSet[OpenCLStream] = weakref.WeakSet()
        self._alloc_stream: OpenCLStream | None = None
        self.capabilities = Capabilities()  # replaced by _declare() once peers are known

    def _declare(self) -> None:
        fp64, fp16 = self._fp
        reasons = {
            "ipc": "OpenCL has no memory handles another process can open",
            "dlpack": "no DLPack consumer reads OpenCL buffers (kDLOpenCL has no importers)",
        }
        if not self.peers:
            reasons["p2p"] = (
                f"{self.label} is the only selected device of platform {self.platform.name!r} "
                "(peer copies need devices sharing a context)"
            )
        if not self.profiling:
            reasons["timing_events"] = (
                "the device's queues do not support CL_QUEUE_PROFILING_ENABLE"
            )
        if not fp64:
            reasons["fp64"] = "the device lacks cl_khr_fp64"
        if not fp16:
            reasons["fp16"] = "the device lacks cl_khr_fp16"
        self.capabilities = Capabilities(
            p2p=bool(self.peers),
            ipc=False,
            timing_events=self.profiling,
            kernels=True,
            dlpack=False,
            fp64=fp64,
            fp16=fp16,
            concurrent_streams=True,
            host_signal=True,
            max_alloc_bytes=self.max_alloc,
            absent_reasons=reasons,
        )

    # -- memory -----------------------------------------------------------------------
    def alloc(self, nbytes: int) -> MemoryImpl:
        return self.account.allocate(nbytes, self._new_buffer, nbytes)

    def _new_buffer(self, nbytes: int) -> OpenCLMemory:
        """Create a device-resident ``cl.Buffer`` of ``nbytes`` (counted by the caller)."""
        import pyopencl as cl

        try:
            buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
        except cl.Error as exc:
            raise translate_cl_error(
                exc, device=self.label, what=f"allocating {nbytes} bytes", stream=False
            ) from exc
        try:
            self._make_resident(buffer)
        except BaseException:
            buffer.release()
            raise
        return OpenCLMemory(self, buffer, nbytes)

    def _make_resident(self, buffer: cl.Buffer) -> None:
        """Force the device allocation now: OpenCL (PoCL included) allocates lazily at first use."""
        import pyopencl as cl

        stream = self._residency_stream()
        try:
            event = cl.enqueue_migrate_mem_objects(
                stream.queue, [buffer], flags=cl.mem_migration_flags.CONTENT_UNDEFINED
            )
            event.wait()
        except cl.Error as exc:
            raise translate_cl_error(
                exc, device=self.label, what="allocating device memory", stream=False
            ) from exc
        if event.command_execution_status < 0:
            from hal.backends.opencl._errors import translate_status

            raise translate_status(
                event.command_execution_status, device=self.label, what="allocating device memory"
            )

    def _residency_stream(self) -> OpenCLStream:
        with self._lock:
            if self._alloc_stream is None:
                self._alloc_stream = OpenCLStream(self)
            return self._alloc_stream

    def _release(self, nbytes: int) -> None:
        self.account.release(nbytes)

    def alloc_host(self, nbytes: int) -> Any:
        """A ``CL_MEM_ALLOC_HOST_PTR`` buffer mapped for the host (pinned on GPU drivers); unmapped when collected."""
        import numpy as np
        import pyopencl as cl

        try:
            buffer = cl.Buffer(
                self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes
            )
            mapper: Any = (
                cl.enqueue_map_buffer
            )  # (PyOpenCL's stubs type the flags and dtype too narrowly)
            arr, _ = mapper(
                self._residency_stream().queue,
                buffer,
                cl.map_flags.READ | cl.map_flags.WRITE,
                0,
                (nbytes,),
                np.uint8,
                is_blocking=True,
            )
        except cl.Error as exc:
            raise translate_cl_error(
                exc,
                device=self.label,
                what=f"allocating {nbytes} bytes of host-accessible memory",
                stream=False,
            ) from exc
        return arr

    def memory_in_use(self) -> int:
        return self.account.in_use

    # -- streams and events -------------------------------------------------------------
    def create_stream(self) -> StreamImpl:
        stream = OpenCLStream(self)
        self._streams.add(stream)
        return stream

    def create_event(self, timing: bool) -> EventImpl:
        return OpenCLEvent(self, timing)

    def can_access_peer(self, other: DeviceImpl) -> bool:
        return (
            isinstance(other, OpenCLDevice) and other is not self and other.context is self.context
        )

    def synchronize(self) -> None:
        for stream in list(self._streams):
            stream.synchronize()

    # -- kernels (hal.kernels; implemented in _kernels.py) --------------------------------
    kernel_dialect = "opencl"

    def compiler_info(self) -> dict[str, str]:
        from hal.backends.opencl import _kernels

        return _kernels.compiler_info(self)

    def compile(self, source: str, *, options: Sequence[str], kernels: Sequence[Any]) -> Any:
        from hal.backends.opencl import _kernels

        return _kernels.compile_program(self, source, options, kernels)

    def load_program(
        self, binary: bytes, *, source: str, options: Sequence[str], kernels: Sequence[Any]
    ) -> Any:
        from hal.backends.opencl import _kernels

        return _kernels.load_program(self, binary, options, kernels)

    def properties(self) -> dict[str, Any]:
        from hal.backends.opencl import _native

        d = self.cl_device
        native = _native.helper() is not None
        return {
            "native_launch": native,
            **({} if native else {"native_launch_reason": _native.unavailable_reason()}),
            "platform": self.platform.name.strip(),
            "platform_version": self.platform.version.strip(),
            "device_version": d.version.strip(),
            "driver_version": d.driver_version.strip(),
            "device_type": _device_type(d.type),
            "compute_units": int(d.max_compute_units),
            "preferred_vector_width_float": int(d.preferred_vector_width_float),
            "max_work_group_size": int(d.max_work_group_size),
            "flush_per_command": not self.submits_on_enqueue,
            "max_alloc_bytes": self.max_alloc,
            "context_peers": [p.label for p in self.peers],
            "memory_in_use": self.memory_in_use(),
        }


def _device_type(value: int) -> str:
    names = {1: "DEFAULT", 2: "CPU", 4: "GPU", 8: "ACCELERATOR", 16: "CUSTOM"}
    return "|".join(n for bit, n in names.items() if value & bit) or str(value)


class OpenCLBackend(BackendImpl):
    """OpenCL through PyOpenCL: one device per OpenCL device, streams are command queues.

    Environment: ``HAL_OPENCL_PLATFORM`` (substring of the platform name, case-insensitive)
    and ``HAL_OPENCL_DEVICES`` (comma list of indices or name substrings).
    """

    name = "opencl"
    api_version = (1, 2)

    def __init__(self) -> None:
        ocl = import_pyopencl()
        selection = select_devices(ocl)
        self._cl_version = str(ocl.VERSION_TEXT)
        self._devices: list[OpenCLDevice] = []
        contexts: dict[int, cl.Context] = {}
        for platform in selection.platforms:
            members = [d for p, d in selection.devices if p == platform]
            try:
                contexts[id(platform)] = ocl.Context(members)
            except ocl.Error as exc:
                raise BackendUnavailableError(
                    self.name, f"cannot create an OpenCL context on {platform.name!r}: {exc}"
                ) from exc
        for index, (platform, device) in enumerate(selection.devices):
            context = next(contexts[id(p)] for p in selection.platforms if p == platform)
            self._devices.append(OpenCLDevice(index, platform, device, context))
        for dev in self._devices:
            dev.peers = [o for o in self._devices if o is not dev and o.context is dev.context]
            dev._declare()
        self._platforms = selection.platforms

    def devices(self) -> Sequence[DeviceImpl]:
        return self._devices

    def version_info(self) -> dict[str, str]:
        out = {"pyopencl": self._cl_version, "hal-sdk": __version__}
        for i, p in enumerate(self._platforms):
            out[f"platform{i}"] = f"{p.name.strip()} ({p.version.strip()})"
        return out
