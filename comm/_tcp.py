"""TCP transport: a full mesh of non-blocking sockets, several per peer (``HAL_COMM_NSOCKS``).

``HAL_COMM_IFNAME`` picks the interface whose address the rank listens on (prefixes, ``^`` to
exclude, ``=`` for exact names; see hal/comm/_ifaces.py); by default, the address this rank used
to reach the rendezvous.

Messages are cut into pieces of ``HAL_COMM_CHUNK_BYTES``; piece k to a peer travels on that
peer's socket ``k % nsocks`` (both sides count pieces, so no framing is needed: sizes were
agreed by every rank before the data moves). A peer that closes its sockets is reported as
dead by rank number.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Sequence

import hal
from hal.comm._config import parse_size
from hal.comm._ifaces import select_interface
from hal.comm._transport import CallContext, StagedTransport, World

__all__ = ["TcpTransport"]

_HELLO = struct.Struct("<ii")


class _Conn:
    """One socket to a peer, with its queue of outgoing pieces."""

    __slots__ = ("outq", "received", "sent", "sock")

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
            except OSError:  # pragma: no cover - capped by the kernel
                pass
        self.sock = sock
        self.sent = 0  # bytes written to / read from this socket (HAL_COMM_NSOCKS spreading)
        self.received = 0
        self.outq: collections.deque[tuple[bytearray, memoryview]] = collections.deque()


class _Peer:
    __slots__ = ("conns", "filled", "inbuf", "recv_count", "send_count")

    def __init__(self, conns: list[_Conn], chunk: int) -> None:
        self.conns = conns
        self.send_count = 0
        self.recv_count = 0
        self.inbuf = bytearray(chunk)
        self.filled = 0


_HB = struct.Struct("<4si")
_HB_MAGIC = b"HALH"


class _Heartbeat:
    """UDP heartbeats to every peer from a thread of their own, so a busy rank still beats."""

    def __init__(self, rank: int, addr: str, timeout_s: float) -> None:
        self.rank = rank
        self.interval = min(0.5, max(0.02, timeout_s / 10))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((addr, 0))
        self.port = self.sock.getsockname()[1]
        self.peers: dict[int, tuple[str, int]] = {}
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, peers: dict[int, tuple[str, int]]) -> None:
        """Start beating to ``peers`` ({rank: (addr, port)})."""
        self.peers = peers
        now = time.monotonic()
        self.seen = dict.fromkeys(peers, now)
        self._thread = threading.Thread(target=self._loop, name=f"hal-comm-heartbeat-rank{self.rank}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        msg = _HB.pack(_HB_MAGIC, self.rank)
        next_beat = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                for dest in self.peers.values():
                    try:
                        self.sock.sendto(msg, dest)
                    except OSError:
                        pass  # unreachable now (a cut link): the peer will see us stale
                next_beat = now + self.interval
            try:
                ready, _, _ = select.select([self.sock], [], [], max(0.0, next_beat - time.monotonic()))
                if ready:
                    data, _addr = self.sock.recvfrom(64)
                    if len(data) == _HB.size:
                        magic, peer = _HB.unpack(data)
                        if magic == _HB_MAGIC and peer in self.seen:
                            self.seen[peer] = time.monotonic()
            except (OSError, ValueError):
                if self._stop.is_set():
                    return

    def stale(self, age_s: float) -> dict[int, float]:
        """Return ``{rank: seconds since its last heartbeat}`` of the ranks silent for over ``age_s``."""
        now = time.monotonic()
        return {r: now - t for r, t in sorted(self.seen.items()) if now - t > max(age_s, 3 * self.interval)}

    def close(self) -> None:
        """Stop the thread and close the socket. Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self.sock.close()


