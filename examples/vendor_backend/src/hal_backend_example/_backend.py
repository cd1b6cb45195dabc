"""The example backend: every device owns host memory (``bytearray``) with its own accounting.

Streams execute each operation when it is enqueued. That is a valid in-order stream (the
work is complete before the next call), so synchronize/query/wait are trivial; a real
device enqueues to its driver and implements them with the driver's fences. What a real
backend must get right all the same: exact copies at any offset, memmove semantics within
an allocation, ``hal.OutOfMemoryError`` with nothing leaked, timing events in milliseconds,
and capabilities that say what is absent *and why* (the certificate carries the reasons).

Environment: ``HAL_EXAMPLE_DEVICES`` (default 2), ``HAL_EXAMPLE_MEMORY`` (bytes per device,
default 1 GiB).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from hal import BackendUnavailableError, OutOfMemoryError
from hal.spi import (
    BackendImpl,
    Capabilities,
    DeviceImpl,
    EventImpl,
    MemoryAccount,
    MemoryImpl,
    StreamImpl,
)

__all__ = ["ExampleBackend"]


class ExampleMemory(MemoryImpl):
    """One allocation: a ``bytearray`` of ``nbytes``."""

    def __init__(self, device: ExampleDevice, nbytes: int) -> None:
        self.device = device
        self.nbytes = nbytes
        self.data = bytearray(nbytes)

    def free(self) -> None:
        self.data = bytearray()
        self.device.release(self.nbytes)


class ExampleEvent(EventImpl):
    """An event: the time of its last record (work before it is already complete)."""

    def __init__(self, timing: bool) -> None:
        self.timing = timing
        self.time: float | None = None

    def synchronize(self) -> None:
        pass  # everything recorded has completed

    def query(self) -> bool:
        return True

    def elapsed_ms(self, start: EventImpl) -> float:
        assert isinstance(start, ExampleEvent) and start.time is not None and self.time is not None
        return (self.time - start.time) * 1e3


class ExampleStream(StreamImpl):
    """A stream that runs each operation as it is enqueued (in order by construction)."""

    def copy_from_host(
        self, dst: MemoryImpl, dst_offset: int, src: memoryview, nbytes: int
    ) -> None:
        assert isinstance(dst, ExampleMemory)
        dst.data[dst_offset : dst_offset + nbytes] = src[:nbytes]

    def copy_to_host(self, dst: memoryview, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        assert isinstance(src, ExampleMemory)
        dst[:nbytes] = src.data[src_offset : src_offset + nbytes]

    def copy(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        assert isinstance(dst, ExampleMemory) and isinstance(src, ExampleMemory)
        # slicing a bytearray copies first, so overlapping ranges behave like memmove
        dst.data[dst_offset : dst_offset + nbytes] = src.data[src_offset : src_offset + nbytes]

    def memset(self, dst: MemoryImpl, offset: int, value: int, nbytes: int) -> None:
        assert isinstance(dst, ExampleMemory)
        dst.data[offset : offset + nbytes] = bytes((value,)) * nbytes

    def record(self, event: EventImpl) -> None:
        assert isinstance(event, ExampleEvent)
        event.time = time.perf_counter()

    def wait(self, event: EventImpl) -> None:
        pass  # the recorded work has completed already

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class ExampleDevice(DeviceImpl):
    """A device with ``capacity`` bytes of host memory."""

    def __init__(self, index: int, capacity: int) -> None:
        self.index = index
        self.name = f"Example host-memory device {index}"
        self.vendor = "Example Corp."
        self.total_memory = capacity
        self.capabilities = Capabilities(
            p2p=False,
            ipc=False,
            timing_events=True,
            kernels=False,
            dlpack=False,
            fp64=False,
            concurrent_streams=False,
            absent_reasons={
                "p2p": "example devices have no peer links; hal stages copies between them through the host",
                "ipc": "allocations are private bytearrays of one process",
                "kernels": "the example backend compiles no kernels",
                "dlpack": "the example keeps its memory private (no DLPack export)",
                "concurrent_streams": "streams execute each operation when it is enqueued",
                "host_signal": "streams execute each operation when it is enqueued; hal core's fallback "
                "holds the next enqueue on the host until the signal is set",
                "fp64": "no kernels, hence no double-precision arithmetic",
                "fp16": "no kernels, hence no half-precision arithmetic",
            },
        )
        # hal calls alloc/free from several threads at once: the SPI's thread-safe accounting
        self.account = MemoryAccount(
            capacity, f"example:{index}", "raise HAL_EXAMPLE_MEMORY for more"
        )
        self.errors = 0

    def alloc(self, nbytes: int) -> MemoryImpl:
        # hal.OutOfMemoryError naming the device when it does not fit; counts nothing if
        # _new_memory raises
        return self.account.allocate(nbytes, self._new_memory, nbytes)

    def _new_memory(self, nbytes: int) -> ExampleMemory:
        try:
            return ExampleMemory(self, nbytes)
        except MemoryError as exc:
            self.errors += 1
            raise OutOfMemoryError(
                f"host refused {nbytes} bytes", device=f"example:{self.index}"
            ) from exc

    def release(self, nbytes: int) -> None:
        """Return ``nbytes`` to the device's accounting."""
        self.account.release(nbytes)

    def memory_in_use(self) -> int:
        return self.account.in_use

    def properties(self) -> dict[str, object]:
        return {"speed": 1.0, "compute_units": 1, "memory_in_use": self.account.in_use}

    def health(self) -> dict[str, int]:
        return {"errors": self.errors}

    def create_stream(self) -> StreamImpl:
        return ExampleStream()

    def create_event(self, timing: bool) -> EventImpl:
        return ExampleEvent(timing)

    def synchronize(self) -> None:
        pass


class ExampleBackend(BackendImpl):
    """The ``example`` backend."""

    name = "example"
    api_version = (1, 1)  # the SPI this backend was written against (hal.spi.API_VERSION)

    def __init__(self) -> None:
        raw = os.environ.get("HAL_EXAMPLE_DEVICES", "2")
        if not raw.isdigit() or int(raw) < 1:
            raise BackendUnavailableError(
                "example", f"HAL_EXAMPLE_DEVICES={raw!r} must be a positive integer"
            )
        capacity = int(os.environ.get("HAL_EXAMPLE_MEMORY", str(1 << 30)))
        self._devices = [ExampleDevice(i, capacity) for i in range(int(raw))]

    def devices(self) -> Sequence[DeviceImpl]:
        return self._devices

    def version_info(self) -> dict[str, str]:
        return {"example-runtime": "1.0"}
