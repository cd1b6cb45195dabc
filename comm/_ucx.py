"""UCX transport: pieces travel as UCX tagged messages (``HAL_COMM_TRANSPORT=ucx``, ``pip install 'hal-sdk[ucx]'``).

UCX (the layer under Open MPI, MPICH's ch4:ucx and Dask/RAPIDS) picks its own transports for
each pair of ranks: RDMA (``rc``/``dc``/``ud`` verbs), shared memory (``posix``/``sysv``/``cma``),
TCP, and CUDA memory (``cuda_copy``/``cuda_ipc``, GPUDirect RDMA), several rails at once where
the fabric offers them. Which ones is UCX's own business, governed by the usual ``UCX_TLS`` and
``UCX_NET_DEVICES`` (and every other ``UCX_*`` variable); hal maps ``HAL_COMM_IFNAME`` to
``UCX_NET_DEVICES`` when the latter is unset, and ``HAL_LOG_LEVEL`` to ``UCX_LOG_LEVEL``.

Set-up: each rank makes one UCP context and worker (the Python binding is ``ucxx``, from the
``ucxx-cu12`` wheel, which ships the UCX libraries), publishes the worker's address through the
communicator's authenticated rendezvous (hal.comm._bootstrap) and opens one endpoint per peer
from the others' addresses (with UCX's peer-failure handling on).

Wire format: a message is cut into pieces of ``HAL_COMM_CHUNK_BYTES`` (both sides agree on the
sizes before data moves, as with TCP); every piece is one UCX tagged message whose 64-bit tag
carries the sender's rank and the pair's piece number, so pieces of a pair match in order
whatever UCX's transports reorder, and a point-to-point message's header (which carries its
hal.comm tag) is a piece like any other (hal.comm._p2p).

Memory: an exchange without a reduction goes straight from and into the payloads, piece by
piece (zero copy on the host: UCX registers the memory), when UCX reaches them: host memory
(NumPy, the CPU emulator's memory through DLPack; ``plan.path == "host-ucx"``) and CUDA memory
when UCX was built with CUDA support (``UCXContext.cuda_support``; ``plan.path == "ucx-cuda"``).
Receives that reduce land in host pieces the transport keeps, then are reduced on the device.
Device memory of other backends (OpenCL ...) is staged through those host pieces with
``hal.copy`` and says so (``plan.path == "staged-ucx"`` and one log line). The CUDA path needs a
GPU and is not exercised by the test suite on machines without one. ``HAL_COMM_DLPACK=0`` sends
device memory through the pieces too.

Faults: a peer whose process dies is reported by UCX on its endpoint (connection reset); a
stopped peer or a cut link by the authenticated UDP heartbeats the TCP transport uses too
(hal.comm._tcp), which also carry whom a failed rank blames: each is a :class:`hal.CommError`
naming the rank, within ``HAL_COMM_TIMEOUT_MS``.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import hal
from hal.comm._auth import Keys, warn_unauthenticated
from hal.comm._config import job_secret
from hal.comm._ifaces import select_interface
from hal.comm._tcp import _family, _Heartbeat
from hal.comm._transport import CallContext, Recv, Send, StagedTransport, World, _host_view, _Rounds
from hal.spi import setting

__all__ = ["INSTALL", "UcxTransport", "ucx_missing", "ucx_version"]

_log = logging.getLogger("hal.comm")

#: What to install for the UCX transport.
INSTALL = "pip install 'hal-sdk[ucx]' (the ucxx-cu12 wheel, which ships the UCX libraries)"
_RANK_BITS = 24
_SEQ_BITS = 64 - _RANK_BITS
_SEQ_MASK = (1 << _SEQ_BITS) - 1
_DEPTH = 8  # pieces in flight per peer and direction
_UCX_LEVELS = {
    "debug": "info",
    "info": "warn",
    "warning": "warn",
    "error": "error",
    "critical": "fatal",
}


def _api() -> Any:
    had_cache = "UCX_MEMTYPE_CACHE" in os.environ
    import ucxx._lib.libucxx as ucx_api  # the binding's core (synchronous) API

    if not had_cache and tuple(ucx_api.get_ucx_version()) >= (1, 21, 0):
        # ucxx sets it for older UCX; UCX 1.21 dropped the option and would warn about it at every start
        os.environ.pop("UCX_MEMTYPE_CACHE", None)
    return ucx_api


def ucx_missing() -> str | None:
    """Return why UCX cannot be used from Python here (with the install command), or None.

    The probe leaves the environment as it found it (importing ucxx sets ``UCX_*`` defaults,
    which every process started afterwards would inherit).
    """
    before = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
    try:
        _api()
        from ucxx._lib.arr import Array  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken wheel (missing libucx symbol)
        return f"the UCX binding (ucxx) is not importable ({type(exc).__name__}: {exc}); {INSTALL}"
    finally:
        for k in [k for k in os.environ if k.startswith("UCX_") and k not in before]:
            del os.environ[k]
    return None


def ucx_version() -> str | None:
    """Return the version of the UCX library the binding loaded (``1.21.0``), or None without UCX."""
    if ucx_missing() is not None:
        return None
    return ".".join(map(str, _api().get_ucx_version()))


def _tag(src: int, seq: int) -> int:
    return (src << _SEQ_BITS) | (seq & _SEQ_MASK)


def _cuda_view(data: Any) -> Any:
    """Return a CuPy view of ``data``'s bytes if it is CUDA memory (DLPack ``kDLCUDA``), else None."""
    if not isinstance(data, hal.Array):
        return None
    try:
        whole = data.buffer.view(np.uint8)
        if whole.__dlpack_device__()[0] != 2:  # kDLCUDA
            return None
        import cupy

        return cupy.from_dlpack(whole).reshape(-1)[data.offset : data.offset + data.nbytes]
    except Exception:  # noqa: BLE001 - no CuPy, no DLPack: the staged path serves
        return None