class TcpTransport(StagedTransport):
    """Sockets between every pair of ranks (works across hosts; loopback on one)."""

    name = "tcp"
    alpha_s = 300e-6
    beta_s_per_byte = 1 / 1.5e9
    path = "host-tcp"

    def __init__(self, world: World) -> None:
        self.rank = world.rank
        self.size = world.size
        raw_chunk = os.environ.get("HAL_COMM_CHUNK_BYTES")
        self._chunk = max(4096, parse_size(raw_chunk, "HAL_COMM_CHUNK_BYTES")) // 64 * 64 if raw_chunk else 1 << 20
        raw_n = os.environ.get("HAL_COMM_NSOCKS", "1")
        try:
            nsocks = int(raw_n)
        except ValueError:
            raise ValueError(f"HAL_COMM_NSOCKS={raw_n!r} must be a positive integer") from None
        if not 1 <= nsocks <= 64:
            raise ValueError(f"HAL_COMM_NSOCKS={raw_n!r} must be in 1..64")
        self._pool: list[bytearray] = []
        self._depth = 4  # pieces in flight per peer
        addr = getattr(world.bootstrap, "local_address", "127.0.0.1")
        spec = os.environ.get("HAL_COMM_IFNAME")
        self.interface: str | None = None
        if spec:
            self.interface, addr = select_interface(spec)
        listener = socket.create_server((addr, 0), backlog=max(16, world.size * nsocks))
        listener.settimeout(world.timeout_s)
        self._hb = _Heartbeat(self.rank, addr, world.timeout_s)
        try:
            table = world.bootstrap.allgather(
                {"addr": addr, "port": listener.getsockname()[1], "nsocks": nsocks, "hb": self._hb.port}
            )
            if len({t["nsocks"] for t in table}) != 1:
                raise hal.CommError(
                    "HAL_COMM_NSOCKS differs between ranks: "
                    + ", ".join(f"rank {r}: {t['nsocks']}" for r, t in enumerate(table)),
                    op="init",
                )
            socks: dict[int, list[socket.socket | None]] = {
                p: [None] * nsocks for p in range(self.size) if p != self.rank
            }
            for peer in range(self.rank):  # higher ranks connect to lower ones
                for i in range(nsocks):
                    s = socket.create_connection((table[peer]["addr"], table[peer]["port"]), timeout=world.timeout_s)
                    s.sendall(_HELLO.pack(self.rank, i))
                    socks[peer][i] = s
            for _ in range((self.size - 1 - self.rank) * nsocks):
                s, _addr = listener.accept()
                s.settimeout(world.timeout_s)
                data = b""
                while len(data) < _HELLO.size:
                    part = s.recv(_HELLO.size - len(data))
                    if not part:
                        raise hal.CommError("tcp: a peer closed its connection during set-up", op="init")
                    data += part
                peer, i = _HELLO.unpack(data)
                if not (self.rank < peer < self.size and 0 <= i < nsocks) or socks[peer][i] is not None:
                    raise hal.CommError(f"tcp: unexpected hello (rank {peer}, socket {i}) during set-up", op="init")
                socks[peer][i] = s
        except TimeoutError as exc:
            self._hb.close()
            raise hal.CommError(f"tcp: set-up timed out on rank {self.rank}", op="init") from exc
        except BaseException:
            self._hb.close()
            raise
        finally:
            listener.close()
        self._hb.start({r: (t["addr"], t["hb"]) for r, t in enumerate(table) if r != self.rank})
        self._peers = {
            p: _Peer([_Conn(s) for s in ss if s is not None], self._chunk) for p, ss in socks.items()
        }
        self.nsocks = nsocks
        self._closed = False

    @property
    def chunk_bytes(self) -> int:
        """Bytes per piece."""
        return self._chunk

    def socket_bytes(self) -> dict[int, list[tuple[int, int]]]:
        """Return ``{peer: [(bytes sent, bytes received) per socket]}`` (how pieces spread)."""
        return {peer: [(c.sent, c.received) for c in p.conns] for peer, p in self._peers.items()}

    def _dead(self, peer: int, exc: BaseException | None) -> hal.CommError:
        why = f": {exc}" if exc else ""
        stale = {r: a for r, a in self._hb.stale(0.0).items() if r != peer}
        if stale:  # the peer may have given up on a rank that went silent first: name that one too
            ages = ", ".join(f"rank {r}: {a:.1f} s" for r, a in stale.items())
            return hal.CommError(
                f"tcp: rank {peer} closed its connection{why}; rank(s) {', '.join(map(str, stale))} "
                f"went silent before (no heartbeat for {ages})",
                ranks=(*stale, peer),
            )
        return hal.CommError(f"tcp: rank {peer} closed its connection (died?){why}", ranks=(peer,))

    def send_space(self, peer: int) -> memoryview | None:
        """Return a staging buffer for the next piece to ``peer`` (None while too many are in flight)."""
        p = self._peers[peer]
        if sum(len(c.outq) for c in p.conns) >= self._depth:
            return None
        buf = self._pool.pop() if self._pool else bytearray(self._chunk)
        self._staged = buf
        return memoryview(buf)

    def send_commit(self, peer: int, nbytes: int) -> None:
        """Queue the staged piece on the peer's next socket and start sending it."""
        p = self._peers[peer]
        conn = p.conns[p.send_count % len(p.conns)]
        p.send_count += 1
        buf = self._staged
        conn.outq.append((buf, memoryview(buf)[:nbytes]))
        self._flush(peer, conn)

    def _flush(self, peer: int, conn: _Conn) -> bool:
        moved = False
        while conn.outq:
            buf, view = conn.outq[0]
            try:
                n = conn.sock.send(view)
            except (BlockingIOError, InterruptedError):
                return moved
            except OSError as exc:
                raise self._dead(peer, exc) from exc
            moved = True
            conn.sent += n
            if n < len(view):
                conn.outq[0] = (buf, view[n:])
                return moved
            conn.outq.popleft()
            self._pool.append(buf)
        return moved

    def poll(self) -> bool:
        """Push queued pieces into the sockets."""
        moved = False
        for peer, p in self._peers.items():
            for c in p.conns:
                if c.outq and self._flush(peer, c):
                    moved = True
        return moved

    def recv_data(self, peer: int, nbytes: int) -> memoryview | None:
        """Read the next piece from ``peer``'s current socket; return it once complete."""
        p = self._peers[peer]
        conn = p.conns[p.recv_count % len(p.conns)]
        view = memoryview(p.inbuf)
        while p.filled < nbytes:
            try:
                n = conn.sock.recv_into(view[p.filled : nbytes])
            except (BlockingIOError, InterruptedError):
                return None
            except OSError as exc:
                raise self._dead(peer, exc) from exc
            if n == 0:
                raise self._dead(peer, None)
            p.filled += n
            conn.received += n
        return view[:nbytes]

    def recv_release(self, peer: int) -> None:
        """Move to the next piece (on the next socket)."""
        p = self._peers[peer]
        p.filled = 0
        p.recv_count += 1

    def check_peers(self, peers: Sequence[int], ctx: CallContext) -> None:
        """At a stall, name the ranks whose heartbeats stopped (stopped, killed or cut off).

        A dead process is also seen by its sockets (EOF names the rank); a stopped process or a
        cut link is not, so without this a survivor could only name the peer it waits on.
        """
        if not ctx.stalled() or (ctx.aborted is not None and ctx.aborted.is_set()):
            return
        stale = self._hb.stale(ctx.timeout_s / 2)
        if stale:
            ages = ", ".join(f"rank {r}: {a:.1f} s" for r, a in stale.items())
            raise hal.CommError(
                f"{ctx.collective} (seq {ctx.seq}): no progress for {ctx.timeout_s * 1e3:.0f} ms "
                f"(HAL_COMM_TIMEOUT_MS); rank(s) {', '.join(map(str, stale))} unreachable: no heartbeat "
                f"for {ages} (stopped, killed or cut off); waiting on rank(s) {', '.join(map(str, sorted(set(peers))))}",
                op=ctx.collective,
                ranks=tuple(stale),
            )

    def idle(self, rounds: int) -> None:
        """Wait until a socket can be read, or one with queued pieces can be written (20 ms at most)."""
        if rounds < 8:
            return
        conns = [c for p in self._peers.values() for c in p.conns]
        readable = [c.sock for c in conns]
        writable = [c.sock for c in conns if c.outq]
        if readable or writable:
            select.select(readable, writable, [], 0.02)

    def close(self) -> None:
        """Flush what is queued (briefly) and close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + 1.0
        try:
            while time.monotonic() < deadline and any(c.outq for p in self._peers.values() for c in p.conns):
                self.poll()
                time.sleep(1e-3)
        except hal.CommError:
            pass
        for p in self._peers.values():
            for c in p.conns:
                c.sock.close()
        self._peers.clear()
        self._hb.close()
