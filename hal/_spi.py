"""The backend SPI: the abstract classes a vendor implements.

The SPI is deliberately small. A backend provides a :class:`BackendImpl` that lists
:class:`DeviceImpl` objects; each device allocates :class:`MemoryImpl`, and creates
:class:`StreamImpl` and :class:`EventImpl`. hal core wraps these in the public
``Device``/``Buffer``/``Stream``/``Event`` objects, validates every argument *before*
calling into the SPI, and translates nothing else: an SPI method may assume its
arguments are in range, on the right device and not closed.

Ordering contract: every ``StreamImpl`` method that enqueues work (copies, memset,
``record``, ``wait``) returns immediately and the work runs in submission order on that
stream. Host memory passed to an enqueued copy must stay valid until the stream has
reached it (exactly as with ``cudaMemcpyAsync``); hal core guarantees that for the
copies it issues.

Errors: raise from the ``hal`` error tree (translate vendor status codes at this
boundary). Asynchronous failures are raised at the next ``synchronize``.

Threads: hal.comm and hal.sched call one backend from several host threads at once.
``DeviceImpl.alloc``, ``MemoryImpl.free``, ``DeviceImpl.memory_in_use``/``health`` and
every ``StreamImpl``/``EventImpl`` method may run concurrently (different streams and
events; one stream is used by one thread at a time, but its ``query``/``synchronize``
may be called from another). Count memory with :class:`MemoryAccount`.

Lifetime: ``MemoryImpl.free`` may be called while work enqueued earlier on a stream
still uses the memory: keep the storage alive until that work is done (reference it from
the queued operation, or let the driver's free wait). ``StreamImpl.close`` may be called
by the garbage collector with work queued: that work still completes.

Version: SPI 1.1 adds :class:`MemoryAccount`, ``DeviceImpl.health``, the ``work``
argument of ``StreamImpl.launch`` and ``DeviceImpl.adopt``; SPI 1.2 adds the optional
``StreamImpl.launcher``, ``StreamImpl.copy_from_array`` and ``StreamImpl.copy_to_array``; a
backend written against 1.0 loads unchanged.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar, final

from hal._capabilities import Capabilities
from hal._errors import HalError, OutOfMemoryError

_T = TypeVar("_T")

__all__ = [
    "TRANSFER_DIRECTIONS",
    "BackendImpl",
    "BufferArg",
    "DeviceImpl",
    "EventImpl",
    "HostRegion",
    "HostSignalImpl",
    "KernelBuildError",
    "KernelParam",
    "KernelSignature",
    "MemoryAccount",
    "MemoryImpl",
    "ProgramImpl",
    "StreamImpl",
    "check_baseline_args",
]


@final
class MemoryAccount:
    """Thread-safe accounting of one device's allocations (SPI 1.1): the one helper to use.

    hal core, ``hal.comm`` and ``hal.sched`` call a backend from several host threads at
    once; every built-in backend and the example count their memory with this class instead
    of a counter of their own. Typical use::

        self.account = MemoryAccount(capacity, device="mydev:0")

        def alloc(self, nbytes):
            # hal.OutOfMemoryError when it does not fit; nothing stays counted if MyMemory raises
            return self.account.allocate(nbytes, MyMemory, self, nbytes)

        # and MyMemory.free() calls self.device.account.release(self.nbytes), once

        def memory_in_use(self):
            return self.account.in_use

    Args:
        capacity: bytes the device can hold (``DeviceImpl.total_memory``).
        device: the ``backend:index`` string the error names.
        hint: appended to the out-of-memory message (what the user can do about it).

    Raises:
        ValueError: ``capacity`` is negative.
    """

    __slots__ = ("_lock", "_used", "capacity", "device", "hint")

    def __init__(self, capacity: int, device: str, hint: str = "") -> None:
        if int(capacity) < 0:
            raise ValueError(f"{capacity=} must be >= 0")
        self.capacity = int(capacity)
        self.device = device
        self.hint = hint
        self._lock = threading.Lock()
        self._used = 0

    def reserve(self, nbytes: int) -> None:
        """Count ``nbytes`` as allocated, or raise ``hal.OutOfMemoryError`` (counting nothing)."""
        with self._lock:
            free = self.capacity - self._used
            if nbytes > free:
                extra = f" ({self.hint})" if self.hint else ""
                raise OutOfMemoryError(
                    f"cannot allocate {nbytes} bytes: {free} of {self.capacity} free{extra}",
                    device=self.device,
                )
            self._used += nbytes

    def allocate(self, nbytes: int, make: Callable[..., _T], *args: Any) -> _T:
        """Reserve ``nbytes``, then return ``make(*args)``; if it raises, release them and re-raise.

        The whole accounting of ``DeviceImpl.alloc``: a refusal is the ``hal.OutOfMemoryError``
        of :meth:`reserve` (``make`` is not called), and a failed allocation leaves nothing
        counted. The memory ``make`` returns calls :meth:`release` when it is freed.
        """
        self.reserve(nbytes)
        try:
            return make(*args)
        except BaseException:
            self.release(nbytes)
            raise

    def release(self, nbytes: int) -> None:
        """Return ``nbytes`` reserved earlier (call it exactly once per reservation)."""
        with self._lock:
            self._used -= nbytes

    @property
    def in_use(self) -> int:
        """Bytes reserved and not released (``DeviceImpl.memory_in_use``)."""
        with self._lock:
            return self._used

    @property
    def free(self) -> int:
        """Bytes that still fit."""
        with self._lock:
            return self.capacity - self._used


TRANSFER_DIRECTIONS = ("h2d", "d2h", "d2d", "peer")
"""The copies ``hal bench memory`` times, and a ``memory_baseline`` accepts (host -> device 0,
device 0 -> host, within device 0, device 1 -> device 0)."""


@final
@dataclasses.dataclass(frozen=True)
class HostRegion:
    """Host memory of this process that other processes on the host may map (optional SPI).

    ``size`` bytes at address ``base`` of this process, the whole of the file open here as
    descriptor ``fd`` (a memfd, or a file in ``/dev/shm``) whose inode number is ``inode``. A
    backend whose device memory is such a mapping (the CPU emulator's arena) offers it with
    :meth:`share`; hal.comm's shared-memory transport then lets each peer that may read this
    process's memory anyway (the ptrace rights of cross-memory attach) open the file
    (``/proc/<pid>/fd/<fd>``, checked against ``inode``), map it once, and copy pieces of
    collectives straight out of it (or into it) with ``memcpy``.
    """

    base: int
    size: int
    fd: int
    inode: int

    def share(self) -> None:
        """Offer this region to peers of this process; idempotent.

        The region must stay mapped and ``fd`` open until :meth:`withdraw`.
        """
        with _host_regions_lock:
            if self not in _host_regions:
                _host_regions.append(self)

    def withdraw(self) -> None:
        """Stop offering this region (a process forked from its owner: not its memory)."""
        with _host_regions_lock:
            if self in _host_regions:
                _host_regions.remove(self)

    @staticmethod
    def shared() -> tuple[HostRegion, ...]:
        """The regions this process offers now (:meth:`share`), oldest first."""
        with _host_regions_lock:
            return tuple(_host_regions)


_host_regions: list[HostRegion] = []
_host_regions_lock = threading.Lock()


def check_baseline_args(direction: str, nbytes: int, repeat: int) -> None:
    """Validate the arguments of a ``memory_baseline(direction, nbytes, repeat)`` (SPI 1.1).

    The baselines a backend registers with the ``hal_register_baselines`` hook call this
    first, so that every backend refuses the same bad input with the same message.

    Raises:
        ValueError: ``direction`` is not one of :data:`TRANSFER_DIRECTIONS`, ``nbytes`` is not
            a positive int, or ``repeat`` is not an int >= 1 (a bool is neither).
    """
    if direction not in TRANSFER_DIRECTIONS:
        raise ValueError(f"direction={direction!r} must be one of {', '.join(TRANSFER_DIRECTIONS)}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes={nbytes!r} must be a positive integer")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat={repeat!r} must be an integer >= 1")


class MemoryImpl(abc.ABC):
    """One device allocation of ``nbytes`` bytes."""

    nbytes: int

    @abc.abstractmethod
    def free(self) -> None:
        """Release the allocation. Called exactly once by hal core."""

    def export_handle(self) -> str:
        """Return a string another process passes to ``DeviceImpl.import_handle`` to map this memory.

        Optional (SPI 1.1; ``Capabilities.ipc``; ``hal.Buffer.export_handle``). The handle names
        the memory, not a copy; it stays valid while this allocation is not freed.
        """
        raise NotImplementedError("this backend's memory has no handles for other processes")

    def dlpack_device(self) -> tuple[int, int]:
        """Return ``(device_type, device_id)`` per the DLPack spec, or raise ``BufferError``.

        Name the memory the capsule points to (``kDLCPU`` = 1 only for memory the host reads;
        ``kDLCUDA`` = 2 for device memory, ...): the capsule of :meth:`dlpack` carries the same
        pair (conformance ``DLPACK-DEVICE``).
        """
        raise BufferError("this backend's memory is not reachable through DLPack")

    def dlpack(
        self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any
    ) -> Any:
        """Return a DLPack capsule for a typed view at ``offset``, or raise ``BufferError``.

        Called by ``hal.Array.__dlpack__`` (zero-copy exports only; hal core makes the
        host copies of ``copy=True`` itself). In: ``dtype`` (a NumPy dtype), ``shape``
        (C-contiguous), ``offset`` (bytes into this allocation), ``stream`` (the consumer's
        stream as the DLPack protocol passes it: None, -1 = no ordering, or a
        backend-specific stream handle) and ``max_version`` (None: a legacy ``dltensor``
        capsule; ``(1, x)``: a ``dltensor_versioned`` one may be returned). Out: a capsule
        whose deleter keeps the allocation alive until the consumer releases it (build it
        with your SDK or a library that exports DLPack, e.g. NumPy for host memory, CuPy
        for CUDA memory). hal core does *not* synchronize before calling: make the export
        show every operation enqueued on this device's streams before the call (wait on
        the host, or order the consumer's ``stream`` after them), except for ``stream=-1``.
        """
        raise BufferError("this backend's memory is not reachable through DLPack")


class EventImpl(abc.ABC):
    """A marker in a stream; optionally records a timestamp (``timing=True``)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block until the work before the last ``record`` has completed."""

    @abc.abstractmethod
    def query(self) -> bool:
        """Return True if the last recorded work has completed (or it was never recorded)."""

    @abc.abstractmethod
    def elapsed_ms(self, start: EventImpl) -> float:
        """Return milliseconds between ``start`` and this event (both recorded and completed)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; optional."""


# -- optional capability: host signals (``Capabilities.host_signal``) ---------------------
class HostSignalImpl(abc.ABC):
    """A wait enqueued on a stream by :meth:`StreamImpl.wait_host`, released by :meth:`set`."""

    @abc.abstractmethod
    def set(self) -> None:
        """Release the wait: the work enqueued after it may now start.

        Called exactly once by hal core, from any thread (often not the one that enqueued
        the wait), also when the signal failed or timed out (hal core records the failure
        and raises it at the stream's next synchronize). Must not block on the stream.
        """


# -- optional capability: portable kernels (``Capabilities.kernels``) ----------------------
class KernelBuildError(HalError):
    """A kernel source failed to compile; ``build_log`` holds the compiler's output.

    Attributes:
        build_log: the backend compiler's log (errors and warnings), verbatim.
        device: a ``backend:index`` string naming the device, or ``None``.
    """

    def __init__(self, message: str, *, build_log: str = "", device: str | None = None) -> None:
        text = message if not build_log else f"{message}\n--- build log ---\n{build_log.rstrip()}"
        super().__init__(text)
        self.build_log = build_log
        self.device = device


@final
@dataclasses.dataclass(frozen=True)
class KernelParam:
    """One parameter of a kernel: a global-memory pointer or a scalar.

    Attributes:
        name: the parameter name in the source.
        ctype: the element type (pointers) or scalar type, as a C type name after
            translation (``float``, ``double``, ``int32_t``, ``int64_t``, ``_Float16`` ...).
        pointer: True for a ``HAL_GLOBAL T*`` parameter (pass a :class:`BufferArg`).
        const: True if the pointer was declared ``const`` (the kernel only reads it).
        dtype: the NumPy dtype name matching ``ctype`` (``"float32"`` ...).
    """

    name: str
    ctype: str
    pointer: bool
    const: bool
    dtype: str


@final
@dataclasses.dataclass(frozen=True)
class KernelSignature:
    """A kernel entry point of a program: its name and parameters, in order."""

    name: str
    params: tuple[KernelParam, ...]


@final
@dataclasses.dataclass(frozen=True)
class BufferArg:
    """A kernel argument pointing into device memory at a byte offset."""

    memory: MemoryImpl
    offset: int


class ProgramImpl(abc.ABC):
    """A compiled program (one or more kernels) on one device.

    hal may let go of a program while launches of it are still queued (the in-memory program
    cache is bounded, ``hal.runtime().reset()`` drops it): a queued launch must keep what it
    needs (the loaded code) alive until it has run.

    Attributes:
        build_log: compiler output of the build (may be empty).
        kernels: the entry points, by name.
    """

    build_log: str = ""
    kernels: dict[str, KernelSignature]

    def binary(self) -> bytes | None:
        """Return a serialized form that :meth:`DeviceImpl.load_program` accepts, or None.

        hal.kernels stores it in the compile cache (``HAL_CACHE_DIR``).
        """
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the program; optional."""


class StreamImpl(abc.ABC):
    """An in-order queue of work on one device."""

    #: True where a launch enqueued by :meth:`launcher`'s result keeps its memory alive until
    #: it completes (as OpenCL retains an enqueued kernel's buffers): hal.kernels then keeps no
    #: reference to a repeated call's arrays (optional, SPI 1.2; default False)
    launches_retain_memory: bool = False

    def launch(
        self,
        program: ProgramImpl,
        kernel: str,
        global_size: tuple[int, ...],
        args: Sequence[BufferArg | Any],
        work: int | None = None,
    ) -> None:
        """Enqueue ``kernel`` of ``program`` over ``global_size`` (1 to 3 dims, each > 0).

        Optional (``Capabilities.kernels``). ``args`` follow the kernel signature:
        a :class:`BufferArg` per pointer parameter, a NumPy scalar of the parameter's
        dtype per scalar parameter (hal.kernels converts and checks them).

        ``work`` (SPI 1.1; hal.kernels always passes it, as a keyword) is the number of
        elements the call processes, or None: a hint for emulators and schedulers that
        model cost (the CPU emulator's speed model). Accept it and ignore it if you have
        no use for it; a ``launch`` without the parameter raises ``TypeError``.
        """
        raise NotImplementedError("this backend does not launch kernels")

    def launcher(
        self,
        program: ProgramImpl,
        kernel: str,
        global_size: tuple[int, ...],
        work: int | None = None,
    ) -> Callable[..., None] | None:
        """Return a launch of ``kernel`` over ``global_size`` on this stream prepared once, or None.

        Optional (SPI 1.2; the default returns None and hal.kernels calls :meth:`launch`).
        hal.kernels asks once per kind of repeated op call and then calls the result for
        each launch, in place of ``launch(program, kernel, global_size, args, work=work)``,
        with the kernel's arguments as positional parameters: two per pointer parameter
        (its :class:`MemoryImpl` and the byte offset, an int) and one per scalar parameter
        (a Python or NumPy number of the parameter's kind). The same ordering, error and
        lifetime rules as :meth:`launch` apply; raise :class:`hal.StreamError` for memory
        freed since (a launch never runs on freed memory). The result is called like the
        stream's own methods (by one thread at a time), never after :meth:`close`.

        See :attr:`launches_retain_memory` for the memory of the enqueued launches.
        """
        return None

    @abc.abstractmethod
    def copy_from_host(
        self, dst: MemoryImpl, dst_offset: int, src: memoryview, nbytes: int
    ) -> None:
        """Enqueue a host->device copy of ``nbytes`` from ``src`` (a contiguous byte view)."""

    @abc.abstractmethod
    def copy_to_host(self, dst: memoryview, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        """Enqueue a device->host copy into ``dst`` (a writable contiguous byte view)."""

    def copy_from_array(self, dst: MemoryImpl, dst_offset: int, src: Any, nbytes: int) -> bool:
        """Enqueue a host->device copy of all of the NumPy array ``src``, or do nothing and return False.

        Optional (SPI 1.2; the default returns False and hal core calls :meth:`copy_from_host`
        with a byte view): the small-copy fast path of ``hal.copy``, without a memoryview per
        call. hal core has checked everything but the array's layout: ``src`` is a
        ``numpy.ndarray`` (exactly) of plain numbers holding ``nbytes`` > 0 bytes, which fit
        at ``dst_offset``. Return False without enqueuing anything when ``src`` is not
        C-contiguous (or the fast path does not apply now); hal core then takes the usual
        path, which raises its usual errors. The same ordering and lifetime rules as
        :meth:`copy_from_host` apply (keep what ``src``'s memory needs alive while queued).
        """
        return False

    def copy_to_array(self, dst: Any, src: MemoryImpl, src_offset: int, nbytes: int) -> bool:
        """Enqueue a device->host copy into the first ``nbytes`` bytes of the NumPy array ``dst``, or return False.

        Optional (SPI 1.2; the default returns False and hal core calls :meth:`copy_to_host`),
        like :meth:`copy_from_array`: ``dst`` is a ``numpy.ndarray`` of plain numbers of at
        least ``nbytes`` > 0 bytes; return False without enqueuing anything when it is not
        C-contiguous or not writable.
        """
        return False

    @abc.abstractmethod
    def copy(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        """Enqueue a copy between two allocations of this stream's device (may overlap: memmove)."""

    def copy_peer(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        """Enqueue a direct copy between allocations of two devices of this backend.

        Called only when ``DeviceImpl.can_access_peer`` is true for the pair. The stream
        belongs to one of the two devices.
        """
        raise NotImplementedError("peer copies are not supported by this backend")

    @abc.abstractmethod
    def memset(self, dst: MemoryImpl, offset: int, value: int, nbytes: int) -> None:
        """Enqueue setting ``nbytes`` bytes at ``offset`` to the byte ``value`` (0..255)."""

    @abc.abstractmethod
    def record(self, event: EventImpl) -> None:
        """Enqueue ``event``: it completes when the work enqueued before it has completed."""

    @abc.abstractmethod
    def wait(self, event: EventImpl) -> None:
        """Make work enqueued after this call wait until ``event`` (as last recorded) completes."""

    def wait_host(self) -> HostSignalImpl:
        """Enqueue a wait for the host and return the signal that releases it.

        Optional (``Capabilities.host_signal``). Work enqueued on this stream after the call
        must not start until the returned signal's :meth:`HostSignalImpl.set` is called,
        while the work enqueued before runs on; ``synchronize`` and ``query`` treat the wait
        as pending work. Return at once (never block the caller). Without this capability
        hal core falls back to blocking, on the host, the next call that enqueues on the
        stream until the signal is set.
        """
        raise NotImplementedError("this backend has no host signals")

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block until all enqueued work has completed; raise any asynchronous failure."""

    @abc.abstractmethod
    def query(self) -> bool:
        """Return True if all enqueued work has completed.

        Must not block: return False at once while work is pending (conformance
        ``STREAM-QUERY-NONBLOCKING``). Callers poll it from other threads.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the stream; optional.

        Called once, either by ``Stream.close()`` after a ``synchronize()``, or by the
        stream's finalizer when the public ``Stream`` is garbage-collected, possibly with
        work still queued and from any thread. In that case the queued work must still
        complete (wait for it here, or release the stream's resources only once the
        device is done with them): dropping it is a conformance failure (``STREAM-GC``).
        """


class DeviceImpl(abc.ABC):
    """One device of a backend."""

    name: str
    vendor: str
    total_memory: int
    capabilities: Capabilities

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> MemoryImpl:
        """Allocate ``nbytes`` (> 0) bytes; raise ``hal.OutOfMemoryError`` when they do not fit.

        Called from several host threads at once (hal.comm, hal.sched): count memory with
        :class:`MemoryAccount`, which is thread-safe.
        """

    @abc.abstractmethod
    def create_stream(self) -> StreamImpl:
        """Create a stream."""

    @abc.abstractmethod
    def create_event(self, timing: bool) -> EventImpl:
        """Create an event; ``timing`` asks for timestamps."""

    def can_access_peer(self, other: DeviceImpl) -> bool:
        """Return True if direct copies between this device and ``other`` (same backend) work."""
        return False

    def enable_peer_access(self, other: DeviceImpl) -> None:  # noqa: B027 - optional hook
        """Enable direct access to ``other``; called only when ``can_access_peer`` is true."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block until all work on all streams of this device has completed."""

    def memory_in_use(self) -> int | None:
        """Return the bytes currently allocated through this device, if the backend tracks it."""
        return None

    def properties(self) -> dict[str, Any]:
        """Return extra, backend-specific properties for ``hal info`` (JSON-friendly).

        Keys other parts of hal read (all optional): ``speed`` (relative throughput, 1.0 =
        nominal; ``hal.sched`` places work by it), ``compute_units`` (int), and the error
        counters of :meth:`health` (``hal.sched`` reads those through :meth:`health`).
        """
        return {}

    def health(self) -> dict[str, int]:
        """Return the device's error counters since the backend was loaded (SPI 1.1).

        Keys (all optional, non-negative ints): ``ecc_corrected``, ``ecc_uncorrected``,
        ``errors`` (failed operations the device reported), ``resets``. Return the driver's
        counters where it has them (CUDA: NVML ECC counts); ``{}`` when the device reports
        none. Called from any thread, often; must not block on the device.
        """
        return {}

    # -- optional capability: portable kernels ---------------------------------------------
    kernel_dialect: str = ""
    """The language this device compiles: ``"c"``, ``"opencl"`` or ``"cuda"`` ("" = none).

    hal.kernels translates the portable kernel language into it before :meth:`compile`."""

    def compiler_info(self) -> dict[str, str]:
        """Return compiler/driver identity strings (versions, flags) for the compile-cache key."""
        return {}

    def compile(
        self, source: str, *, options: Sequence[str], kernels: Sequence[KernelSignature]
    ) -> ProgramImpl:
        """Compile translated ``source`` (in :attr:`kernel_dialect`) with its entry points ``kernels``.

        Optional (``Capabilities.kernels``). Raise :class:`KernelBuildError` with the
        compiler's log when the source does not compile.
        """
        raise NotImplementedError("this backend does not compile kernels")

    def load_program(
        self,
        binary: bytes,
        *,
        source: str,
        options: Sequence[str],
        kernels: Sequence[KernelSignature],
    ) -> ProgramImpl:
        """Rebuild a program from :meth:`ProgramImpl.binary` output (a compile-cache hit).

        Raise any exception when the binary is unusable: hal.kernels then recompiles.
        """
        raise NotImplementedError("this backend does not load program binaries")

    # -- optional: adopting foreign memory zero-copy (``hal.from_dlpack``) -------------------
    def adopt(
        self, *, dl_device: tuple[int, int], address: int, nbytes: int, owner: object
    ) -> MemoryImpl | None:
        """Wrap ``nbytes`` of memory a DLPack producer owns as an allocation of this device, or return None.

        Optional. ``dl_device`` is the producer's DLPack ``(device_type, device_id)`` and
        ``address`` the first byte (0 when ``nbytes`` is 0). Return None unless that memory is
        usable as this device's memory as it is (no copy). The returned ``MemoryImpl`` must keep
        ``owner`` referenced until ``free()``, and ``free()`` drops the reference instead of
        releasing the memory (the producer owns it). hal core calls this only for
        C-contiguous, writable memory.
        """
        return None

    def import_handle(self, payload: str, nbytes: int) -> MemoryImpl:
        """Map the memory another process exported (``MemoryImpl.export_handle``) as an allocation here.

        Optional (SPI 1.1; ``Capabilities.ipc``). The result is not counted in
        ``memory_in_use`` (the exporter owns the memory); its ``free()`` unmaps it. Raise
        ``hal.HalError`` (or ``ValueError`` for a malformed payload) naming why it cannot be
        opened, e.g. the exporter freed it or exited.
        """
        raise NotImplementedError("this backend cannot open memory of another process")

    def alloc_host(self, nbytes: int) -> Any:
        """Return ``nbytes`` (> 0) of host memory this device copies from and to fastest, or None.

        Optional (SPI 1.1; ``hal.alloc_host``/``hal.empty_host``). Return an object with the
        writable buffer protocol of at least ``nbytes`` bytes (page-locked memory, a mapped
        host-accessible buffer ...) that keeps the memory alive while referenced and releases
        it when collected, and accept it as the host side of ``copy_from_host``/``copy_to_host``.
        None (the default): hal gives plain host memory. Raise ``hal.OutOfMemoryError`` when
        the memory cannot be had.
        """
        return None


class BackendImpl(abc.ABC):
    """A backend: a factory of devices. Registered by a plugin's ``hal_register_backends`` hook.

    Class attributes:
        name: the backend name used in ``"name:index"`` device strings.
        api_version: the SPI version this backend was written against; the major must match.
    """

    name: ClassVar[str]
    api_version: ClassVar[tuple[int, int]] = (1, 0)
    #: True for a software emulator: without ``HAL_BACKENDS``, emulators come after every
    #: other backend in ``hal.devices()`` order (real devices are the default).
    emulator: ClassVar[bool] = False

    @abc.abstractmethod
    def __init__(self) -> None:
        """Probe the machine. Raise ``hal.BackendUnavailableError`` with an actionable reason
        when the backend cannot run here (SDK missing, no driver, no device)."""

    @abc.abstractmethod
    def devices(self) -> Sequence[DeviceImpl]:
        """Return the devices of this backend, in index order."""

    def version_info(self) -> dict[str, str]:
        """Return versions of the vendor stack (SDK, driver, runtime) for reports."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release backend-wide resources; optional.

        Called once per backend instance: by ``hal.runtime().reset()`` (and so by
        ``hal.plugins.reload()``), or at interpreter exit for the backends still loaded then.
        Buffers, streams and events a program kept may be freed by their finalizers after it:
        keep ``MemoryImpl.free`` and the other ``close`` methods safe to call afterwards.
        """