class UcxTransport(StagedTransport):
    """UCX tagged messages between every pair of ranks (RDMA, shared memory or TCP, as UCX picks)."""

    name = "ucx"
    # Cost model: a UCX tag message on an RDMA fabric (~10 us with hal's per-call overhead,
    # ~10 GB/s per rank); over TCP UCX costs about what hal's own TCP transport does.
    alpha_s = 20e-6
    beta_s_per_byte = 1 / 10e9
    path = "host-ucx"

    @classmethod
    def unusable(cls, world: World) -> str | None:
        """Refuse when the UCX binding is not installed (the reason carries the install command)."""
        return ucx_missing() or super().unusable(world)

    @classmethod
    def missing(cls) -> str | None:
        """Return why this transport cannot run on this host at all (None: it can)."""
        return ucx_missing()

    def __init__(self, world: World) -> None:
        why = ucx_missing()
        if why is not None:
            raise hal.CommError(f"transport 'ucx' is unavailable: {why}", op="init")
        api = _api()
        from ucxx._lib.arr import Array

        self._api_mod = api
        self._Array = Array
        self.rank = world.rank
        self.size = world.size
        self._chunk = int(setting("HAL_COMM_CHUNK_BYTES", default=1 << 20)) // 64 * 64
        addr = getattr(world.bootstrap, "local_address", "127.0.0.1")
        self.interface: str | None = None
        spec = setting("HAL_COMM_IFNAME")
        if spec:
            self.interface, addr = select_interface(spec, family=_family(addr))
        config: dict[str, str] = {}
        if self.interface and not os.environ.get("UCX_NET_DEVICES"):
            config["NET_DEVICES"] = self.interface
        if "UCX_RNDV_THRESH" not in os.environ:  # ucxx's default: rendezvous (zero copy) from 8 KiB
            config["RNDV_THRESH"] = "8192"
        if not os.environ.get("UCX_LOG_LEVEL"):
            level = logging.getLevelName(logging.getLogger("hal").getEffectiveLevel()).lower()
            config["LOG_LEVEL"] = _UCX_LEVELS.get(level, "warn")
        secret = getattr(world.bootstrap, "secret", None)
        self._keys = Keys(secret if secret is not None else job_secret())
        if not self._keys.authenticated and len(world.hosts) > 1:
            warn_unauthenticated("the UCX transport's heartbeats between hosts")
        try:
            self._ctx = api.UCXContext(config_dict=config, feature_flags=(api.Feature.TAG,))
            self._worker = api.UCXWorker(self._ctx)
        except api.UCXError as exc:
            raise hal.CommError(
                f"ucx: rank {self.rank} could not open a UCX context and worker ({type(exc).__name__}: {exc}); "
                f"check UCX_TLS={os.environ.get('UCX_TLS', '<unset>')!r}, "
                f"UCX_NET_DEVICES={os.environ.get('UCX_NET_DEVICES', config.get('NET_DEVICES', '<unset>'))!r}",
                op="init",
            ) from exc
        self.cuda = bool(self._ctx.cuda_support)
        self._bytes = 0
        self._hb = _Heartbeat(
            self.rank, addr, world.timeout_s, self._keys, progress=lambda: self._bytes
        )
        try:
            table = world.bootstrap.allgather(
                {
                    "ucx": self._worker.address.tobytes().hex(),
                    "addr": addr,
                    "hb": self._hb.port,
                    "sid": secrets.token_hex(16),
                    "chunk": self._chunk,
                    "ucx_version": ucx_version(),
                }
            )
            if len({t["chunk"] for t in table}) != 1:
                raise hal.CommError(
                    "HAL_COMM_CHUNK_BYTES differs between ranks: "
                    + ", ".join(f"rank {r}: {t['chunk']}" for r, t in enumerate(table)),
                    op="init",
                )
            self._eps: dict[int, Any] = {}
            for peer, t in enumerate(table):
                if peer == self.rank:
                    continue
                address = api.UCXAddress.create_from_buffer(bytes.fromhex(t["ucx"]))
                self._eps[peer] = api.UCXEndpoint.create_from_worker_address(
                    self._worker, address, endpoint_error_handling=True
                )
        except api.UCXError as exc:
            self._hb.close()
            raise hal.CommError(
                f"ucx: set-up failed on rank {self.rank}: {exc}", op="init"
            ) from exc
        except BaseException:
            self._hb.close()
            raise
        session = hashlib.sha256("|".join(str(t.get("sid")) for t in table).encode()).digest()
        self._hb.start(
            {r: (t["addr"], t["hb"]) for r, t in enumerate(table) if r != self.rank}, session
        )
        self._pool: list[np.ndarray[Any, Any]] = []
        self._sseq: dict[int, int] = collections.defaultdict(int)  # pieces sent to each peer
        self._rseq: dict[int, int] = collections.defaultdict(int)  # pieces received from each peer
        self._sends: dict[int, collections.deque[tuple[Any, np.ndarray[Any, Any] | None, int]]] = (
            collections.defaultdict(collections.deque)
        )
        self._recv: dict[int, tuple[Any, np.ndarray[Any, Any]]] = {}
        self._staged: np.ndarray[Any, Any] | None = None
        self._said: set[str] = set()
        self.direct_pieces = 0  # pieces UCX moved straight from/to the payloads (no host piece)
        self._closed = False
        if world.device is not None:
            self._memory_path(world.device)

    @property
    def chunk_bytes(self) -> int:
        """Bytes per piece."""
        return self._chunk

    # -- memory kinds ------------------------------------------------------------------------
    def _memory_path(self, device: Any) -> None:
        """Choose and say (once, on logger ``hal.comm``) how ``device``'s memory travels: the plan's path."""
        key = str(device)
        if key in self._said:
            return
        self._said.add(key)
        kind = -1
        try:
            probe = hal.asarray(np.zeros(1, np.uint8), device=device)
            try:
                kind = probe.buffer.view(np.uint8).__dlpack_device__()[0]
            finally:
                probe.close()
        except Exception:  # noqa: BLE001 - no DLPack: memory the host cannot address
            pass
        if kind == 1:  # kDLCPU
            how = (
                "host memory: sent by UCX from/into the arrays; reductions receive into host pieces"
            )
            self.path = "host-ucx"
        elif kind == 2 and self.cuda:  # kDLCUDA, UCX built with CUDA
            how = (
                "CUDA memory: sent by UCX from/into the arrays (its cuda transports); "
                "reductions receive into host pieces"
            )
            self.path = "ucx-cuda"
        else:
            how = "device memory UCX cannot register: staged through host pieces with hal.copy"
            self.path = "staged-ucx"
        _log.info("ucx: rank %d, %s: %s (plan path %s)", self.rank, key, how, self.path)

    def _note(self, data: Any) -> None:
        """Say how the memory of ``data``'s device travels, the first time a device's memory comes by."""
        if isinstance(data, hal.Array) and str(data.buffer.device) not in self._said:
            self._memory_path(data.buffer.device)

    # -- piece calls (StagedTransport) ------------------------------------------------------
    def _buf(self) -> np.ndarray[Any, Any]:
        return self._pool.pop() if self._pool else np.empty(self._chunk, np.uint8)

    def send_space(self, peer: int) -> memoryview | None:
        """Return a host piece for ``peer`` unless :data:`_DEPTH` pieces to it are still in flight."""
        if len(self._sends[peer]) >= _DEPTH:
            return None
        self._staged = self._buf()
        return self._staged.data

    def send_commit(self, peer: int, nbytes: int) -> None:
        """Post the staged piece as the pair's next tagged message."""
        buf = self._staged
        assert buf is not None
        self._post_send(peer, buf[:nbytes], buf)

    def _post_send(self, peer: int, view: Any, buf: np.ndarray[Any, Any] | None) -> Any:
        seq = self._sseq[peer]
        self._sseq[peer] = seq + 1
        try:
            req = self._eps[peer].tag_send(
                self._Array(view), self._api_mod.UCXXTag(_tag(self.rank, seq))
            )
        except self._api_mod.UCXError as exc:
            raise self._dead(peer, exc) from exc
        self._sends[peer].append((req, buf, int(view.nbytes)))
        return req

    def poll(self) -> bool:
        """Progress the UCX worker and retire completed sends; True if a piece went out."""
        self._worker.progress()
        moved = False
        for peer, q in self._sends.items():
            while q and q[0][0].completed:
                req, buf, n = q.popleft()
                self._check(peer, req)
                if buf is not None:
                    self._pool.append(buf)
                self._bytes += n
                moved = True
        return moved

    def unsent(self, peer: int) -> int:
        """Pieces to ``peer`` whose UCX send has not completed (as of the last :meth:`poll`)."""
        return len(self._sends[peer])

    def _post_recv(self, peer: int, view: Any) -> Any:
        seq = self._rseq[peer]
        self._rseq[peer] = seq + 1
        try:
            return self._eps[peer].tag_recv(
                self._Array(view), self._api_mod.UCXXTag(_tag(peer, seq))
            )
        except self._api_mod.UCXError as exc:
            raise self._dead(peer, exc) from exc

    def recv_data(self, peer: int, nbytes: int) -> memoryview | None:
        """Post (once) the receive of the pair's next piece; return it once it has arrived."""
        if peer not in self._recv:
            buf = self._buf()
            self._recv[peer] = (self._post_recv(peer, buf[:nbytes]), buf)
        req, buf = self._recv[peer]
        if not req.completed:
            self._worker.progress()
            if not req.completed:
                return None
        self._check(peer, req)
        self._bytes += nbytes
        return buf.data[:nbytes]

    def recv_release(self, peer: int) -> None:
        """Recycle the piece's buffer."""
        _req, buf = self._recv.pop(peer)
        self._pool.append(buf)

    # -- the exchange: CUDA memory straight to UCX when it can -------------------------------
    def exchange(self, sends: Sequence[Send], recvs: Sequence[Recv], ctx: CallContext) -> None:
        """Run the exchange: straight from/into the payloads when UCX can, else over host pieces.

        The direct path (zero copy on this side) is taken when no receive reduces or overlaps a
        send (``after_sends``: with UCX's rendezvous protocol a send from the array completes only
        once the peer receives, so waiting for it before receiving could deadlock two ranks), no
        piece of a peer is half received, and every payload is memory UCX reaches: host memory (NumPy, a
        DLPack ``kDLCPU`` view of device memory: the CPU emulator), or CUDA memory when UCX has
        CUDA support. Otherwise :class:`StagedTransport` runs it over host pieces. Both paths cut
        messages into the same pieces with the same tags, so either side may take either path.
        """
        payloads: list[Send | Recv] = [*sends, *recvs]
        for x in payloads:
            self._note(x.data)
        if (
            not self._recv
            and not self.__dict__.get("_hal_pushback")
            and all(r.op is None and not r.after_sends for r in recvs)
        ):
            views = [self._direct_view(x.data) for x in payloads]
            if views and all(v is not None for v in views):
                self._direct(sends, recvs, views, ctx)
                return
        super().exchange(sends, recvs, ctx)

    def _direct_view(self, data: Any) -> Any:
        """Return a flat byte view of ``data`` that UCX can send from or receive into, or None."""
        if not isinstance(data, hal.Array):
            arr = np.asarray(data)
            return arr.reshape(-1).view(np.uint8) if arr.flags.c_contiguous else None
        host = _host_view(data, self._view_cache)
        if host is not None:
            return host
        return _cuda_view(data) if self.cuda else None

    def _direct(
        self, sends: Sequence[Send], recvs: Sequence[Recv], views: list[Any], ctx: CallContext
    ) -> None:
        ctx.stream.synchronize()  # the payloads are ready before UCX reads them
        chunk = ctx.chunk_bytes
        send_views, recv_views = views[: len(sends)], views[len(sends) :]
        # Wait for this exchange's own requests only: pieces an earlier call (StagedTransport.post)
        # left in flight complete when their receiver gets to them, maybe only after this exchange.
        pending: list[tuple[int, Any]] = []
        for s, v in zip(sends, send_views, strict=True):
            for lo in range(0, int(s.data.nbytes), chunk):
                pending.append((s.peer, self._post_send(s.peer, v[lo : lo + chunk], None)))
                self.direct_pieces += 1
        for r, v in zip(
            recvs, recv_views, strict=True
        ):  # none overlaps a send (exchange() checked)
            pending += self._post_recvs(r.peer, v, int(r.data.nbytes), chunk)
        rounds = _Rounds(self, ctx)
        while True:
            moved = self.poll()
            left = []
            for peer, req in pending:
                if req.completed:
                    self._check(peer, req)
                    moved = True
                else:
                    left.append((peer, req))
            pending = left
            if not pending:
                return
            rounds.after(moved, [p for p, _ in pending])

    def _post_recvs(self, peer: int, view: Any, nbytes: int, chunk: int) -> list[tuple[int, Any]]:
        out = []
        for lo in range(0, nbytes, chunk):
            out.append((peer, self._post_recv(peer, view[lo : lo + chunk])))
            self.direct_pieces += 1
        return out

    # -- faults ------------------------------------------------------------------------------
    def _check(self, peer: int, req: Any) -> None:
        try:
            req.check_error()
        except self._api_mod.UCXError as exc:
            raise self._dead(peer, exc) from exc

    def _dead(self, peer: int, exc: BaseException | None) -> hal.CommError:
        """Return the error for a failed endpoint to ``peer``, naming the rank to blame (as TCP does)."""
        why = f" ({type(exc).__name__}: {exc})" if exc else ""
        return self._hb.lost_peer(peer, f"ucx: rank {peer}'s endpoint failed", why)

    def check_peers(self, peers: Sequence[int], ctx: CallContext) -> None:
        """Without progress, look for the culprit: a failed endpoint, stopped heartbeats, a peer's blame."""
        if ctx.aborted is not None and ctx.aborted.is_set():
            return
        if self._hb.moved_since(ctx.last_progress):
            ctx.progressed()
            return
        self._worker.progress()
        for peer, ep in self._eps.items():
            if not ep.alive:
                raise self._dead(peer, None)
        if not ctx.stalled():
            return
        self._hb.check_stall(ctx, peers, note=" (ucx)")

    def idle(self, rounds: int) -> None:
        """Yield the core for a few rounds, then sleep a little (UCX is progressed by polling)."""
        if rounds < 64:
            time.sleep(0)
        else:
            time.sleep(min(2e-4, 2e-6 * rounds))

    def close(self) -> None:
        """Let queued sends finish (1 s at most), cancel the rest, close endpoints and the worker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + 1.0
        try:
            while any(self._sends.values()) and time.monotonic() < deadline:
                self.poll()
                time.sleep(1e-4)
        except hal.CommError:
            pass
        if self._hb.mine is None:
            self._hb.mine = (-1,)  # closed cleanly, blaming nobody
        self._hb.close()
        try:
            self._worker.cancel_inflight_requests()
            self._worker.progress()
        except Exception:  # noqa: BLE001 - closing after a failure: nothing left to save
            pass
        self._sends.clear()
        self._recv.clear()
        for ep in self._eps.values():
            try:
                self._worker.progress()
                if ep.alive:  # closing an endpoint whose peer is gone crashes ucxx 0.52: leave it
                    ep.close()
            except Exception:  # noqa: BLE001
                pass
        try:
            for _ in range(8):
                self._worker.progress()
        except Exception:  # noqa: BLE001
            pass
        # Release endpoints, worker and context now and in this order, while Python still runs
        # (left to interpreter shutdown, their destructors may run after what they need is gone).
        self._eps.clear()
        self._pool.clear()
        self.__dict__.pop("_worker", None)
        self.__dict__.pop("_ctx", None)
