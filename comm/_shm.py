"""Shared-memory transport between processes of one host: rings of slots in /dev/shm.

Each rank creates one segment holding, for every peer, a ring of ``HAL_COMM_SHM_SLOTS``
slots of ``HAL_COMM_CHUNK_BYTES`` bytes. The sender copies a piece from device memory
straight into a free slot and bumps the ring's ``head``; the receiver copies it out (or
reduces it) and bumps ``tail``. Pieces pipeline: while a peer drains slot k the sender fills
slot k+1. Counters are aligned 64-bit words on separate cache lines (atomic on x86-64 and
AArch64, whose stores are not reordered past the data they publish on x86-64 (TSO)).
Segments are unlinked as soon as every rank has mapped them, so a crash after set-up leaks
nothing. Names carry the creating process's pid (``hal-comm-<job>-<rank>-<pid>``, and
``.wake`` for its pipe): a rank killed *during* set-up leaves its files behind, and the next
shared-memory communicator (or ``hal run``) of the same user removes those whose process
is gone (:func:`remove_stale_segments`).

Each segment starts with a header page holding its rank's doorbell (a futex word and a count
of sleepers). When every rank can load the native engine (hal.comm._native, ``_native_shm.c``;
``HAL_COMM_NATIVE=0`` turns it off), the transport becomes a :class:`NativeShmTransport`: a whole
collective runs in one C call (its plan's steps recorded from the algorithms and pipelined in C),
any other exchange in one C call per step, and every
wake-up (also those of the Python piece calls the point-to-point port uses) rings the peer's
doorbell instead of writing to its pipe.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import mmap
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

import hal
from hal.comm import _native
from hal.comm._algorithms import Run
from hal.comm._transport import (
    CallContext,
    Recv,
    Send,
    StagedTransport,
    World,
    _host_view,
    wait_fds,
)
from hal.spi import HostRegion, setting

_log = logging.getLogger("hal.comm")

__all__ = [
    "FALLBACK_MARKER",
    "NativeShmTransport",
    "ShmTransport",
    "check_space",
    "remove_stale_segments",
    "space_needed",
]

_LINE = 64
_HEADER = 4096  # each segment starts with its rank's doorbell (native engine): a counter, sleepers
_SHM_DIR = "/dev/shm"
_STALE = re.compile(r"hal-comm-[0-9a-f]{32}-\d+-(\d+)(\.wake)?")
#: The fixed marker every rank logs when too small a /dev/shm sends it to tcp.
FALLBACK_MARKER = "shm fallback:"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def space_needed(ranks: int, slots: int | None = None, slot_bytes: int | None = None) -> int:
    """Return the bytes of ``/dev/shm`` that the rings of ``ranks`` ranks of one host take together.

    Each rank's segment holds one ring per peer: ``ranks * (ranks - 1)`` rings of ``slots``
    slots of ``slot_bytes`` (``HAL_COMM_SHM_SLOTS``, ``HAL_COMM_CHUNK_BYTES`` by default).
    """
    if slots is None:
        slots = int(setting("HAL_COMM_SHM_SLOTS"))
    if slot_bytes is None:
        slot_bytes = _align(int(setting("HAL_COMM_CHUNK_BYTES")))
    return ranks * (_HEADER + max(0, ranks - 1) * _Ring.nbytes(slots, slot_bytes))


def free_space(directory: str = _SHM_DIR) -> int:
    """Return the bytes an unprivileged writer may still allocate in ``directory`` (-1 when unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def check_space(world: World) -> str | None:
    """Check, on every rank together, that ``/dev/shm`` holds the rings of the ranks of this host.

    Collective (one allgather): every rank reports the free space it sees and all take the same
    decision. Returns None when the rings fit, else the message saying how much is needed, how
    much is free and how to give more (``--shm-size``). Where the space is not filled up front a
    tmpfs that runs out kills a process writing into a mapped page with SIGBUS; this check (and
    ``posix_fallocate`` of each segment) turns that into a message.
    """
    need = space_needed(world.size)
    seen = world.bootstrap.allgather(free_space())
    known = [int(f) for f in seen if f is not None and int(f) >= 0]
    if not known or min(known) >= need:
        return None
    slots, chunk = int(setting("HAL_COMM_SHM_SLOTS")), _align(int(setting("HAL_COMM_CHUNK_BYTES")))
    suggest = 64 * -(-need * 5 // 4 // (64 << 20))  # MiB: a quarter to spare, in steps of 64 MiB
    return (
        f"{_SHM_DIR} has {_mib(min(known))} free but the shared-memory rings of {world.size} ranks need "
        f"{_mib(need)} ({world.size} ranks x {world.size - 1} peers x {slots} slots of {_mib(chunk)}); "
        f"give it more (docker run --shm-size={suggest}m, or `mount -o remount,size={suggest}M {_SHM_DIR}` "
        f"as root), make the rings smaller (HAL_COMM_SHM_SLOTS, HAL_COMM_CHUNK_BYTES), or set "
        f"HAL_COMM_SHM_FALLBACK=tcp to use tcp instead"
    )


def _seg(job: str, rank: int, pid: int) -> str:
    return f"{_SHM_DIR}/hal-comm-{job}-{rank}-{pid}"


def remove_stale_segments(directory: str = _SHM_DIR) -> list[str]:
    """Remove ``hal-comm-*`` files of this user whose creating process is gone; return their names.

    Only files named with a pid (``hal-comm-<job>-<rank>-<pid>[.wake]``) and owned by this
    user are considered; a file whose process still runs is kept.
    """
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    me = os.geteuid()
    for name in names:
        m = _STALE.fullmatch(name)
        if m is None:
            continue
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_uid != me or _pid_alive(int(m.group(1))):
                continue
            os.unlink(path)
            removed.append(name)
        except OSError:
            continue
    return removed


def _env_int(name: str, default: int, minimum: int) -> int:
    """Read bounded setting ``name`` (declared in hal.spi.SETTINGS; hal.ConfigError when bad)."""
    return int(setting(name))


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        return True


class _Ring:
    """One direction of one pair: ``slots`` slots in the sender's segment."""

    __slots__ = ("counters", "data", "sizes", "slot_bytes", "slots")

    def __init__(self, view: memoryview, slots: int, slot_bytes: int) -> None:
        self.slots = slots
        self.slot_bytes = slot_bytes
        # counters[0] = head (sender), counters[8] = tail (receiver): separate cache lines.
        self.counters: np.ndarray[Any, Any] = np.frombuffer(view[: 2 * _LINE], dtype=np.int64)
        self.sizes: np.ndarray[Any, Any] = np.frombuffer(
            view[2 * _LINE : 2 * _LINE + slots * 8], dtype=np.int64
        )
        base = 2 * _LINE + _align(slots * 8)
        self.data = [
            view[base + i * slot_bytes : base + (i + 1) * slot_bytes] for i in range(slots)
        ]

    @staticmethod
    def nbytes(slots: int, slot_bytes: int) -> int:
        return 2 * _LINE + _align(slots * 8) + slots * slot_bytes


def _align(n: int, to: int = 4096) -> int:
    return (n + to - 1) // to * to


#: madvise(2)'s MADV_POPULATE_WRITE (Linux 5.14; the mmap module of Python 3.11 does not name it)
_MADV_POPULATE_WRITE = 23


def _populate(m: mmap.mmap, start: int, length: int) -> None:
    """Fault the pages of ``m[start:start + length]`` in now, writable (their contents unchanged).

    The segments are filled at creation (``posix_fallocate``), but each process maps a page only
    at its first touch, a fault per 4 KiB: a slot's first use paid them inside the call (a 1 MiB
    ``all_gather`` on 2 ranks, 512 KiB per slot, took ~450 us more on each rank for its first two
    calls after a change of slot parity, measured here). Nothing happens where the kernel or the
    platform lacks the call.
    """
    lo = start // mmap.PAGESIZE * mmap.PAGESIZE
    with contextlib.suppress(AttributeError, OSError, ValueError):
        m.madvise(_MADV_POPULATE_WRITE, lo, min(len(m), start + length) - lo)


class ShmTransport(StagedTransport):
    """Pipelined rings of slots in POSIX shared memory (default between ranks of one host)."""

    name = "shm"
    alpha_s = 200e-6  # per message, as measured here (Python, a kernel launch, a wake-up)
    beta_s_per_byte = 1 / 4e9
    single_host = True
    path = "host-shm"

    def __init__(self, world: World) -> None:
        self.rank = world.rank
        self.size = world.size
        self._slot_bytes = _align(_env_int("HAL_COMM_CHUNK_BYTES", 4 << 20, 4096), 4096)
        self._slots = _env_int("HAL_COMM_SHM_SLOTS", 4, 2)
        self._pids = {e.rank: e.pid for e in world.endpoints}
        # measured here: spinning costs more than it saves (it starves this process's stream
        # workers and, on a shared machine, the peer), so waiting ranks block at once by default
        self._spin_s = _env_int("HAL_COMM_SPIN_US", 0, 0) / 1e6
        self._spin_until = 0.0
        ring_bytes = _Ring.nbytes(self._slots, self._slot_bytes)
        seg_bytes = _HEADER + ring_bytes * (world.size - 1)
        remove_stale_segments()  # left by ranks of this user killed during a set-up
        job = world.bootstrap.allgather(uuid.uuid4().hex if world.rank == 0 else None)[0]
        self._maps: list[mmap.mmap] = []
        self._views: list[memoryview] = []
        path = _seg(job, world.rank, os.getpid())
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        failed: str | None = None
        try:
            os.ftruncate(fd, seg_bytes)
            try:  # fill the segment now: a full tmpfs is an error here, never a SIGBUS at a later write
                os.posix_fallocate(fd, 0, seg_bytes)
            except OSError as exc:
                failed = (
                    f"cannot reserve {_mib(seg_bytes)} in {_SHM_DIR} "
                    f"({exc.strerror}; {_mib(max(0, free_space()))} free)"
                )
            own = mmap.mmap(fd, seg_bytes)
        finally:
            os.close(fd)
        self._maps.append(own)
        try:
            # every rank learns of a rank that could not reserve, and whether all run natively
            agreed = world.bootstrap.allgather([failed, _native.unavailable_reason()])
            short = [a[0] for a in agreed]
            native_off = [str(a[1]) for a in agreed if a[1]]
            bad = tuple(r for r, f in enumerate(short) if f)
            if bad:
                raise hal.CommError(
                    "shm: " + "; ".join(f"rank {r}: {short[r]}" for r in bad), op="init", ranks=bad
                )
            paths = world.bootstrap.allgather(path)  # every segment exists; names carry their pid
            for peer, other in enumerate(paths):
                base = os.path.basename(str(other))
                if (
                    os.path.dirname(str(other)) != _SHM_DIR
                    or not base.startswith(f"hal-comm-{job}-{peer}-")
                    or not _STALE.fullmatch(base)
                ):
                    raise hal.CommError(
                        f"shm: rank {peer} published segment {other!r}, not one of this job",
                        op="init",
                        ranks=(peer,),
                    )
            segs: dict[int, memoryview] = {world.rank: memoryview(own)}
            for peer in range(world.size):
                if peer == world.rank:
                    continue
                fd = os.open(paths[peer], os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
                try:
                    st = os.fstat(
                        fd
                    )  # the job's name was agreed at the (authenticated) rendezvous;
                    if (
                        st.st_uid != os.geteuid() or st.st_mode & 0o077
                    ):  # and the file must be ours alone
                        raise hal.CommError(
                            f"shm: segment {paths[peer]!r} of rank {peer} is not this user's "
                            f"alone (uid {st.st_uid}, mode {st.st_mode & 0o777:04o})",
                            op="init",
                            ranks=(peer,),
                        )
                    m = mmap.mmap(fd, seg_bytes)
                finally:
                    os.close(fd)
                self._maps.append(m)
                segs[peer] = memoryview(m)
            # wake-up pipes: a peer that publishes or frees a slot writes a byte to ours
            wake = path + ".wake"
            os.mkfifo(wake, 0o600)
            self._wake_r = os.open(wake, os.O_RDONLY | os.O_NONBLOCK)
            self._wake_self = os.open(wake, os.O_WRONLY | os.O_NONBLOCK)  # wake() from this process
            world.bootstrap.allgather(None)  # every pipe has its reader
            self._wake_w = {
                p: os.open(paths[p] + ".wake", os.O_WRONLY | os.O_NONBLOCK)
                for p in range(world.size)
                if p != world.rank
            }
            world.bootstrap.allgather(None)  # every segment and pipe opened everywhere
        finally:
            os.unlink(path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + ".wake")
        self._views = list(segs.values())

        def ring(owner: int, to: int) -> _Ring:
            idx = to if to < owner else to - 1
            v = segs[owner][_HEADER + idx * ring_bytes : _HEADER + (idx + 1) * ring_bytes]
            return _Ring(v, self._slots, self._slot_bytes)

        self._out = {p: ring(self.rank, p) for p in range(self.size) if p != self.rank}
        self._in = {p: ring(p, self.rank) for p in range(self.size) if p != self.rank}
        # map now the pages this rank touches: its own segment, and in each peer's the doorbell
        # and the ring to this rank (_populate)
        _populate(own, 0, seg_bytes)
        for peer, m in zip(
            (q for q in range(world.size) if q != world.rank), self._maps[1:], strict=True
        ):
            idx = world.rank if world.rank < peer else world.rank - 1
            _populate(m, 0, _HEADER)
            _populate(m, _HEADER + idx * ring_bytes, ring_bytes)
        self._closed = False
        self._native: _NativeShm | None = None
        #: why this communicator's shm collectives run on the Python path ("" when native)
        self.native_off = "; ".join(dict.fromkeys(native_off))
        if not native_off:
            lib = _native.load()
            assert lib is not None  # unavailable_reason() said it loads
            self._native = _NativeShm(self, lib, segs, ring_bytes)
            self.__class__ = NativeShmTransport
            self._native.agree_cma(world)

    @property
    def chunk_bytes(self) -> int:
        """Slot size: bytes per pipelined piece."""
        return self._slot_bytes

    def send_space(self, peer: int) -> memoryview | None:
        """Return the next free slot of the ring to ``peer``."""
        r = self._out[peer]
        head = int(r.counters[0])
        if head - int(r.counters[8]) >= r.slots:
            return None
        return r.data[head % r.slots]

    def send_commit(self, peer: int, nbytes: int) -> None:
        """Publish the slot filled since :meth:`send_space`."""
        r = self._out[peer]
        head = int(r.counters[0])
        r.sizes[head % r.slots] = nbytes
        r.counters[0] = head + 1
        self._poke(peer)

    def _poke(self, peer: int) -> None:
        if self._native is not None:  # every rank waits on its doorbell (a futex), not its pipe
            self._native.ring(peer)
            return
        # a full pipe already wakes the peer; a closed one means it left (liveness is checked apart)
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self._wake_w[peer], b"\1")

    def wake(self) -> None:
        """Interrupt :meth:`idle` (a call was queued for the engine that waits in it)."""
        if self._native is not None:
            self._native.ring(self.rank)
            return
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_self, b"\1")

    def idle(self, rounds: int) -> None:
        """Poll for ``HAL_COMM_SPIN_US`` (default 0), then sleep until a peer pokes our pipe.

        Polling keeps a waiting rank on its core, as MPI does; on a machine with fewer free
        cores than busy threads it starves the threads that would make progress instead.
        """
        if self._native is not None:
            self._native.idle(self._spin_s if rounds == 1 else 0.0)
            return
        if rounds == 1:
            self._spin_until = time.monotonic() + self._spin_s
        spinning = time.monotonic() < self._spin_until
        # while spinning, poll without blocking (the call also drops the GIL for a moment, so
        # this process's stream workers can run); then block until poked
        ready, _ = wait_fds([self._wake_r], (), 0.0 if spinning else 0.02)
        if ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)

    def recv_data(self, peer: int, nbytes: int) -> memoryview | None:
        """Return the oldest unread slot from ``peer``, if any."""
        r = self._in[peer]
        tail = int(r.counters[8])
        if int(r.counters[0]) <= tail:
            return None
        slot = tail % r.slots
        got = int(r.sizes[slot])
        if got != nbytes:
            raise hal.CommError(
                f"shm: rank {peer} sent a piece of {got} bytes where {nbytes} were expected "
                "(the ranks disagree on the message sizes)",
                ranks=(peer,),
            )
        return r.data[slot]

    def recv_release(self, peer: int) -> None:
        """Free the slot returned by :meth:`recv_data`."""
        r = self._in[peer]
        r.counters[8] = int(r.counters[8]) + 1
        self._poke(peer)

    def check_peers(self, peers: Sequence[int], ctx: CallContext) -> None:
        """Raise CommError naming any of ``peers`` whose process has exited."""
        dead = tuple(sorted({p for p in peers if not _pid_alive(self._pids[p])}))
        if dead:
            raise hal.CommError(
                f"{ctx.collective} (seq {ctx.seq}): rank(s) {', '.join(map(str, dead))} died "
                f"(process {', '.join(str(self._pids[p]) for p in dead)} exited)",
                op=ctx.collective,
                ranks=dead,
            )

    def close(self) -> None:
        """Unmap the segments. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._native is not None:
            self._native.close()
        self._out.clear()
        self._in.clear()
        for v in self._views:
            try:
                v.release()
            except BufferError:  # pragma: no cover - a slice is still exported
                pass
        self._views.clear()
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # a view is still alive somewhere: the GC unmaps it later
                pass
        self._maps.clear()
        for fd in (self._wake_r, self._wake_self, *self._wake_w.values()):
            os.close(fd)
        self._wake_w.clear()


class _NativeShm:
    """The native engine's view of one rank's rings: addresses, doorbells and the C calls."""

    #: the sender of a shared message that its receiver copies writes its cells straight into
    #: the receiver's destination (where messages go by reference at all), not through the slots
    write_cells = True

    def __init__(
        self, tr: ShmTransport, lib: _native.NativeLib, segs: dict[int, memoryview], ring_bytes: int
    ) -> None:
        self.ffi, self.lib = lib.ffi, lib.lib
        ffi = self.ffi
        self._held = {r: ffi.from_buffer(v) for r, v in segs.items()}  # released by close()
        addr = {r: int(ffi.cast("uint64_t", cd)) for r, cd in self._held.items()}
        self.bells = addr  # each segment starts with its rank's doorbell
        me = tr.rank

        def ring(owner: int, to: int) -> int:
            return addr[owner] + _HEADER + (to if to < owner else to - 1) * ring_bytes

        self.out = {p: ring(me, p) for p in range(tr.size) if p != me}
        self.inn = {p: ring(p, me) for p in range(tr.size) if p != me}
        self.me = addr[me]
        self.slot_bytes = tr._slot_bytes
        ctx = self.ctx = ffi.new("hal_xctx *")
        ctx.bell = self.me
        ctx.slots = tr._slots
        ctx.data_off = 2 * _LINE + _align(tr._slots * 8)
        ctx.pid = os.getpid()
        # the ring's count of by-reference pieces read: the last line before the slots, when free
        self.ack_off = (
            ctx.data_off - _LINE if 2 * _LINE + tr._slots * 8 <= ctx.data_off - _LINE else 0
        )
        #: why messages are not sent by reference (cross-memory attach), "" when they are
        self.cma_off = "not agreed yet"
        #: the peers' regions this transport mapped (_map_peer), dropped at close
        self._peer_maps: list[tuple[int, int]] = []
        self.reduce_refmin = 0
        ctx.slot_bytes = tr._slot_bytes
        # poll before sleeping on the futex: HAL_COMM_SPIN_US when set, else 20 us (measured here
        # on a loaded 2-core machine: longer busy polls only delay the peer), then keep polling
        # with sched_yield while a peer is awake, up to HAL_COMM_YIELD_US (200 us: no futex
        # wake-up to pay, the core given to whoever needs it), and neither when the ranks
        # outnumber the cores they may run on (a polling rank takes the core the rank it waits
        # for needs: 4 ranks on 2 cores, 16 MiB all_reduce, 1.5-2x faster without); the ranks'
        # cores together are agreed in agree_cma (until then, this process's)
        spin = setting("HAL_COMM_SPIN_US", default=None)
        self._spin_ns = None if spin is None else int(tr._spin_s * 1e9)
        self._spin(tr.size, _cores())
        ctx.check_ns = 50_000_000  # back to Python every 50 ms without progress (liveness, timeout)
        self.seen = int(self.lib.hal_shm_bell(self.me))
        self._sends = ffi.new("hal_xop[]", 4)
        self.outs = ffi.new("uint64_t[]", [self.out.get(q, 0) for q in range(tr.size)])
        self.ins = ffi.new("uint64_t[]", [self.inn.get(q, 0) for q in range(tr.size)])
        self.bell_arr = ffi.new("uint64_t[]", [addr[q] for q in range(tr.size)])
        self.stash = ffi.new("char[]", 4096)
        self.pos = ffi.new("int64_t *")
        self.sig = np.zeros(128, dtype=np.uint8)  # this rank's call signature (run_whole)
        self.sig_key: tuple[Any, ...] | None = None  # what the rest of ``sig`` holds now
        #: the engine stream's enqueue count after run_whole last synchronized it (-1: never)
        self.synced = -1
        #: compiled whole calls: key -> (action records, their tuples, their hal_again record)
        self.whole: dict[tuple[Any, ...], tuple[Any, list[Any], Any]] = {}
        #: compiled programs (NativeShmTransport._run_program): key -> (actions, their tuples,
        #: op records, their tuples, avg's target, their hal_again record, scratch buffers)
        self.progs: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        #: how many times ``progs`` changed (kept, dropped, cleared): a prepared call checked
        #: live at this count is still live (NativeShmTransport.prepared_live)
        self.progs_changed = 0
        #: calls run whole as one-piece actions ("small") or programs ("program"), and the plan
        #: steps run as their own C call ("step"): NativeShmTransport.native_counts()
        self.counts = {"small": 0, "program": 0, "step": 0, "either_ref": 0}
        self._recvs = ffi.new("hal_xop[]", 4)
        #: base address of each hal.Buffer the host can reach (-1: it cannot), dropped with the buffer
        self.bases: weakref.WeakKeyDictionary[hal.Buffer, int] = weakref.WeakKeyDictionary()

    def ops(self, nsend: int, nrecv: int) -> tuple[Any, Any]:
        """Return op records for ``nsend`` sends and ``nrecv`` receives (reused: one exchange at a time)."""
        if nsend > len(self._sends):
            self._sends = self.ffi.new("hal_xop[]", nsend)
        if nrecv > len(self._recvs):
            self._recvs = self.ffi.new("hal_xop[]", nrecv)
        return self._sends, self._recvs

    def again(self, acts: Any, nact: int, xops: Any = None, nx: int = 0, chunk: int = 0,
              check: bool = False) -> Any:  # fmt: skip
        """Return the record ``hal_shm_again`` starts a prepared call from (one C call per
        repeated call): its actions (and a program's op records and piece size), this context's
        rings and, with ``check``, the signature whose sequence number it writes. It points at
        ``acts`` and ``xops`` without keeping them: the caller keeps them with it."""
        ffi = self.ffi
        g = ffi.new("hal_again *")
        g.c, g.acts, g.pos, g.stash = self.ctx, acts, self.pos, self.stash
        g.outs, g.ins, g.bells = self.outs, self.ins, self.bell_arr
        g.xops = ffi.NULL if xops is None else xops
        g.seq = ffi.cast("int64_t *", self.sig.ctypes.data) if check else ffi.NULL
        g.nact, g.nx, g.chunk = nact, nx, chunk
        return g

    def keep(self, key: tuple[Any, ...], prog: tuple[Any, ...]) -> None:
        """Keep a compiled program; drop the oldest past 32 programs or 256 MiB of their scratch."""
        self.progs_changed += 1
        self.progs[key] = prog
        while len(self.progs) > 1 and (
            len(self.progs) > 32
            or sum(b.nbytes for v in self.progs.values() for b in v[-1]) > 256 << 20
        ):
            for b in self.progs.pop(next(iter(self.progs)))[-1]:
                b.close()

    def _spin(self, ranks: int, cores: int) -> None:
        """Set the poll before a futex sleep for ``ranks`` ranks on ``cores`` cores (see __init__)."""
        self.oversubscribed = ranks > cores
        if self._spin_ns is not None:
            self.ctx.spin_ns = self._spin_ns
        else:
            self.ctx.spin_ns = 0 if self.oversubscribed else 20_000
        # then poll with sched_yield while a peer is awake (HAL_COMM_YIELD_US), not at all when
        # oversubscribed (as the poll above)
        self.ctx.yield_ns = 0 if self.oversubscribed else int(setting("HAL_COMM_YIELD_US")) * 1000

    def agree_cma(self, world: World) -> None:
        """Send large messages by reference when every rank can read every other's memory.

        Each rank reads a word of every peer's segment through ``process_vm_readv`` (Linux
        cross-memory attach: ptrace rights over the peer, as the same user under a permissive
        Yama scope, or as root); the ranks agree on the outcome, so all or none send by reference.
        ``HAL_COMM_CMA_BYTES`` is the smallest message sent so (0: never; default 1 MiB), and
        ``HAL_COMM_CMA_REDUCE_BYTES`` the smallest one a receiver reduces (default 16 MiB, or
        ``HAL_COMM_CMA_BYTES`` where that is set; 0: never).
        """
        want = int(setting("HAL_COMM_CMA_BYTES"))
        regions = [[r.base, r.size, r.fd, r.inode] for r in HostRegion.shared()]
        table = world.bootstrap.allgather([os.getpid(), self.me, sorted(_affinity()), regions])
        # the ranks oversubscribe the cores they may run on together, not each its own: ranks
        # bound one per core (Open MPI's mpirun binds each rank to a core) poll as unbound ones
        self._spin(world.size, len(set().union(*(t[2] for t in table))))
        why = "HAL_COMM_CMA_BYTES=0" if not want else ""
        if not why and not self.ack_off:
            why = "no room for the ring's read count (HAL_COMM_SHM_SLOTS)"
        if not why:
            for q, (pid, addr, *_) in enumerate(table):
                if q != world.rank:
                    err = int(self.lib.hal_shm_cma_probe(int(pid), int(addr)))
                    if err:
                        why = (
                            f"rank {world.rank} cannot read rank {q}'s memory ({os.strerror(err)})"
                        )
                        break
        whys = [str(w) for w in world.bootstrap.allgather(why) if w]
        self.cma_off = whys[0] if whys else ""
        self.ctx.ack_off = self.ack_off
        self.ctx.cma_bytes = 0 if self.cma_off else want
        # one descriptor per message (the receiver reads it whole, or reduces it piece by piece,
        # with no round trip per piece), or one per piece (HAL_COMM_CMA_WHOLE=0)
        self.ctx.ref_whole = 1 if setting("HAL_COMM_CMA_WHOLE") else 0
        # a message the receiver reduces goes through the slots up to a larger size: there the
        # sender's copy in and the receiver's reduction straight out of the slot run in parallel,
        # where by reference the receiver reads (slowly) into a bounce buffer and reduces from it
        red = setting("HAL_COMM_CMA_REDUCE_BYTES")
        if red is None:
            red = want if setting("HAL_COMM_CMA_BYTES", default=None) is not None else 16 << 20
        #: the op records' refmin of a send whose receiver reduces (-1: never by reference)
        self.reduce_refmin = int(red) if red else -1
        # a message sent by reference in one descriptor is shared: while the receiver reads it from
        # the back, its sender, when it has nothing else to do, copies cells of it from the front
        # through the slots (the receiver copies those out of the cache; HAL_COMM_CELL_BYTES, 0:
        # never). The claim word sits on the line before the read count, when free.
        claim = self.ctx.data_off - 2 * _LINE
        room = self.ack_off and 2 * _LINE + int(self.ctx.slots) * 8 <= claim
        self.ctx.claim_off = claim if room else 0
        self.ctx.cell_bytes = int(setting("HAL_COMM_CELL_BYTES"))
        self.ctx.ref_piece = min(_REF_PIECE, 4 * int(self.ctx.cell_bytes))
        # the sender of a shared message whose receiver copies it (no reduction) writes its cells
        # straight into the receiver's destination (process_vm_writev: the same rights as the
        # reads agreed above), not through the slots: see _native_shm.c (DEST_PID)
        self.ctx.write_ok = 1 if self.write_cells and not self.cma_off else 0
        # the peers' shared host regions (their device memory: the CPU emulator's arena), mapped
        # here: a move by reference within one is a memcpy (same rights as the reads above)
        if not self.cma_off and setting("HAL_COMM_MAP_PEERS"):
            for q, (pid, _addr, _cores_q, peer_regions) in enumerate(table):
                if q != world.rank:
                    for base, size, fd, inode in peer_regions:
                        key = (int(pid), int(base))
                        if _map_peer(self, key, int(size), int(fd), int(inode)):
                            self._peer_maps.append(key)

    def ring(self, rank: int) -> None:
        """Ring ``rank``'s doorbell (wakes it if it sleeps)."""
        self.lib.hal_shm_ring(self.bells[rank])

    def idle(self, spin_s: float) -> None:
        """Wait until this rank's doorbell rang since the last wait (at most 20 ms)."""
        self.seen = int(self.lib.hal_shm_wait(self.me, self.seen, int(spin_s * 1e9), 20_000_000))

    def close(self) -> None:
        for prog in self.progs.values():
            for b in prog[-1]:
                b.close()
        self.progs.clear()
        self.progs_changed += 1
        for key in self._peer_maps:
            _unmap_peer(self, key)
        self._peer_maps.clear()
        for cd in self._held.values():
            self.ffi.release(cd)
        self._held.clear()


#: bytes the receiver of a shared message reads by reference at a time, at most 4 cells (between
#: them it takes the cells its sender copied). Measured (2 ranks, alternated inside one run, two runs at load average
#: 4.6-5.0): 1 MiB against 256 KiB, all_gather and broadcast of 4 and 16 MiB faster in 14 of 16
#: comparisons (16 MiB all_gather in place 3,340 -> 3,188 and 3,794 -> 3,352 us): fewer,
#: larger process_vm_readv calls, while the sender still fills its slots in between
_REF_PIECE = 1 << 20


class _PeerMap:
    """A peer's region mapped here: the mapping, a view that holds its address (and keeps it
    mapped), and how many transports use it (one mapping per region for every communicator)."""

    __slots__ = ("anchor", "area", "uses")

    def __init__(self, area: mmap.mmap, anchor: np.ndarray[Any, Any]) -> None:
        self.area, self.anchor, self.uses = area, anchor, 1


#: the peers' shared host regions mapped in this process, by (pid, base)
_PEER_MAPS: dict[tuple[int, int], _PeerMap] = {}
_PEER_MAPS_LOCK = threading.Lock()


def _map_peer(nat: _NativeShm, key: tuple[int, int], size: int, fd: int, inode: int) -> bool:
    """Map process ``key[0]``'s region at ``key[1]`` (its file open there as ``fd``, checked by
    ``inode``) and enter it in the native engine's table; False (nothing done) when it cannot be."""
    with _PEER_MAPS_LOCK:
        held = _PEER_MAPS.get(key)
        if held is not None:
            held.uses += 1
            return True
        writable = 1
        try:
            try:
                own = os.open(f"/proc/{key[0]}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
            except PermissionError:
                own, writable = os.open(f"/proc/{key[0]}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC), 0
        except OSError as exc:
            _log.debug("shm: cannot open process %d's region: %s", key[0], exc)
            return False
        try:
            st = os.fstat(own)
            if st.st_ino != inode or st.st_size < size:
                _log.debug("shm: process %d's fd %d is not its region", key[0], fd)
                return False
            area = mmap.mmap(own, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        except (OSError, ValueError) as exc:
            _log.debug("shm: cannot map process %d's region: %s", key[0], exc)
            return False
        finally:
            os.close(own)
        anchor = np.frombuffer(area, dtype=np.uint8, count=1)  # its address; keeps it mapped
        lbase = nat.ffi.cast("char *", anchor.ctypes.data)
        if nat.lib.hal_shm_map_peer(key[0], key[1], size, lbase, writable):
            del anchor
            area.close()
            return False
        _PEER_MAPS[key] = _PeerMap(area, anchor)
        return True


def _unmap_peer(nat: _NativeShm, key: tuple[int, int]) -> None:
    """Drop one use of the mapping of ``key`` (:func:`_map_peer`); unmapped with the last."""
    with _PEER_MAPS_LOCK:
        held = _PEER_MAPS[key]
        held.uses -= 1
        if held.uses:
            return
        del _PEER_MAPS[key]
        nat.lib.hal_shm_map_peer(key[0], key[1], 0, nat.ffi.NULL, 0)
        del held.anchor  # its export first: then the mapping can close
        held.area.close()


def _affinity() -> set[int]:
    """Return the cores this process may run on."""
    try:
        return set(os.sched_getaffinity(0)) or {0}
    except (AttributeError, OSError):  # pragma: no cover - no affinity (not Linux)
        return set(range(os.cpu_count() or 1))


def _cores() -> int:
    """Return how many cores this process may run on."""
    return len(_affinity())


def _address(data: Any, cache: Any, bases: Any) -> int | None:
    """Return the host address of ``data``'s bytes, or None when the host cannot reach them.

    ``bases`` caches each buffer's base address (a weak dictionary: dropped with the buffer).
    The caller keeps ``data`` alive for the call (it is in the Send or Recv).
    """
    if isinstance(data, hal.Array):
        buf = data.buffer
        base = bases.get(buf)
        if base is None or buf.closed:
            hv = _host_view(buf.view(np.uint8), cache)
            base = -1 if hv is None else int(hv.ctypes.data)
            if not buf.closed:
                bases[buf] = base
        return None if base < 0 else base + data.offset
    arr = np.asarray(data)
    if not arr.flags.c_contiguous:
        return None
    return int(arr.ctypes.data)


def _elide_last_copy(steps: list[Any], cache: Any, bases: Any) -> tuple[list[Any], tuple[Any, Any]]:
    """Let the last receive of a call write where the call's last local copy would copy it.

    An out-of-place ``reduce_scatter`` reduces its segment into scratch space, then copies it to
    the output (hal.comm._engine: the algorithm is written once, for both forms). When the last
    step is that copy, its source is exactly what one receive of the step before writes, as
    ``data = base op received`` (or a plain copy), and nothing else that step reads or writes
    touches the output, the receive writes the output directly: the same bytes, one copy less.
    Returns the steps without that copy and ``(the receive, the output)``, else the steps as
    they are and ``(None, None)``.
    """
    none: tuple[Any, Any] = (None, None)
    if len(steps) < 2 or steps[-1][0] != "copy" or steps[-2][0] != "step":
        return steps, none
    _k, dst, src = steps[-1]
    _k, sends, recvs = steps[-2]
    n = int(dst.nbytes)
    d, s = _address(dst, cache, bases), _address(src, cache, bases)
    if d is None or s is None or n != int(src.nbytes):
        return steps, none
    hit = [y for y in recvs if int(y.data.nbytes) == n and _address(y.data, cache, bases) == s]
    if len(hit) != 1 or (hit[0].op is not None and hit[0].base is None):
        return steps, none  # a reduction into its own data reads what the scratch space held
    reads = [x.data for x in sends] + [y.data for y in recvs if y is not hit[0]]
    reads += [y.base for y in recvs if y.base is not None]
    for arr in reads:
        a = _address(arr, cache, bases)
        if a is None or (a < d + n and d < a + int(arr.nbytes)):
            return steps, none
    return steps[:-1], (hit[0], dst)


def _overlaps(at: int, n: int, arrs: list[Any], cache: Any, bases: Any) -> bool:
    """True if bytes ``[at, at + n)`` may overlap one of ``arrs`` (or one's address is unknown)."""
    for arr in arrs:
        a = _address(arr, cache, bases)
        if a is None or (a < at + n and at < a + int(arr.nbytes)):
            return True
    return False


def _plain_copy(step: Any, cache: Any, bases: Any) -> tuple[int, int, int] | None:
    """Return ``(destination address, bytes, source address)`` of a ``("copy", dst, src)`` step
    between two distinct places of one size, or None (an address unknown, a copy onto itself)."""
    _k, dst, src = step
    n = int(dst.nbytes)
    d, s = _address(dst, cache, bases), _address(src, cache, bases)
    if d is None or s is None or d == s or n != int(src.nbytes):
        return None
    return d, n, s


def _sends_within(sends: Sequence[Any], d: int, n: int, cache: Any, bases: Any) -> bool:
    """Whether each of ``sends`` that reads any of ``[d, d + n)`` lies wholly within it (such a
    send can read the same bytes at their source instead)."""
    for x in sends:
        a, m = _address(x.data, cache, bases), int(x.data.nbytes)
        if m and (a is None or (a < d + n and d < a + m and not d <= a <= d + n - m)):
            return False
    return True


def _send_sources(
    steps: list[Any], scratch: Sequence[Any], cache: Any, bases: Any
) -> tuple[list[Any], list[tuple[int, int, int]]]:
    """Let the sends of a copy into scratch space that is only ever sent read its source instead.

    A non-root rank of a tree ``reduce`` snapshots its input into scratch space (where it has
    children it reduces into that buffer; the input must stay unchanged), and a leaf then only
    sends the snapshot. When nothing after such a copy writes either side of it, and every later
    read of the copy is a send that lies within it, the sends read the source and the copy goes:
    the same bytes, one copy less. Returns the steps without those copies and, for each,
    ``(copy's address, bytes, source's address)``.
    """
    ids = {id(b) for b in scratch}
    out: list[Any] = []
    moved: list[tuple[int, int, int]] = []
    for i, step in enumerate(steps):
        scratch_copy = step[0] == "copy" and id(getattr(step[1], "buffer", None)) in ids
        plain = _plain_copy(step, cache, bases) if scratch_copy else None
        if plain is None:
            out.append(step)
            continue
        d, n, s = plain
        ok = True
        for later in steps[i + 1 :]:
            if later[0] == "copy":
                writes, reads = [later[1]], [later[2]]
            else:
                writes = [y.data for y in later[2]]
                reads = [y.base for y in later[2] if y.base is not None]
                if not _sends_within(later[1], d, n, cache, bases):  # they read the source instead
                    ok = False
            if (
                not ok
                or _overlaps(d, n, writes + reads, cache, bases)
                or _overlaps(s, n, writes, cache, bases)
            ):
                ok = False
                break
        if ok:
            moved.append((d, n, s))
        else:
            out.append(step)
    return out, moved


def _copies_beside(steps: list[Any], cache: Any, bases: Any) -> list[Any]:
    """Let a local copy run beside the step before it where neither depends on the other.

    The root of an out-of-place tree ``broadcast`` sends its input, then copies it to its output
    (hal.comm._engine): when a copy reads nothing the step before it receives and writes nothing
    that step sends, receives or reads, it becomes part of that step,
    ``("step", sends, receives, ((dst, src, nbytes), ...))``, and the native engine copies it a
    piece per pass while the peers move the step's messages (out of place: the copy and the
    transfer at once instead of one after the other). Other steps are returned as they are.
    """
    out: list[Any] = []
    for step in steps:
        prev = out[-1] if out else None
        after_step = step[0] == "copy" and prev is not None and prev[0] == "step"
        plain = _plain_copy(step, cache, bases) if after_step else None
        if plain is None or prev is None:
            out.append(step)
            continue
        d, n, s = plain
        _k, sends, recvs = prev[:3]
        written = [y.data for y in recvs]
        touched = [x.data for x in sends] + written + [y.base for y in recvs if y.base is not None]

        if _overlaps(s, n, written, cache, bases) or _overlaps(d, n, touched, cache, bases):
            out.append(step)
            continue
        out[-1] = ("step", sends, recvs, (*(prev[3] if len(prev) > 3 else ()), (d, s, n)))
    return out


def _copy_into_step(steps: list[Any], cache: Any, bases: Any, into: tuple[Any, Any]) -> list[Any]:
    """Let a local copy run beside the step after it, whose sends of the copy read its source.

    An out-of-place ``all_gather`` copies the rank's input into its part of the output, then
    sends that part (hal.comm._algorithms): its peers waited for the copy before they could read
    the part. When the step after a copy writes neither side of it, reads nothing of its
    destination but sends lying within it, and has no copies beside it yet, the copy becomes
    part of that step (``("step", sends, receives, ((dst, src, nbytes),), ((dst, nbytes,
    src),))``: the last element says where those sends read instead) and the native engine
    copies it a piece per pass while the peers read the source: the same bytes, at once instead
    of one after the other. Other steps are returned as they are. ``into``: the receive that
    writes elsewhere than its data, and where (:func:`_elide_last_copy`).
    """
    out: list[Any] = []
    i = 0
    while i < len(steps):
        step = steps[i]
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        i += 1
        before_step = step[0] == "copy" and nxt is not None and nxt[0] == "step" and len(nxt) == 3
        plain = _plain_copy(step, cache, bases) if before_step else None
        if plain is None or nxt is None:
            out.append(step)
            continue
        d, n, s = plain
        _k, sends, recvs = nxt
        ok = _sends_within(sends, d, n, cache, bases)  # they read the source instead
        written = [into[1] if y is into[0] else y.data for y in recvs]
        read = [y.base for y in recvs if y.base is not None]
        if (
            not ok
            or _overlaps(d, n, written + read, cache, bases)
            or _overlaps(s, n, written, cache, bases)
        ):
            out.append(step)
            continue
        out.append(("step", sends, recvs, ((d, s, n),), ((d, n, s),)))
        i += 1
    return out


_DTYPE_CODES = {np.dtype(k): v for k, v in _native.DTYPE_CODES.items()}
#: The collectives whose plans run whole in the native engine at any size (run_whole)
_PROGRAM_CALLS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"})


class _Prepared:
    """A compiled program prepared to run again (:meth:`NativeShmTransport.prepare_call`).

    It holds the program kept under ``key`` (actions, op records, scratch buffers), what the
    call's signature holds besides its sequence number (``skey``, ``packed``; None without
    agreement checks) and the plan's piece size. The transport keeps at most 32 programs and
    closes the scratch buffers of those it drops (``_NativeShm.keep``): the prepared call is
    live only while its program is still the one kept under its key
    (:meth:`NativeShmTransport.prepared_live`).
    """

    __slots__ = ("checked", "key", "packed", "prog", "skey")

    def __init__(self, key: tuple[Any, ...], prog: tuple[Any, ...], skey: Any, packed: Any) -> None:
        self.key = key
        self.prog = prog
        self.skey = skey
        self.packed = packed
        #: ``_NativeShm.progs_changed`` when it was last found live (-1: not yet)
        self.checked = -1


class _Either:
    """A 2-rank call prepared both ways: ``slots`` and ``ref``. An all_gather (in place or out
    of place, ``inplace_ref_bytes``): one-piece actions through the slots
    (:meth:`NativeShmTransport.prepare_small`) and its program sending the message by reference.
    A reduce_scatter (``either_reduce_bytes``): its program through the slots and its program
    sending by reference (the receiver reduces from a small buffer). A broadcast of one piece
    (``either_bcast_bytes``), on its root only: one-piece actions through the slots and its
    program sending by reference (shared: the root writes its part into the receiver's
    destination); the receiver always runs that program, which takes a piece either way, so
    the root leads alone. Each call runs the way that was faster here lately.

    Which is faster depends on the host, and changes as it runs: where the two cores share a
    cache, the slots' two copies (in, from the sender's cache, and out) beat one
    ``process_vm_readv``; where a core reads lines the other just wrote slowly (on this 2-core VM,
    for minutes at a time), reading the peer's untouched segment by reference is twice as fast.
    Measured inside one run (1 MiB in place, median us of blocks of 20-call batches, this /
    slots only / by reference only): 75 / 74 / 106 and 85 / 84 / 129 in one state, 101 / 247 /
    102 and 128 / 228 / 128 in the other.

    The ranks run the same way: a call whose ranks differ (one by reference, one through the
    slots) is as slow as the slower way. Rank 0 leads: it looks at the first call, then at most
    every ``period`` calls and ``gap`` seconds (and at once when the way it runs has become
    ``slower``), running ``warm + look`` calls through the slots and then as many by reference,
    and times the last ``look`` of each (the follower's first is still the other way); then the
    way with the smaller middle time runs until the next look. Rank 1 follows: it runs each call the way rank 0 ran
    its last, which it reads off the count of pieces it read by reference from rank 0 (the
    ring's ack word). A receiver takes a piece either way, so a call where they differ still
    delivers the same bytes.
    """

    __slots__ = (
        "ack", "acked", "best", "calls", "checked", "current", "lead", "look_n", "looked", "pace",
        "ref", "seen", "slots", "slow", "t0", "t_look",
    )  # fmt: skip

    #: timed calls of each way per look
    look = 4
    #: untimed calls of each way before them: the follower's first is still the other way, and
    #: after a long run one way the other's first calls are slow (its slots cold). With 1, the
    #: adaptive way stayed by reference in 2 of 6 runs where the slots were faster (92-106 us
    #: against 65-82, 1 MiB in place, blocks of 20-call batches); with 3 it followed the faster
    #: way in 8 of 8 (59-65 us against slots 64-65; 97-122 against by reference 106-119)
    warm = 3
    #: a look comes at least ``period`` calls and ``gap`` seconds after the last. Each look runs
    #: the slower way 7 times (and a call or two with the ranks apart): where the slots took 230
    #: us and a read by reference 100 (1 MiB in place, a slow phase), a look every 256 calls
    #: cost ~4 us per call (25 ms apart); 50 ms apart, half that
    period = 256
    gap = 0.05
    #: ... or at once after ``slow_calls`` calls in a row took ``slower`` times what the way
    #: took in the last look: the phase changed under it (the slots' calls, 2-4x slower then)
    slower = 1.5
    slow_calls = 4
    #: run every call this way (0: the slots, 1: by reference; None: as above), without looks
    way: int | None = None

    def __init__(self, slots: tuple[Any, ...] | _Prepared, ref: _Prepared, ack: Any) -> None:
        self.slots = slots
        self.ref = ref
        #: rank 1: its count of pieces read by reference from rank 0 (None on rank 0, the leader)
        self.ack = ack
        self.lead = ack is None
        self.acked = int(ack[0]) if ack is not None else 0
        self.best = 0  # the leader's way between looks; the follower's next way
        self.calls = -1
        self.look_n = 0  # the leader's call that started the running look (-1: none runs)
        self.looked = 0  # ... and the one that started the last finished look
        self.t_look = 0.0  # when the last look finished
        self.pace = 0.0  # the time of a call of the way the last look chose (seconds)
        self.slow = 0  # calls in a row since slower than ``slower * pace``
        self.current: Any = slots
        self.seen: tuple[list[float], list[float]] = ([], [])
        self.t0 = 0.0
        #: ``_NativeShm.progs_changed`` when both ways were last found live (-1: not yet)
        self.checked = -1

    def start(self) -> Any:
        """Return the way the next call runs (and start its clock, on the leader)."""
        if self.way is not None:  # forced: no looks meanwhile
            self.current = self.ref if self.way else self.slots
            return self.current
        way = self.best
        if not self.lead:  # counted from here: other calls between may read by reference too
            self.acked = int(self.ack[0])
        else:
            self.calls = n = self.calls + 1
            self.t0 = t = time.perf_counter()
            k = self.warm + self.look
            if self.look_n < 0 and (
                self.slow >= self.slow_calls
                or (n - self.looked >= self.period and t - self.t_look >= self.gap)
            ):
                self.look_n, self.slow, self.seen = n, 0, ([], [])
            if self.look_n >= 0:
                at = n - self.look_n
                if at >= 2 * k:  # a look that a failed call left undecided: again from here
                    self.look_n, at, self.seen = n, 0, ([], [])
                way = at // k
        self.current = self.ref if way else self.slots
        return self.current

    def done(self) -> None:
        """Count the call :meth:`start` started as complete now."""
        if self.way is not None:
            return
        if not self.lead:  # the leader's way in this call: ours in the next
            self.best = 1 if int(self.ack[0]) != self.acked else 0
            return
        t = time.perf_counter()
        took = t - self.t0
        if self.look_n < 0:  # between looks: is the way still as fast as the look found it?
            self.slow = self.slow + 1 if took > self.slower * self.pace else 0
            return
        at = self.calls - self.look_n
        k = self.warm + self.look
        if at % k < self.warm:
            return
        self.seen[at // k].append(took)
        if at == 2 * k - 1:
            if not all(self.seen):  # a way's timed calls all failed: look again
                self.look_n, self.seen = self.calls + 1, ([], [])
                return
            a, b = (sorted(x)[len(x) // 2 - 1 : len(x) // 2 + 1] for x in self.seen)
            self.best = 1 if sum(b) < sum(a) else 0
            self.pace = min(sum(a) / len(a), sum(b) / len(b))
            self.looked, self.look_n, self.t_look, self.seen = self.look_n, -1, t, ([], [])


class _Recording(Run):
    """A :class:`Run` that records the steps of a call's algorithm instead of making them.

    ``steps`` holds ``("copy", dst, src)`` and ``("step", sends, receives)`` in order;
    :meth:`NativeShmTransport._run_program` compiles them into one native program.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.steps: list[tuple[Any, ...]] = []

    def exchange(self, sends: Sequence[Send] = (), recvs: Sequence[Recv] = ()) -> None:
        """Record one step (its signatures are placed at compile time, as the Python path checks them)."""
        self.steps.append(("step", list(sends), list(recvs)))

    def copy(self, dst: hal.Array, src: hal.Array) -> None:
        """Record a local copy ``dst <- src``."""
        if dst.nbytes:
            self.steps.append(("copy", dst, src))


class NativeShmTransport(ShmTransport):
    """The shared-memory transport whose exchanges run in the native engine (``_native_shm.c``).

    A whole collective (:meth:`run_whole`), or else every exchange (one step of a plan), is one
    C call that releases the GIL: it copies pieces into the peers' rings and copies out or
    reduces what they publish, waking peers through futex doorbells; Python only checks
    liveness and the timeout every 50 ms without progress.
    Memory the host cannot reach (OpenCL), element types the C reducers lack, and pieces read
    ahead by the point-to-point port take :class:`StagedTransport`'s Python path instead.
    """

    alpha_s = 8e-6  # per message, as measured here (one C call, a doorbell)
    beta_s_per_byte = 1 / 6e9
    #: seconds per byte reduced in C (from the ring, in cache) and per pipelined piece
    gamma_s_per_byte = 1 / 8e9
    piece_s = 2e-6
    #: the pipelining piece the planner gives a large message (at most a slot): measured here
    #: (2 ranks, 16 MiB), pieces of 256 KiB-1 MiB take 1.3-2.4x less time than 4 MiB pieces (the
    #: receiver copies a piece out of the shared cache while the sender copies the next one in)
    piece_bytes = 1 << 20
    #: on 2 ranks, a call from this size up to two pieces goes in two halves (0: never). Measured
    #: (2 ranks, alternated runs at load average 1.2-1.7, best batch): broadcast 1 MiB 197 -> 120
    #: us out of place, 155 -> 115 in place, 512 KiB in place 83 -> 71, 2-4 MiB, all_gather,
    #: reduce_scatter and all_reduce of 256 KiB-4 MiB unchanged; 4 ranks on 2 cores, broadcast
    #: 1 MiB 589 -> 665 us: so 2 ranks only
    split_bytes = 512 << 10
    #: on 2 ranks, an in-place all_gather sends its message by reference from this size (where
    #: messages go by reference at all, and at most ``HAL_COMM_CMA_BYTES``), as a program, not
    #: copied through a slot: there is no local copy, and the receiver reads the peer's segment
    #: straight into its own output, one copy where the slot took two. Out of place the same was
    #: slower where the cores share a cache (1 MiB, 2 ranks, load 1.0-1.3, best batch: in place
    #: 117-121 -> 72-76 us, out of place 131-146 -> 169-179 us), so out of place only a message
    #: of one piece, which is prepared both ways, as the in-place one: repeated calls run the way
    #: that is faster on the host at the time (_Either); 0: never by this rule
    inplace_ref_bytes = 256 << 10
    #: on 2 ranks, a reduce_scatter whose messages go through the slots (below
    #: ``HAL_COMM_CMA_REDUCE_BYTES``) is prepared by reference too from this size (its receiver
    #: reads into a small buffer and reduces from there), and repeated calls run the way that is
    #: faster at the time (_Either). 1 MiB, median us inside one run, slots / by reference /
    #: MPICH: 256 / 165 / 249 and 260 / 162 / 227 where a core reads the other's fresh lines
    #: slowly, 117 / 178 / 266 where the cores share a cache; 4 MiB 868 / 711 / 1,120 and 820 /
    #: 641 / 1,033 (0: never)
    either_reduce_bytes = 256 << 10
    #: on 2 ranks, a broadcast of one piece through the slots (``bcast_slot_bytes``) is prepared
    #: by reference too from this size (the receiver reads from the back while the root writes
    #: cells into its destination from the front), and its root runs repeated calls the way that
    #: is faster at the time (_Either; the receiver runs the program by reference, which takes a
    #: piece either way). 1 MiB in place, where the cores share a cache: slots 46-55 us, by
    #: reference 113-150, MPICH 106-149; where a core reads the other's fresh lines slowly the
    #: slots took 180-227 us against MPICH's 149-160 (0: never)
    either_bcast_bytes = 512 << 10

    def inplace_ref(self, coll: str, nbytes: int, in_place: bool, one_piece: bool = False) -> int:
        """Return the smallest message of a call that goes by reference by the in-place rule
        (``inplace_ref_bytes``), or 0 when the rule does not apply to it (``nbytes``: the
        message of one rank). It applies to a 2-rank all_gather in place, and out of place where
        the message is ``one_piece`` (prepared both ways then: _Either)."""
        nat = self._native
        want = self.inplace_ref_bytes
        if not (
            (in_place or one_piece)
            and self.size == 2
            and coll == "all_gather"
            and want
            and nat is not None
        ):
            return 0
        cma = int(nat.ctx.cma_bytes)
        refmin = min(cma, want)
        return refmin if cma and nbytes >= refmin else 0

    def _reduce_either(self, call: Any, engine: Any) -> bool:
        """Whether ``call`` is a 2-rank reduce_scatter whose messages go through the slots
        (below ``HAL_COMM_CMA_REDUCE_BYTES``) from ``either_reduce_bytes``: prepared both ways."""
        nat = self._native
        want = self.either_reduce_bytes
        if call.collective != "reduce_scatter" or engine.size != 2 or not want or nat is None:
            return False
        buf = call.send if call.send is not None else call.recv
        n = 0 if buf is None else int(buf.nbytes) // 2
        return bool(nat.ctx.cma_bytes) and want <= n < nat.reduce_refmin

    def _bcast_ref(self, call: Any, chunk_bytes: int, engine: Any) -> _Prepared | None:
        """Return a 2-rank broadcast of one piece from ``either_bcast_bytes`` prepared as a
        program that sends its message by reference (and so shared: the root writes its part
        into the receiver's destination), where messages go by reference at all; else None."""
        nat = self._native
        want = self.either_bcast_bytes
        if call.collective != "broadcast" or engine.size != 2 or not want or nat is None:
            return None
        buf = call.recv if call.recv is not None else call.send
        if buf is None or int(buf.nbytes) < want or not nat.ctx.cma_bytes:
            return None
        return self._prepare_program(call, chunk_bytes, engine, copy_refmin=want)

    def _call_refmin(self, call: Any, engine: Any) -> int:
        """Return :meth:`inplace_ref` of ``call`` (0: it does not send by that rule)."""
        nat = self._native
        if call.collective != "all_gather" or call.recv is None or nat is None:
            return 0
        n = int(call.recv.nbytes) // engine.size
        dst = _address(call.recv, self._view_cache, nat.bases)
        src = dst if call.send is None else _address(call.send, self._view_cache, nat.bases)
        if dst is None:
            return 0
        one = 0 < n <= min(call.plan.chunk_bytes, nat.slot_bytes)
        return self.inplace_ref(call.collective, n, src in (dst, dst + engine.rank * n), one)

    def piece_for(self, nbytes: int, collective: str = "") -> int:
        """Return the pipelining piece of a ``collective`` of ``nbytes``: ``piece_bytes``, or on 2
        ranks half the message from ``split_bytes`` up to two pieces (the receiver copies the first
        half out while the sender copies the second in, where one piece waited until the whole was
        in), except for a ``broadcast`` (see ``bcast_slot_bytes``)."""
        if (
            self.size == 2
            and self.split_bytes
            and self.split_bytes <= nbytes <= 2 * self.piece_bytes
            and collective != "broadcast"
        ):
            return max(64, nbytes // 2)
        return self.piece_bytes

    #: on 2 ranks a broadcast up to this size goes through the slots, never by reference: up to a
    #: piece (1 MiB) as one piece (the whole call one C call of one-piece actions), above in pieces.
    #: The root copies its pieces in and returns (its ring holds them, and it may copy the next
    #: call's in while the receiver copies this one's out of the cache), where a message sent by
    #: reference (and shared, from ``HAL_COMM_CMA_BYTES``) keeps the root until the receiver has
    #: read it with ``process_vm_readv`` (a whole 1 MiB read at 4-9 GB/s here), and halves kept it
    #: until the receiver had freed a slot for the next call's. Alternated inside one run (2 ranks,
    #: 30-40 batches of 16 calls, load average 4-7, best batch us, by reference -> halves through
    #: the slots): 1 MiB in place 230 -> 194, 276 -> 216, 224 -> 190, out of place 267 -> 230, 340
    #: -> 260, 283 -> 235, then halves -> one piece: median per-batch ratio 0.95 / 0.89 out of
    #: place, 0.95 / 0.88 in place; 512 KiB one piece against halves 102 / 94 against 118 / 109 in
    #: place; 2 MiB (two pieces) in place 396 -> 368, 490 -> 424; 4 MiB was faster by reference
    #: (0: by reference from ``HAL_COMM_CMA_BYTES``)
    bcast_slot_bytes = 2 << 20
    #: a program step's sends through the slots are copied in (the pieces that fit) before the step
    #: checks its peers' signatures, beside its sends by reference (the C engine's POST): the peer
    #: finds them there when it comes (False: only those by reference, as before). Alternated
    #: inside one run (2 ranks, 40 batches, load average 6.3), reduce_scatter 1 MiB median
    #: per-batch ratio 0.90-0.95 out of place, 0.81-0.97 in place, 16 MiB 0.91 / 0.99
    post_slots = True

    #: calls up to this size run on the caller's thread when nothing is queued, unless
    #: ``HAL_COMM_INLINE_BYTES`` says otherwise: a whole call is one C call without the GIL, and
    #: the two thread hand-offs of the engine thread cost more than the call itself up to about
    #: here (measured: 1 MiB all_gather/broadcast 2.5x faster inline, all_reduce 2.3x; 4 MiB,
    #: alternated inside one run at load average 5.7-5.9: all four collectives 25-50% faster
    #: inline, both forms, in 16 of 16 comparisons). 16 MiB too: traced inside the calls (2 ranks,
    #: all_gather in place), the hand-off to the engine thread and back took 250-350 us where the
    #: call's Python took 110-170 us inline, beside a 1-2 ms call, and each hand-off waits for the
    #: scheduler on a loaded machine; alternated at load average 3.3-4.6, all_gather and broadcast
    #: 16 MiB medians faster inline in 9 of 12 comparisons. Larger calls stay async (the caller's
    #: thread is free while they run)
    inline_bytes = 16 << 20

    @classmethod
    def predict_cost(
        cls, collective: str, algorithm: str, nbytes: int, p: int, chunk: int, t: float
    ) -> float:
        """Return the native engine's predicted seconds of ``all_reduce`` (others: ``t``, the planner's).

        The α-β-γ formulas of hal.comm._plan with the C reduction's γ and piece cost. Every
        plan runs whole in one C call (:meth:`run_whole`), so no step pays Python; a recursive
        doubling of several pieces sends a snapshot of its buffer per step (one more copy).
        """
        if collective != "all_reduce" or p < 2 or math.isinf(t):
            return t
        a, b, g, n = cls.alpha_s, cls.beta_s_per_byte, cls.gamma_s_per_byte, float(nbytes)
        p2 = 1 << (p.bit_length() - 1)
        core = p2.bit_length() - 1
        fold = 0.0 if p == p2 else 2 * (a + n * b) + n * g
        pieces = max(1, math.ceil(n / chunk)) if chunk else 1
        if algorithm == "ring":
            frac = (p - 1) / p
            return 2 * (p - 1) * a + 2 * frac * n * b + frac * n * g + 2 * pieces * cls.piece_s
        if algorithm == "recursive_doubling":
            snapshot = 0.0 if pieces == 1 else core * n * b
            return core * (a + n * (b + g)) + fold + core * pieces * cls.piece_s + snapshot
        if algorithm == "rabenseifner":
            frac2 = (p2 - 1) / p2
            return (
                2 * core * a + 2 * frac2 * n * b + frac2 * n * g + fold + 2 * pieces * cls.piece_s
            )
        return t
        a, b, g, n = cls.alpha_s, cls.beta_s_per_byte, cls.gamma_s_per_byte, float(nbytes)
        p2 = 1 << (p.bit_length() - 1)
        core = p2.bit_length() - 1
        fold = 0.0 if p == p2 else 2 * (a + n * b) + n * g
        fold_steps = 0 if p == p2 else 2
        pieces = max(1, math.ceil(n / chunk)) if chunk else 1
        if algorithm == "ring":
            frac = (p - 1) / p
            return (
                2 * (p - 1) * (a + cls.step_s)
                + 2 * frac * n * b
                + frac * n * g
                + 2 * pieces * cls.piece_s
            )
        if algorithm == "recursive_doubling":
            steps = 0 if pieces == 1 else core + fold_steps
            return (
                core * (a + n * (b + g)) + fold + core * pieces * cls.piece_s + steps * cls.step_s
            )
        if algorithm == "rabenseifner":
            frac2 = (p2 - 1) / p2
            t2 = 2 * core * a + 2 * frac2 * n * b + frac2 * n * g + fold + 2 * pieces * cls.piece_s
            return t2 + (2 * core + fold_steps) * cls.step_s
        return t

    #: who moves the bytes (``work.plan.engine``)
    engine = "native"

    def native_counts(self) -> dict[str, int]:
        """Return how this rank's native engine ran its calls so far (a copy).

        ``small``: collectives run whole as one-piece actions; ``program``: collectives run whole
        as a compiled program of pipelined steps; ``step``: plan steps run as one C call each
        (from Python: what a call that runs whole never needs); ``either_ref``: repeated calls
        prepared both ways (through the slots and by reference) that ran by reference;
        ``written``: bytes of shared messages this rank wrote straight into a receiver's
        destination (``process_vm_writev``, or a memcpy into a mapped peer), not through the
        slots; ``mapped``: bytes this process moved by reference through a peer's shared device
        memory mapped here (a memcpy, not cross-memory attach; every communicator of the
        process together); ``peer_maps``: the peers' regions this transport mapped.
        """
        nat = self._native
        assert nat is not None
        return {
            **nat.counts,
            "written": int(nat.ctx.wrote),
            "mapped": int(nat.lib.hal_shm_mapped_bytes()),
            "peer_maps": len(nat._peer_maps),
        }

    def exchange(self, sends: Sequence[Send], recvs: Sequence[Recv], ctx: CallContext) -> None:
        """Run the exchange in the native engine, or on the Python path when it cannot."""
        nat = self._native
        assert nat is not None
        if ctx.chunk_bytes > nat.slot_bytes:
            return super().exchange(sends, recvs, ctx)
        pushback = self.__dict__.get("_hal_pushback")
        cache, bases = self._view_cache, nat.bases
        sl: list[tuple[int, int, int]] = []
        for x in sends:
            n = int(x.data.nbytes)
            if not n:
                continue
            a = _address(x.data, cache, bases)
            if a is None:
                return super().exchange(sends, recvs, ctx)
            sl.append((x.peer, a, n))
        rl: list[tuple[int, int, int, int, int, int, bool]] = []
        for y in recvs:
            n = int(y.data.nbytes)
            if not n:
                continue
            if pushback and y.peer in pushback:
                return super().exchange(sends, recvs, ctx)
            a = _address(y.data, cache, bases)
            if a is None:
                return super().exchange(sends, recvs, ctx)
            op, dt, base = -1, 0, 0
            if y.op is not None:
                op = _native.OP_CODES[y.op]
                code = _DTYPE_CODES.get(y.data.dtype)
                if code is None:
                    return super().exchange(sends, recvs, ctx)
                dt = code
                if y.base is not None:
                    b = _address(y.base, cache, bases)
                    if b is None:
                        return super().exchange(sends, recvs, ctx)
                    base = b
            rl.append((y.peer, a, n, op, dt, base, y.after_sends))
        if not sl and not rl:
            return None
        lib = nat.lib
        sarr, rarr = nat.ops(len(sl), len(rl))
        for i, (peer, ptr, n) in enumerate(sl):
            o = sarr[i]
            o.ring, o.data, o.bell, o.nbytes, o.peer = nat.out[peer], ptr, nat.bells[peer], n, peer
            o.done = o.posted = 0
        for i, (peer, ptr, n, op, dt, base, after) in enumerate(rl):
            o = rarr[i]
            o.ring, o.data, o.bell, o.nbytes, o.peer = nat.inn[peer], ptr, nat.bells[peer], n, peer
            o.op, o.dtype, o.base, o.after, o.done, o.posted = op, dt, base, after, 0, 0
            o.shared = o.cells = 0
        c = nat.ctx
        c.chunk = ctx.chunk_bytes
        nat.counts["step"] += 1
        ctx.stream.synchronize()  # earlier steps' device work is done: the host reads and writes now
        while True:
            rc = lib.hal_shm_exchange(c, sarr, len(sl), rarr, len(rl))
            if c.moved:
                ctx.progressed()
            if rc == 0:
                return None
            if rc == -3:
                self._ref_failed(int(c.bad_peer), ctx)
            if rc < 0:
                peer = rl[c.bad_op][0]
                raise hal.CommError(
                    f"shm: rank {peer} sent a piece of {c.bad_got} bytes where "
                    f"{min(ctx.chunk_bytes, rl[c.bad_op][2] - rarr[c.bad_op].done)} were expected "
                    "(the ranks disagree on the message sizes)",
                    ranks=(peer,),
                )
            pending = [p for i, (p, *_r) in enumerate(sl) if sarr[i].done < sarr[i].nbytes]
            pending += [p for i, (p, *_r) in enumerate(rl) if rarr[i].done < rarr[i].nbytes]
            self.check_peers(pending, ctx)
            if ctx.stalled():
                raise ctx.timeout_error(pending)

    def run_whole(self, call: Any, ctx: CallContext, engine: Any) -> bool:
        """Run a whole collective in one C call; False (nothing done) when it does not qualify.

        A one-piece call takes :meth:`_run_small`; any other ``all_reduce``, ``all_gather``,
        ``reduce_scatter``, ``broadcast`` or ``reduce`` whose memory the host reaches takes
        :meth:`_run_program` (its plan's steps recorded and run pipelined in one C call).
        """
        return self._run_small(call, ctx, engine) or self._run_program(call, ctx, engine)

    def _run_small(self, call: Any, ctx: CallContext, engine: Any) -> bool:
        """Run a whole small collective in one C call; False (nothing done) when it does not qualify.

        Qualify: ``barrier`` with agreement checks (its signatures alone), ``all_reduce``
        planned as recursive doubling (any number of ranks), and, on 2
        ranks, ``all_gather`` and ``broadcast`` (tree), when every message is one piece, the
        element type has a C reducer (``all_reduce``) and the host reaches the memory. The plan
        is compiled into a list of one-piece actions in the order the Python path moves the same
        bytes (signatures to every peer; per step: send, the partner's signature, receive and
        reduce; the peers never received from are checked at the end), so ranks on either path
        interoperate. A peer's signature already read by the point-to-point port sends the call
        to the Python path, which uses it.
        """
        prep = self.prepare_small(call, ctx.chunk_bytes, engine, keep=False)
        if prep is None:
            return False
        rc = self.run_prepared(prep, call.plan.seq, engine)
        if rc:
            self.finish_prepared(prep, rc, call, ctx, engine)
        if prep[5]:  # avg: the only device work of the call
            engine._avg(call.recv if call.recv is not None else call.send, call)
            stream = ctx.stream
            stream.synchronize()
            nat = self._native
            assert nat is not None
            nat.synced = stream.enqueue_count
        return True

    def prepare_small(
        self, call: Any, chunk_bytes: int, engine: Any, *, keep: bool = True, by_ref: bool = True
    ) -> tuple[Any, ...] | None:
        """Return what runs ``call`` whole as one-piece actions (see :meth:`_run_small`), or None.

        The result holds nothing of a particular call but the addresses of its arrays, so calls
        with the same facts (collective, algorithm, sizes, op, root, addresses) run it again:
        ``hal.comm.Communicator`` keeps it for repeated calls on the same arrays, valid while
        their buffers are open (:meth:`run_prepared`). A tuple: the action records and their
        tuples, the message size, the signature's key and packed bytes (None without agreement
        checks), whether the op is ``avg`` and the record ``hal_shm_again`` starts it from
        (:meth:`_NativeShm.again`); no reference to the arrays. ``keep=False``: for
        this call only (the signature packed only when the last one written differs).
        ``by_ref=False``: through the slots even where ``inplace_ref_bytes`` sends the call's
        message by reference (as a program: None).
        """
        nat = self._native
        assert nat is not None
        p, r = engine.size, engine.rank
        coll, algo = call.collective, call.plan.algorithm
        if p < 2 or not (
            (coll == "all_reduce" and algo == "recursive_doubling")
            or (p == 2 and coll == "all_gather")
            or (p == 2 and coll == "broadcast" and algo == "tree")
            or (coll == "barrier" and engine.check_agreement)
        ):
            return None
        if self.__dict__.get("_hal_pushback"):
            return None
        if coll == "barrier":  # the signatures alone: to every peer, then every peer's, compared
            return self._whole_of(
                call, engine, (coll, algo, p, r, 0, 0, 0, call.root, call.op, 0, True), keep
            )
        dst_arr = call.recv if call.recv is not None else call.send
        src_arr = call.send
        if dst_arr is None:
            return None
        nbytes = int(dst_arr.nbytes) // (p if coll == "all_gather" else 1)
        if not 0 < nbytes <= min(chunk_bytes, nat.slot_bytes):
            return None
        code = _DTYPE_CODES.get(dst_arr.dtype)
        if code is None:
            if coll == "all_reduce":
                return None
            code = 0
        cache, bases = self._view_cache, nat.bases
        dst = _address(dst_arr, cache, bases)
        src = dst if src_arr is None or src_arr is dst_arr else _address(src_arr, cache, bases)
        if dst is None or src is None:
            return None
        if by_ref and self.inplace_ref(coll, nbytes, src in (dst, dst + r * nbytes), True):
            return None  # by reference, as a program (inplace_ref_bytes)
        check = bool(engine.check_agreement)
        key = (coll, algo, p, r, nbytes, dst, src, call.root, call.op, code, check)
        return self._whole_of(call, engine, key, keep)

    def _whole_of(
        self, call: Any, engine: Any, key: tuple[Any, ...], keep: bool
    ) -> tuple[Any, ...]:
        """Return :meth:`prepare_small`'s tuple of ``call``, whose facts are ``key`` (compiled once)."""
        nat = self._native
        assert nat is not None
        coll, algo, nbytes, check = key[0], key[1], key[4], key[10]
        skey: tuple[Any, ...] | None = None
        packed: Any = None
        if check:  # our signature goes to a buffer of fixed address, so the actions can be reused
            skey = (coll, call.op, call.dtype, call.count, call.root, call.plan.chunk_bytes, algo)
            if keep or skey != nat.sig_key:
                packed = np.frombuffer(engine._signature(call).pack(), dtype=np.uint8)
        hit = nat.whole.get(key)
        if hit is None:
            arr, acts = self._compile_whole(key, nat)
            hit = nat.whole[key] = (arr, acts, nat.again(arr, len(acts), check=check))
            if len(nat.whole) > 64:
                nat.whole.pop(next(iter(nat.whole)))
        avg = coll == "all_reduce" and call.op == "avg"
        return (hit[0], hit[1], nbytes, skey, packed, avg, hit[2])

    def prepare_call(self, call: Any, chunk_bytes: int, engine: Any) -> Any:
        """Return ``call`` prepared to run again (:meth:`run_prepared`), or None.

        A call that runs whole as one-piece actions is prepared as such (:meth:`prepare_small`),
        any other that runs as a compiled program (:meth:`_run_program`: ``reduce_scatter``,
        ``reduce``, the collectives of several pieces or of more than 2 ranks) as its program
        (:class:`_Prepared`). Nothing is run.
        """
        prep = self.prepare_small(call, chunk_bytes, engine)
        if prep is not None:
            bcast = self._bcast_ref(call, chunk_bytes, engine)
            if bcast is None:
                return prep
            # a broadcast's receiver takes its piece either way: its root chooses (and leads)
            return _Either(prep, bcast, None) if engine.rank == call.root else bcast
        prog = self._prepare_program(call, chunk_bytes, engine)
        if prog is None:
            return None
        # the call prepared the other way too (_Either): (through the slots, by reference)
        slots: Any = None
        ref: _Prepared | None = None
        if self._call_refmin(call, engine):  # the program sends by reference
            slots, ref = self.prepare_small(call, chunk_bytes, engine, by_ref=False), prog
        elif self._reduce_either(call, engine):  # the program goes through the slots
            slots, ref = (
                prog,
                self._prepare_program(call, chunk_bytes, engine, self.either_reduce_bytes),
            )
        if slots is None or ref is None:
            return prog
        nat = self._native
        assert nat is not None
        ack = None  # rank 0 leads; rank 1 reads its count of rank 0's pieces by reference
        if engine.rank:
            ack = nat.ffi.cast("int64_t *", nat.inn[0] + nat.ack_off)
        return _Either(slots, ref, ack)

    def prepared_live(self, prep: Any) -> bool:
        """True while ``prep`` may run again: a program dropped since (to keep at most 32, and
        their scratch space bounded) has had its scratch buffers closed."""
        if type(prep) is tuple:
            return True
        nat = self._native
        assert nat is not None
        changed = nat.progs_changed
        if prep.checked == changed:  # no program kept or dropped since it was found live
            return True
        if type(prep) is _Either:
            live = self.prepared_live(prep.slots) and self.prepared_live(prep.ref)
        else:
            live = nat.progs.get(prep.key) is prep.prog
        if live:
            prep.checked = changed
        return live

    def run_prepared(self, prep: Any, seq: int, engine: Any) -> int:
        """Start the call ``prep`` (:meth:`prepare_call`) as call number ``seq``: one C call.

        Returns its status: 0 when the call is complete, else what :meth:`finish_prepared`
        takes over (a peer not there yet after 50 ms, a mismatch, a bad size).
        """
        nat = self._native
        assert nat is not None
        if type(prep) is _Either:
            either = prep
            way = either.start()
            if way is either.ref:
                nat.counts["either_ref"] += 1
            rc = self.run_prepared(way, seq, engine)
            if not rc:
                either.done()
            return rc
        # the signature written once per kind of call (hal_shm_again writes the seq), the
        # earlier steps done: the host reads and writes now (the engine's own stream: only the
        # engine enqueues on it, so an unchanged count needs no synchronize)
        stream = engine.stream
        if stream.enqueue_count != nat.synced:
            stream.synchronize()
            nat.synced = stream.enqueue_count
        if type(prep) is _Prepared:
            skey = prep.skey
            if skey is not None and skey is not nat.sig_key and skey != nat.sig_key:
                nat.sig[: len(prep.packed)] = prep.packed
                nat.sig_key = skey
            rc = nat.lib.hal_shm_again(prep.prog[5], seq)
            if not rc:
                nat.counts["program"] += 1
            return rc
        skey = prep[3]
        if skey is not None and skey is not nat.sig_key and skey != nat.sig_key:
            packed = prep[4]
            nat.sig[: len(packed)] = packed
            nat.sig_key = skey
        rc = nat.lib.hal_shm_again(prep[6], seq)
        if not rc:
            nat.counts["small"] += 1
        return rc

    def finish_prepared(self, prep: Any, rc: int, call: Any, ctx: CallContext, engine: Any) -> None:
        """Finish the call :meth:`run_prepared` left with status ``rc``: wait, or raise its error."""
        if type(prep) is _Either:
            self.finish_prepared(prep.current, rc, call, ctx, engine)
            prep.done()
            return
        if type(prep) is _Prepared:
            self._finish_program(prep.prog, rc, call, ctx, engine)
            return
        nat = self._native
        assert nat is not None
        c, pos, lib = nat.ctx, nat.pos, nat.lib
        arr, acts, nbytes = prep[0], prep[1], prep[2]
        while True:
            if c.moved:
                ctx.progressed()
            if rc == 0:
                break
            peer = acts[c.bad_op if rc < 0 else pos[0]][1]
            if rc == -3:  # a piece sent by reference that could not be read
                self._ref_failed(peer, ctx)
            if rc == -2:
                raw = bytes(nat.ffi.buffer(nat.stash, 4096))
                self._mismatch(call, engine, engine._signature(call), peer, raw)
            if rc == -1:
                raise hal.CommError(
                    f"shm: rank {peer} sent a piece of {c.bad_got} bytes where {nbytes} were expected "
                    "(the ranks disagree on the message sizes)",
                    ranks=(peer,),
                )
            self.check_peers([peer], ctx)
            if ctx.stalled():
                raise ctx.timeout_error([peer])
            rc = lib.hal_shm_run(c, arr, len(acts), pos, nat.outs, nat.ins, nat.bell_arr, nat.stash)
        nat.counts["small"] += 1

    def _run_program(self, call: Any, ctx: CallContext, engine: Any) -> bool:
        """Run a whole pipelined collective in one C call; False (nothing done) when it does not qualify.

        The call's algorithm (hal.comm._algorithms, the code the Python path runs) is run once
        on a :class:`_Recording`, which keeps its steps instead of moving bytes; the steps are
        compiled into one program of actions (the signatures where the Python path sends and
        checks them, local copies, and each step's sends and receives, pipelined in pieces of
        the plan's ``chunk_bytes``) and ``hal_shm_prog`` runs it. Ranks move the same bytes in
        the same order as on the Python path. Programs are kept per kind of call and addresses
        (with their own scratch buffers); an ``avg`` call is recorded each time.
        """
        nat = self._native
        assert nat is not None
        found = self._program_key(call, ctx.chunk_bytes, engine)
        if found is None:
            return False
        key, code, check = found
        prog = nat.progs.get(key) if call.op != "avg" else None
        if prog is None:
            prog = self._compile_program(call, ctx, engine, code, check)
            if prog is None:
                return False
            if call.op != "avg":
                nat.keep(key, prog)
        target = prog[4]
        if check:
            skey = self._sig_key(call)
            if skey != nat.sig_key:
                packed = engine._signature(call).pack()
                nat.sig[: len(packed)] = np.frombuffer(packed, dtype=np.uint8)
                nat.sig_key = skey
        rc = self._start_program(prog, call.plan.seq, ctx.stream)
        self._finish_program(prog, rc, call, ctx, engine)
        if target is not None and call.op == "avg":  # the only device work of the call
            stream = ctx.stream
            engine._avg(target, call)
            stream.synchronize()
            nat.synced = stream.enqueue_count
        return True

    def _program_key(
        self, call: Any, chunk_bytes: int, engine: Any
    ) -> tuple[tuple[Any, ...], int, bool] | None:
        """Return the key of ``call``'s program, its element type's code and whether ranks check
        signatures; None when the call does not run as a program (:meth:`_run_program`)."""
        nat = self._native
        assert nat is not None
        p, coll, algo = engine.size, call.collective, call.plan.algorithm
        if (
            p < 2
            or coll not in _PROGRAM_CALLS
            or algo in ("ipc", "hierarchical")
            or not 0 < chunk_bytes <= nat.slot_bytes
            or self.__dict__.get("_hal_pushback")
        ):
            return None
        code = _native.DTYPE_CODES.get(call.dtype)
        if code is None:
            if coll not in ("all_gather", "broadcast"):
                return None  # float16/bfloat16 reduce in float32 (widen) on the Python path
            code = 0
        check = bool(engine.check_agreement)
        send, recv = call.send, call.recv
        cache, bases = self._view_cache, nat.bases
        addr = tuple(
            None if a is None else (_address(a, cache, bases), int(a.nbytes)) for a in (send, recv)
        )
        if any(a is not None and a[0] is None for a in addr):
            return None
        key = (coll, algo, p, engine.rank, call.count, code, call.op, call.root, chunk_bytes,
               addr, send is recv, check)  # fmt: skip
        return key, code, check

    @staticmethod
    def _sig_key(call: Any) -> tuple[Any, ...]:
        """What a call's signature holds besides its sequence number."""
        p = call.plan
        return (
            call.collective,
            call.op,
            call.dtype,
            call.count,
            call.root,
            p.chunk_bytes,
            p.algorithm,
        )

    def _prepare_program(
        self,
        call: Any,
        chunk_bytes: int,
        engine: Any,
        reduce_refmin: int | None = None,
        copy_refmin: int | None = None,
    ) -> _Prepared | None:
        """Return ``call``'s program prepared to run again (:meth:`prepare_call`), or None.

        The program is the one :meth:`_run_program` keeps for the call (compiled now if it was
        not kept); ``avg`` calls are never kept, so never prepared.
        """
        nat = self._native
        assert nat is not None
        if call.op == "avg":
            return None
        found = self._program_key(call, chunk_bytes, engine)
        if found is None:
            return None
        key, code, check = found
        if reduce_refmin is not None:  # a variant: its own program
            key = (*key, "reduce_refmin", reduce_refmin)
        if copy_refmin is not None:
            key = (*key, "copy_refmin", copy_refmin)
        prog = nat.progs.get(key)
        if prog is None:
            ctx = engine._context(call)
            prog = self._compile_program(call, ctx, engine, code, check, reduce_refmin, copy_refmin)
            if prog is None:
                return None
            nat.keep(key, prog)
        skey = packed = None
        if check:
            skey = self._sig_key(call)
            packed = np.frombuffer(engine._signature(call).pack(), dtype=np.uint8)
        return _Prepared(key, prog, skey, packed)

    def _start_program(self, prog: tuple[Any, ...], seq: int, stream: hal.Stream) -> int:
        """Start the compiled program ``prog`` as call ``seq`` (the rest of its signature already
        written): one C call, ``hal_shm_again`` with the program's record.

        Returns ``hal_shm_prog``'s status: 0 when the call is complete, else what
        :meth:`_finish_program` takes over.
        """
        nat = self._native
        assert nat is not None
        # the earlier steps are done: the host reads and writes now (the engine's own stream:
        # only the engine enqueues on it, so an unchanged count needs no synchronize)
        if stream.enqueue_count != nat.synced:
            stream.synchronize()
            nat.synced = stream.enqueue_count
        return int(nat.lib.hal_shm_again(prog[5], seq))

    def _finish_program(
        self, prog: tuple[Any, ...], rc: int, call: Any, ctx: CallContext, engine: Any
    ) -> None:
        """Finish the program :meth:`_start_program` left with status ``rc``: wait, or raise its error."""
        nat = self._native
        assert nat is not None
        arr, acts, xarr, xops = prog[0], prog[1], prog[2], prog[3]
        c, pos, lib = nat.ctx, nat.pos, nat.lib
        while True:
            if c.moved:
                ctx.progressed()
            if rc == 0:
                break
            if rc == -3:
                self._ref_failed(int(c.bad_peer), ctx)
            if rc == -2:
                raw = bytes(nat.ffi.buffer(nat.stash, 4096))
                self._mismatch(call, engine, engine._signature(call), acts[c.bad_op][1], raw)
            if rc == -1:
                peer = int(c.bad_peer)
                want = next(
                    (min(ctx.chunk_bytes, x[4] - xarr[i].done) for i, x in enumerate(xops)
                     if x[5] == peer and x[9] and xarr[i].done < x[4]),
                    ctx.chunk_bytes,
                )  # fmt: skip
                raise hal.CommError(
                    f"shm: rank {peer} sent a piece of {c.bad_got} bytes where {want} were expected "
                    "(the ranks disagree on the message sizes)",
                    ranks=(peer,),
                )
            a = acts[pos[0]]
            if a[0] in (4, 5):  # a step (or its early post): its unfinished ops' peers
                first, last = a[3], a[3] + a[1] + a[5]
                pending = sorted(
                    {xops[i][5] for i in range(first, last)
                     if xarr[i].done < xops[i][4] and xops[i][5] >= 0}
                )  # fmt: skip
            else:
                pending = [a[1]]
            self.check_peers(pending, ctx)
            if ctx.stalled():
                raise ctx.timeout_error(pending)
            rc = lib.hal_shm_prog(
                c, arr, len(acts), pos, nat.outs, nat.ins, nat.bell_arr, nat.stash, xarr
            )
        nat.counts["program"] += 1

    def _compile_program(
        self,
        call: Any,
        ctx: CallContext,
        engine: Any,
        code: int,
        check: bool,
        reduce_refmin: int | None = None,
        copy_refmin: int | None = None,
    ) -> tuple[Any, ...] | None:
        """Record ``call``'s steps and compile them; None when a step's memory is out of the host's reach.

        ``reduce_refmin``: the smallest message a receiver reduces that goes by reference (None:
        ``HAL_COMM_CMA_REDUCE_BYTES``'s); ``copy_refmin``: the smallest one a receiver copies
        (None: by the rules of ``bcast_slot_bytes`` and ``inplace_ref_bytes``)."""
        from hal.comm._ops import SIGNATURE_BYTES

        nat = self._native
        assert nat is not None
        temps: list[hal.Buffer] = []

        def temp(dtype: Any, n: int) -> hal.Array:
            buf = engine.device.alloc(max(1, n * np.dtype(dtype).itemsize))
            temps.append(buf)
            return buf.view(dtype, n)

        run = _Recording(engine.rank, engine.size, self, ctx, temp)
        run.host_groups = engine.host_groups
        try:
            target = engine.move(run, call)
            # a 2-rank broadcast up to bcast_slot_bytes: its message through the slots (refmin -1);
            # a 2-rank all_gather by the rule of inplace_ref_bytes: by reference (inplace_ref)
            buf = call.recv if call.recv is not None else call.send
            slots = (
                call.collective == "broadcast"
                and engine.size == 2
                and buf is not None
                and int(buf.nbytes) <= self.bcast_slot_bytes
            )
            refmin = -1 if slots else self._call_refmin(call, engine)
            if copy_refmin is not None:
                refmin = copy_refmin
            prog = self._compile_steps(
                run.steps,
                engine,
                code,
                check,
                SIGNATURE_BYTES,
                temps,
                copy_refmin=refmin,
                reduce_refmin=reduce_refmin,
            )
        except BaseException:
            for b in temps:
                b.close()
            raise
        if prog is None:
            for b in temps:
                b.close()
            return None
        arr, acts, xarr, xops = prog
        again = nat.again(arr, len(acts), xarr, len(xops), ctx.chunk_bytes, check)
        return (arr, acts, xarr, xops, target, again, temps)

    def _compile_steps(
        self,
        steps: list[Any],
        engine: Any,
        code: int,
        check: bool,
        sig_bytes: int,
        scratch: Sequence[Any] = (),
        copy_refmin: int = 0,
        reduce_refmin: int | None = None,
    ) -> tuple[Any, list[Any], Any, list[Any]] | None:
        nat = self._native
        assert nat is not None
        if reduce_refmin is None:
            reduce_refmin = nat.reduce_refmin
        cache, bases = self._view_cache, nat.bases
        r, p = engine.rank, engine.size
        peers = [q for q in range(p) if q != r]
        sp = int(nat.sig.ctypes.data)
        # actions: (kind, peer or sends, ptr, src or first op record, nbytes, op or receives)
        acts: list[tuple[int, int, int, int, int, int]] = []
        # op records: (ring, data, base, bell, nbytes, peer, op, dtype, after, is_recv, refmin)
        xops: list[tuple[int, int, int, int, int, int, int, int, int, int, int]] = []
        pending: set[int] = set()
        if check:
            acts += [(0, q, sp, 0, sig_bytes, 0) for q in peers]
            pending = set(peers)
        steps, into = _elide_last_copy(steps, cache, bases)
        steps, sources = _send_sources(steps, scratch, cache, bases)
        steps = _copies_beside(steps, cache, bases)
        steps = _copy_into_step(steps, cache, bases, into)
        for step in steps:
            if step[0] == "copy":
                _k, dst, src = step
                d, s = _address(dst, cache, bases), _address(src, cache, bases)
                if d is None or s is None:
                    return None
                if d != s:
                    acts.append((3, r, d, s, int(dst.nbytes), 0))
                continue
            sends, recvs = step[1], step[2]
            # the peers of a step that reduces what it receives reduce what we send (the
            # algorithms are symmetric): such sends go by reference from a larger size; copies from
            # HAL_COMM_CMA_BYTES (0), never (-1: a 2-rank broadcast up to bcast_slot_bytes), or
            # those of a 2-rank all_gather from inplace_ref_bytes (inplace_ref)
            refmin = reduce_refmin if any(y.op is not None for y in recvs) else copy_refmin
            sl: list[tuple[int, int, int, int, int, int, int, int, int, int, int]] = []
            own = step[4] if len(step) > 4 else ()
            for x in sends:
                n = int(x.data.nbytes)
                if not n:
                    continue
                a = _address(x.data, cache, bases)
                if a is None:
                    return None
                # a copy beside this step (_copy_into_step), or into scratch space only sent: its source
                for d, m, s in (*own, *sources):
                    if d <= a <= d + m - n:
                        a += s - d
                        break
                sl.append(
                    (nat.out[x.peer], a, 0, nat.bells[x.peer], n, x.peer, -1, 0, 0, 0, refmin)
                )
            for d, s, n in step[3] if len(step) > 3 else ():  # local copies beside the step
                sl.append((0, s, d, 0, n, -1, -1, 0, 0, 0, -1))
            rl: list[tuple[int, int, int, int, int, int, int, int, int, int, int]] = []
            for y in recvs:
                n = int(y.data.nbytes)
                if not n:
                    continue
                a = _address(y.data if y is not into[0] else into[1], cache, bases)
                if a is None:
                    return None
                op, base = -1, 0
                if y.op is not None:
                    op = _native.OP_CODES[y.op]
                    if _DTYPE_CODES.get(y.data.dtype) != code:
                        return None
                    if y.base is not None:
                        b = _address(y.base, cache, bases)
                        if b is None:
                            return None
                        base = b
                rl.append(
                    (nat.inn[y.peer], a, base, nat.bells[y.peer], n, y.peer, op, code,
                     int(y.after_sends), 1, 0)
                )  # fmt: skip
            if recvs and pending:  # the Python path checks a peer's signature before its data
                if sl and {y.peer for y in recvs} & pending:
                    # ... having placed its sends first: post those going by reference now
                    acts.append((5, len(sl), 0, len(xops), int(self.post_slots), len(rl)))
                for q in sorted({y.peer for y in recvs} & pending):
                    acts.append((1, q, sp, 0, sig_bytes, 0))
                    pending.discard(q)
            if sl or rl:
                acts.append((4, len(sl), 0, len(xops), 0, len(rl)))
                xops += sl + rl
        acts += [(1, q, sp, 0, sig_bytes, 0) for q in sorted(pending)]
        ffi = nat.ffi
        arr = ffi.new("hal_act[]", max(1, len(acts)))
        for i, (kind, peer, ptr, s2, n, o) in enumerate(acts):
            a = arr[i]
            a.kind, a.peer, a.ptr, a.src, a.nbytes, a.op, a.dtype = kind, peer, ptr, s2, n, o, code
        xarr = ffi.new("hal_xop[]", max(1, len(xops)))
        for i, (ring, data, base, bell, n, peer, op, dt, after, _rv, refmin) in enumerate(xops):
            o = xarr[i]
            o.ring, o.data, o.base, o.bell, o.nbytes, o.done = ring, data, base, bell, n, 0
            o.peer, o.op, o.dtype, o.after, o.refmin = peer, op, dt, after, refmin
        return arr, acts, xarr, xops

    def _compile_whole(self, key: tuple[Any, ...], nat: _NativeShm) -> tuple[Any, list[Any]]:
        """Return the action records (and their tuples) of the whole call described by ``key``."""
        from hal.comm._ops import SIGNATURE_BYTES

        coll, _algo, p, r, nbytes, dst, src, root, redop, code, check = key
        acts: list[tuple[int, int, int, int, int, int]] = []  # kind, peer, ptr, src, nbytes, op
        peers = [q for q in range(p) if q != r]
        sp = int(nat.sig.ctypes.data)
        pending: set[int] = set()
        if check:
            acts += [(0, q, sp, 0, SIGNATURE_BYTES, 0) for q in peers]
            pending = set(peers)

        def take(q: int, ptr: int, op: int) -> None:
            if q in pending:
                acts.append((1, q, sp, 0, SIGNATURE_BYTES, 0))
                pending.discard(q)
            acts.append((2, q, ptr, 0, nbytes, op))

        if coll == "all_reduce":
            op = _native.OP_CODES[redop]
            if src != dst:
                acts.append((3, r, dst, src, nbytes, 0))
            p2 = 1 << (p.bit_length() - 1)
            if r >= p2:
                acts.append((0, r - p2, dst, 0, nbytes, 0))
                take(r - p2, dst, -1)
            else:
                if r + p2 < p:
                    take(r + p2, dst, op)
                mask = 1
                while mask < p2:
                    acts.append((0, r ^ mask, dst, 0, nbytes, 0))
                    take(r ^ mask, dst, op)
                    mask <<= 1
                if r + p2 < p:
                    acts.append((0, r + p2, dst, 0, nbytes, 0))
        elif coll == "all_gather":  # 2 ranks: send my segment, receive the other's
            # out of place, the segment goes out from the input, before this rank copies it into
            # its output: the peer's receive waits for the send alone (the same bytes either way)
            mine_at, theirs_at = dst + r * nbytes, dst + (1 - r) * nbytes
            acts.append((0, 1 - r, src if src != dst else mine_at, 0, nbytes, 0))
            if src != dst:
                acts.append((3, r, mine_at, src, nbytes, 0))
            take(1 - r, theirs_at, -1)
        elif coll == "broadcast":  # 2 ranks: the root sends (from its input), the other receives
            if r == root:
                acts.append((0, 1 - r, src, 0, nbytes, 0))
                if src != dst:
                    acts.append((3, r, dst, src, nbytes, 0))
            else:
                take(root, dst, -1)
        acts += [(1, q, sp, 0, SIGNATURE_BYTES, 0) for q in sorted(pending)]
        arr = nat.ffi.new("hal_act[]", len(acts))
        for i, (kind, peer, ptr, s2, n, o) in enumerate(acts):
            a = arr[i]
            a.kind, a.peer, a.ptr, a.src, a.nbytes, a.op, a.dtype = kind, peer, ptr, s2, n, o, code
        return arr, acts

    def _ref_failed(self, peer: int, ctx: CallContext) -> None:
        """Raise the CommError of a piece of ``peer`` sent by reference that could not be read."""
        self.check_peers([peer], ctx)  # a dead peer is named as such
        nat = self._native
        assert nat is not None
        err = int(nat.ctx.err)
        if err == errno.ESRCH:  # exiting (not reaped yet): it died
            raise hal.CommError(
                f"{ctx.collective} (seq {ctx.seq}): rank(s) {peer} died (process {self._pids[peer]} exited)",
                op=ctx.collective,
                ranks=(peer,),
            )
        raise hal.CommError(
            f"shm: cannot read rank {peer}'s memory (process_vm_readv: {os.strerror(err)})",
            ranks=(peer,),
        )

    def recv_data(self, peer: int, nbytes: int) -> memoryview | None:
        """Return the oldest unread piece from ``peer``, reading a piece sent by reference."""
        r = self._in[peer]
        tail = int(r.counters[8])
        if int(r.counters[0]) <= tail:
            return None
        slot = tail % r.slots
        # a descriptor holds one piece or the rest of a message (native senders with
        # HAL_COMM_CMA_WHOLE): read the next nbytes of it, ``off`` bytes of it read before
        refs: dict[int, int] = self.__dict__.setdefault("_ref_off", {})
        got, off = -int(r.sizes[slot]), refs.get(peer, 0)
        if not nbytes or got - off < nbytes:
            return super().recv_data(peer, nbytes)
        nat = self._native
        assert nat is not None
        pid, addr = (int(v) for v in np.frombuffer(r.data[slot], dtype="<i8", count=2))
        addr += off
        buf: np.ndarray[Any, Any] | None = self.__dict__.get("_ref_buf")
        if buf is None or len(buf) < nbytes:
            buf = self.__dict__["_ref_buf"] = np.empty(max(nbytes, 4096), np.uint8)
        ffi = nat.ffi
        ref = ffi.new("hal_xctx *")
        ref.err = 0
        if int(nat.lib.hal_shm_read_ref(ref, pid, addr, ffi.from_buffer(buf), nbytes)) < 0:
            if int(ref.err) == errno.ESRCH or not _pid_alive(pid):
                raise hal.CommError(f"shm: rank {peer} died (process {pid} exited)", ranks=(peer,))
            raise hal.CommError(
                f"shm: cannot read rank {peer}'s memory (process_vm_readv: {os.strerror(int(ref.err))})",
                ranks=(peer,),
            )
        self.__dict__.setdefault("_ref_pending", {})[peer] = nbytes
        return buf[:nbytes].data

    def recv_release(self, peer: int) -> None:
        """Free the piece returned by :meth:`recv_data` (and count a piece read by reference)."""
        nbytes = self.__dict__.setdefault("_ref_pending", {}).pop(peer, 0)
        if nbytes:
            refs: dict[int, int] = self.__dict__.setdefault("_ref_off", {})
            nat = self._native
            assert nat is not None
            r = self._in[peer]
            off = refs.pop(peer, 0) + nbytes
            if off < -int(r.sizes[int(r.counters[8]) % r.slots]):
                refs[peer] = off  # the descriptor has more: its slot stays
            else:
                r.counters[8] = int(r.counters[8]) + 1
            nat.lib.hal_shm_ack(nat.inn[peer] + nat.ack_off)
            self._poke(peer)
            return
        super().recv_release(peer)

    def _mismatch(self, call: Any, engine: Any, mine: Any, peer: int, raw: bytes) -> None:
        """Raise the CommError of a signature ``raw`` from ``peer`` that differs from ``mine``."""
        from hal.comm._engine import signature_mismatch
        from hal.comm._ops import Signature

        try:
            theirs = Signature.unpack(raw)
        except Exception:  # noqa: BLE001 - not a signature at all: say so below
            theirs = None
        if theirs is not None:
            signature_mismatch(engine.rank, call.collective, mine, {peer: theirs})
        raise hal.CommError(
            f"{call.collective} mismatch: rank {peer} sent something else than a call signature "
            "-- every rank must call the same collectives in the same order",
            op=call.collective,
            ranks=(engine.rank, peer),
        )
