"""TCP transport: a full mesh of non-blocking sockets, several per peer (``HAL_COMM_NSOCKS``).

``HAL_COMM_IFNAME`` picks the interface whose address the rank listens on (prefixes, ``^`` to
exclude, ``=`` for exact names; see hal/comm/_ifaces.py); by default, the address this rank used
to reach the rendezvous.

Messages are cut into pieces of ``HAL_COMM_CHUNK_BYTES``; piece k to a peer travels on that
peer's socket ``k % nsocks`` (both sides count pieces, so no framing is needed: sizes were
agreed by every rank before the data moves). A peer that closes its sockets is reported as
dead by rank number.

Every connection starts with a challenge-response hello (nonces from both sides, HMACs under
per-direction keys derived from the job's secret, bound to this communicator's session); the
heartbeats carry a MAC, a strictly increasing sequence number, the sender's byte counter (a
rank waiting on a slow but moving neighbour is not stalled) and, once a rank failed, the ranks
it blames, so that a survivor that sees a neighbour give up names the rank that died rather
than the neighbour (docs/security.md, docs/reliability.md).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import logging
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

import hal
from hal.comm._auth import (
    AUTH_FAILED,
    MAC_BYTES,
    NONCE_BYTES,
    Keys,
    mismatch_hint,
    new_nonce,
    warn_unauthenticated,
)
from hal.comm._config import job_secret
from hal.comm._ifaces import select_interface
from hal.comm._transport import CallContext, StagedTransport, World, wait_fds
from hal.spi import setting

__all__ = ["TcpTransport"]

_log = logging.getLogger("hal.comm")

_HELLO = struct.Struct("<4sii16s")  # magic, connecting rank, socket index, its nonce
_HELLO_MAGIC = b"HALT"
_CHALLENGE = NONCE_BYTES + MAC_BYTES  # the acceptor's nonce and its proof
_OK = b"\x01"
_HANDSHAKE_S = 10.0  # an accepted connection must finish its hello within this
_MAX_HELLOS = 64  # accepted connections in their hello at once (the oldest is dropped beyond)


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


class _Hello:
    """One connection during set-up, outgoing (to a lower rank) or accepted (from a higher one)."""

    __slots__ = ("buf", "idx", "need", "nonce", "other", "out", "peer", "since", "sock", "where")

    def __init__(
        self, sock: socket.socket, *, out: bool, peer: int = -1, idx: int = -1, where: str = ""
    ) -> None:
        self.sock = sock
        self.out = out
        self.peer = peer
        self.idx = idx
        self.where = where
        self.nonce = new_nonce() if out else b""
        self.other = b""
        self.buf = b""
        self.need = _CHALLENGE if out else _HELLO.size
        self.since = time.monotonic()


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


_HB = struct.Struct("<4siQQH")  # magic, rank, sequence number, bytes moved, number of blamed ranks
_HB_MAGIC = b"HALB"
_HB_MAC = 16
_HB_MAX_BLAME = 16


class _Heartbeat:
    """Authenticated UDP heartbeats to every peer from a thread of their own, so a busy rank still beats.

    A beat carries the sender's byte counter (progress anywhere in the job is progress) and, once
    the sender failed, the ranks it blames. Beats whose MAC, session or sequence number does not
    check out (forged or replayed) are ignored.
    """

    def __init__(
        self,
        rank: int,
        addr: str,
        timeout_s: float,
        keys: Keys | None = None,
        progress: Callable[[], int] | None = None,
    ) -> None:
        self.rank = rank
        self.interval = min(0.5, max(0.02, timeout_s / 10))
        self.keys = keys or Keys(None)
        self.session = b""
        self.progress = progress or (lambda: 0)
        self.sock = socket.socket(_family(addr), socket.SOCK_DGRAM)
        self.sock.bind((addr, 0))
        self.port = self.sock.getsockname()[1]
        self.peers: dict[int, tuple[str, int]] = {}
        self.seen: dict[int, float] = {}
        self.moved: dict[int, int] = {}  # peer -> its last byte counter
        self.moved_at: dict[int, float] = {}  # peer -> when that counter last grew
        self.blame: dict[int, tuple[int, ...]] = {}  # peer -> the ranks it blames for its failure
        self.last_seq: dict[int, int] = {}
        self.forged = 0  # datagrams dropped (bad size, magic, rank, MAC or replayed)
        self.mine: tuple[int, ...] | None = None  # the ranks this rank blames, once it failed
        self._seq = itertools.count(1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, peers: dict[int, tuple[str, int]], session: bytes = b"") -> None:
        """Start beating to ``peers`` ({rank: (addr, port)}) for the communicator ``session``."""
        self.peers = peers
        self.session = session
        now = time.monotonic()
        self.seen = dict.fromkeys(peers, now)
        self.moved_at = dict.fromkeys(peers, 0.0)
        self._thread = threading.Thread(
            target=self._loop, name=f"hal-comm-heartbeat-rank{self.rank}", daemon=True
        )
        self._thread.start()

    def _packet(self) -> bytes:
        blame = (self.mine or ())[:_HB_MAX_BLAME]
        body = _HB.pack(
            _HB_MAGIC, self.rank, next(self._seq), self.progress() & ((1 << 64) - 1), len(blame)
        )
        body += struct.pack(f"<{len(blame)}i", *blame)
        return body + self.keys.mac("heartbeat", self.session, body)[:_HB_MAC]

    def beat(self) -> None:
        """Send one beat to every peer now."""
        msg = self._packet()
        for dest in self.peers.values():
            try:
                self.sock.sendto(msg, dest)
            except OSError:
                pass  # unreachable now (a cut link): the peer will see us stale

    def fail(self, blame: Sequence[int]) -> None:
        """Tell every peer, from now on and at once, that this rank failed because of ``blame``.

        Only the first call counts: a rank fails once, blaming whom it blamed first.
        """
        if self.mine is not None:
            return
        self.mine = tuple(sorted(set(blame)))
        if self._thread is not None and not self._stop.is_set():
            self.beat()

    def lost_peer(self, peer: int, event: str, why: str) -> hal.CommError:
        """Return the error for the lost connection to ``peer``, naming the rank to blame.

        A peer that drops its connection either died, or gave up because of another rank: in
        that case its heartbeats said whom it blames (sent before it closed anything), and that
        rank is named instead of the live neighbour; a rank that went silent before is named
        too. This rank's own failure is told to every peer (:meth:`fail`).

        Args:
            peer: the rank whose connection was lost.
            event: what happened, the start of the message (``"tcp: rank 3 closed its connection"``).
            why: the underlying error, appended to ``event`` (``""`` if none).
        """
        grace = min(1.0, max(0.2, 2.5 * self.interval))
        blamed = self.blamed_by(peer, grace)
        if blamed:
            others = tuple(r for r in blamed if r >= 0 and r != self.rank)  # -1: it closed cleanly
            if others:
                self.fail(others)
                return hal.CommError(
                    f"{event}{why}: it gave up because of rank(s) {', '.join(map(str, others))}",
                    ranks=others,
                )
        stale = {r: a for r, a in self.stale(0.0).items() if r != peer and r not in self.blame}
        if stale:  # the peer may have given up on a rank that went silent first: name that one too
            ages = ", ".join(f"rank {r}: {a:.1f} s" for r, a in stale.items())
            self.fail((*stale, peer))
            return hal.CommError(
                f"{event}{why}; rank(s) {', '.join(map(str, stale))} "
                f"went silent before (no heartbeat for {ages})",
                ranks=(*stale, peer),
            )
        self.fail((peer,))
        return hal.CommError(f"{event} (died?){why}", ranks=(peer,))

    def check_stall(self, ctx: CallContext, peers: Sequence[int], note: str = "") -> None:
        """Raise ``hal.CommError`` naming the culprit of a stalled call, or tell the peers it stalled.

        The culprit is a rank whose heartbeats stopped, else a rank that other ranks gave up
        because of. With neither, this rank fails blaming ``peers`` (the caller raises its
        timeout naming them): the others hear it at once.

        Args:
            ctx: the stalled call.
            peers: the ranks the call waits on.
            note: appended to the message (``" (ucx)"``).
        """
        waiting = ", ".join(map(str, sorted(set(peers))))
        head = f"{ctx.collective} (seq {ctx.seq}): no progress for {ctx.timeout_s * 1e3:.0f} ms (HAL_COMM_TIMEOUT_MS)"
        stale = self.stale(ctx.timeout_s / 2)
        if stale:
            ages = ", ".join(f"rank {r}: {a:.1f} s" for r, a in stale.items())
            self.fail(tuple(stale))
            raise hal.CommError(
                f"{head}; rank(s) {', '.join(map(str, stale))} unreachable: no heartbeat "
                f"for {ages} (stopped, killed or cut off); waiting on rank(s) {waiting}{note}",
                op=ctx.collective,
                ranks=tuple(stale),
            )
        blamed = sorted({r for b in self.blame.values() for r in b if r >= 0 and r != self.rank})
        if blamed:
            self.fail(blamed)
            gave_up = ", ".join(map(str, sorted(self.blame)))
            raise hal.CommError(
                f"{head}; rank(s) {gave_up} gave up because of rank(s) {', '.join(map(str, blamed))}; "
                f"waiting on rank(s) {waiting}{note}",
                op=ctx.collective,
                ranks=tuple(blamed),
            )
        self.fail(peers)

    def _receive(self, data: bytes) -> None:
        if len(data) < _HB.size + _HB_MAC:
            self.forged += 1
            return
        magic, peer, seq, moved, n = _HB.unpack_from(data)
        if (
            magic != _HB_MAGIC
            or peer not in self.seen
            or n > _HB_MAX_BLAME
            or len(data) != _HB.size + 4 * n + _HB_MAC
        ):
            self.forged += 1
            return
        body, mac = data[:-_HB_MAC], data[-_HB_MAC:]
        if not self.keys.verify("heartbeat", mac, self.session, body) or seq <= self.last_seq.get(
            peer, 0
        ):
            self.forged += 1
            return
        now = time.monotonic()
        self.last_seq[peer] = seq
        self.seen[peer] = now
        if moved != self.moved.get(peer):
            if peer in self.moved:
                self.moved_at[peer] = now
            self.moved[peer] = moved
        if n:
            self.blame.setdefault(peer, struct.unpack_from(f"<{n}i", data, _HB.size))

    def _loop(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self.beat()
                next_beat = now + self.interval
            try:
                ready, _ = wait_fds([self.sock], (), max(0.0, next_beat - time.monotonic()))
                if ready:
                    data, _addr = self.sock.recvfrom(512)
                    self._receive(data)
            except (OSError, ValueError, struct.error):
                if self._stop.is_set():
                    return

    def stale(self, age_s: float) -> dict[int, float]:
        """Return ``{rank: seconds since its last heartbeat}`` of the ranks silent for over ``age_s``."""
        now = time.monotonic()
        return {
            r: now - t
            for r, t in sorted(self.seen.items())
            if now - t > max(age_s, 3 * self.interval)
        }

    def moved_since(self, t: float) -> bool:
        """True when some peer's byte counter grew after ``t`` (as its heartbeats told)."""
        return any(at > t for at in self.moved_at.values())

    def blamed_by(self, peer: int, wait_s: float) -> tuple[int, ...] | None:
        """Return the ranks ``peer`` blames for its failure, waiting up to ``wait_s`` for its word (None: none)."""
        deadline = time.monotonic() + wait_s
        while peer not in self.blame and time.monotonic() < deadline and self._thread is not None:
            time.sleep(0.01)
        return self.blame.get(peer)

    def close(self) -> None:
        """Stop the thread and close the socket. Idempotent."""
        if self.mine is not None and self._thread is not None and not self._stop.is_set():
            self.beat()  # the last word: why this rank leaves
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
        # unset: 1 MiB pieces here (HAL_COMM_CHUNK_BYTES's 4M default is the shm slot size)
        self._chunk = int(setting("HAL_COMM_CHUNK_BYTES", default=1 << 20)) // 64 * 64
        nsocks = int(setting("HAL_COMM_NSOCKS"))  # 1..64 (hal.ConfigError)
        self._pool: list[bytearray] = []
        self._depth = 4  # pieces in flight per peer
        addr = getattr(world.bootstrap, "local_address", "127.0.0.1")
        spec = setting("HAL_COMM_IFNAME")
        self.interface: str | None = None
        if spec:
            self.interface, addr = select_interface(spec, family=_family(addr))
        secret = getattr(world.bootstrap, "secret", None)
        self._keys = Keys(secret if secret is not None else job_secret())
        if not self._keys.authenticated and len(world.hosts) > 1:
            warn_unauthenticated("the TCP transport between hosts")
        self._bytes = 0  # bytes moved through this rank's sockets (heartbeats carry it)
        self._partial = False  # bytes of an unfinished piece arrived since the last poll()
        listener = socket.create_server(
            (addr, 0), family=_family(addr), backlog=max(16, world.size * nsocks)
        )
        self._hb = _Heartbeat(
            self.rank, addr, world.timeout_s, self._keys, progress=lambda: self._bytes
        )
        try:
            table = world.bootstrap.allgather(
                {
                    "addr": addr,
                    "port": listener.getsockname()[1],
                    "nsocks": nsocks,
                    "hb": self._hb.port,
                    "sid": secrets.token_hex(16),
                }
            )
            if len({t["nsocks"] for t in table}) != 1:
                raise hal.CommError(
                    "HAL_COMM_NSOCKS differs between ranks: "
                    + ", ".join(f"rank {r}: {t['nsocks']}" for r, t in enumerate(table)),
                    op="init",
                )
            # this communicator's session: MACs of one communicator are worth nothing in another
            session = hashlib.sha256("|".join(str(t.get("sid")) for t in table).encode()).digest()
            socks = self._mesh(listener, table, nsocks, session, world.setup_timeout_s)
        except BaseException:
            self._hb.close()
            raise
        finally:
            listener.close()
        self._hb.start(
            {r: (t["addr"], t["hb"]) for r, t in enumerate(table) if r != self.rank}, session
        )
        self._peers = {p: _Peer([_Conn(s) for s in ss], self._chunk) for p, ss in socks.items()}
        self.nsocks = nsocks
        self._closed = False

    def _mesh(
        self,
        listener: socket.socket,
        table: list[dict[str, object]],
        nsocks: int,
        session: bytes,
        timeout_s: float,
    ) -> dict[int, list[socket.socket]]:
        """Connect to every lower rank and accept every higher one, each hello authenticated.

        Accepted connections that send nothing, garbage, a claim outside the world, a second claim
        of a socket, or a wrong proof are closed (and listed if set-up then times out); they never
        hold up the real ranks beyond their own :data:`_HANDSHAKE_S`.
        """
        deadline = time.monotonic() + timeout_s
        socks: dict[int, list[socket.socket | None]] = {
            p: [None] * nsocks for p in range(self.size) if p != self.rank
        }
        hellos: dict[socket.socket, _Hello] = {}
        refused: list[str] = []

        def claim(h: _Hello, acceptor: int, connector: int) -> bytes:
            return session + struct.pack("<iii", connector, h.idx, acceptor)

        def drop(h: _Hello, why: str) -> None:
            hellos.pop(h.sock, None)
            h.sock.close()
            if len(refused) < 8:
                refused.append(f"{h.where} ({why})")
                # at once, not only if set-up times out; a flood of strangers logs 8 lines at most
                if "authentication" in why:
                    _log.warning("hal.comm tcp: rank %d refused %s: %s", self.rank, h.where, why)

        try:
            for peer in range(self.rank):  # higher ranks connect to lower ones
                for i in range(nsocks):
                    dest = (str(table[peer]["addr"]), int(str(table[peer]["port"])))
                    s = socket.create_connection(
                        dest, timeout=max(0.1, deadline - time.monotonic())
                    )
                    h = _Hello(s, out=True, peer=peer, idx=i, where=f"rank {peer}")
                    s.sendall(_HELLO.pack(_HELLO_MAGIC, self.rank, i, h.nonce))
                    s.setblocking(False)
                    hellos[s] = h
            listener.setblocking(False)
            want_in = (self.size - 1 - self.rank) * nsocks
            got_in = 0
            while got_in < want_in or any(h.out for h in hellos.values()):
                now = time.monotonic()
                if now > deadline:
                    missing = sorted({p for p, ss in socks.items() if any(x is None for x in ss)})
                    extra = f"; refused: {'; '.join(refused)}" if refused else ""
                    raise hal.CommError(
                        f"tcp: set-up timed out on rank {self.rank} after {timeout_s:.1f} s "
                        f"(HAL_COMM_INIT_TIMEOUT_MS): no authenticated "
                        f"connection with rank(s) {', '.join(map(str, missing))}{extra}",
                        op="init",
                        ranks=tuple(missing),
                    )
                for h in [
                    h
                    for h in hellos.values()
                    if not h.out and now - h.since > min(_HANDSHAKE_S, timeout_s)
                ]:
                    drop(h, "silent during its hello")
                ready, _ = wait_fds([listener, *hellos], (), min(0.1, max(0.0, deadline - now)))
                for s in ready:
                    if s is listener:
                        try:
                            c, where = listener.accept()
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError:  # out of descriptors: make room, try again
                            incoming = [h for h in hellos.values() if not h.out]
                            if incoming:
                                drop(incoming[0], "dropped for lack of descriptors")
                            time.sleep(0.01)
                            continue
                        c.setblocking(False)
                        hellos[c] = _Hello(c, out=False, where=f"{where[0]}:{where[1]}")
                        incoming = [h for h in hellos.values() if not h.out]
                        if len(incoming) > _MAX_HELLOS:
                            drop(incoming[0], "too many connections in their hello")
                        continue
                    found = hellos.get(s)
                    if found is None:
                        continue
                    h = found
                    err: OSError | None = None
                    try:
                        data = s.recv(h.need - len(h.buf))
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as exc:
                        data, err = b"", exc
                    if not data:
                        if h.out:
                            raise hal.CommError(
                                f"tcp: rank {h.peer} hung up during the hello on rank {self.rank}"
                                f"{f' ({err})' if err else ''}: it did not accept this rank's proof "
                                "(HAL_COMM_SECRET differs between ranks?)",
                                op="init",
                                ranks=(h.peer,),
                            )
                        drop(h, "hung up during its hello")
                        continue
                    h.buf += data
                    if len(h.buf) < h.need:
                        continue
                    if (
                        h.out and h.need == _CHALLENGE
                    ):  # the lower rank's proof: check it, then ours
                        other, mac = h.buf[:NONCE_BYTES], h.buf[NONCE_BYTES:]
                        if not self._keys.verify(
                            "tcp-acceptor", mac, h.nonce, other, claim(h, h.peer, self.rank)
                        ):
                            try:  # in place of our proof: the acceptor records why we hung up
                                s.setblocking(True)
                                s.settimeout(1.0)
                                s.sendall(AUTH_FAILED)
                            except OSError:
                                pass
                            raise hal.CommError(
                                f"tcp: authentication with rank {h.peer} failed on rank {self.rank}, wrong or "
                                f"missing secret: whatever answers at rank {h.peer}'s address did not prove it "
                                f"holds the job's secret, so this rank refused it "
                                f"({mismatch_hint(self._keys.authenticated)}; HAL_COMM_SECRET differs "
                                "between ranks, or a stranger took the address)",
                                op="init",
                                ranks=(h.peer,),
                            )
                        s.setblocking(True)
                        s.sendall(
                            self._keys.mac(
                                "tcp-connector", other, h.nonce, claim(h, h.peer, self.rank)
                            )
                        )
                        s.setblocking(False)
                        h.buf, h.need = b"", len(_OK)
                    elif h.out:  # accepted
                        if h.buf != _OK:
                            raise hal.CommError(
                                f"tcp: rank {h.peer} sent a malformed hello answer",
                                op="init",
                                ranks=(h.peer,),
                            )
                        socks[h.peer][h.idx] = s
                        del hellos[s]
                    elif (
                        h.need == _HELLO.size
                    ):  # a higher rank's claim: answer with our nonce and proof
                        magic, peer, idx, nonce = _HELLO.unpack(h.buf)
                        if magic != _HELLO_MAGIC:
                            drop(h, "not a hal hello")
                            continue
                        if not (self.rank < peer < self.size and 0 <= idx < nsocks):
                            drop(h, f"claims rank {peer} socket {idx}, outside the world")
                            continue
                        h.peer, h.idx, h.other = peer, idx, nonce
                        h.nonce = new_nonce()
                        try:
                            s.send(
                                h.nonce
                                + self._keys.mac(
                                    "tcp-acceptor", nonce, h.nonce, claim(h, self.rank, peer)
                                )
                            )
                        except OSError:
                            drop(h, "hung up during its hello")
                            continue
                        h.buf, h.need = b"", MAC_BYTES
                    else:  # its proof
                        if h.buf == AUTH_FAILED:
                            drop(
                                h,
                                f"claimed rank {h.peer}, then refused authentication: wrong or missing "
                                f"secret ({mismatch_hint(self._keys.authenticated)})",
                            )
                            continue
                        if not self._keys.verify(
                            "tcp-connector", h.buf, h.nonce, h.other, claim(h, self.rank, h.peer)
                        ):
                            drop(
                                h,
                                f"claimed rank {h.peer} without the job's secret (failed authentication)",
                            )
                            continue
                        if socks[h.peer][h.idx] is not None:
                            drop(h, f"claimed rank {h.peer} socket {h.idx} a second time")
                            continue
                        try:
                            s.send(_OK)
                        except OSError:
                            drop(h, "hung up during its hello")
                            continue
                        socks[h.peer][h.idx] = s
                        del hellos[s]
                        got_in += 1
        except TimeoutError as exc:
            raise hal.CommError(
                f"tcp: set-up timed out on rank {self.rank} ({exc})", op="init"
            ) from exc
        except BaseException:
            for ss in socks.values():
                for x in ss:
                    if x is not None:
                        x.close()
            raise
        finally:
            for h in list(hellos.values()):
                h.sock.close()
        return {p: [x for x in ss if x is not None] for p, ss in socks.items()}

    @property
    def chunk_bytes(self) -> int:
        """Bytes per piece."""
        return self._chunk

    def socket_bytes(self) -> dict[int, list[tuple[int, int]]]:
        """Return ``{peer: [(bytes sent, bytes received) per socket]}`` (how pieces spread)."""
        return {peer: [(c.sent, c.received) for c in p.conns] for peer, p in self._peers.items()}

    def _dead(self, peer: int, exc: BaseException | None) -> hal.CommError:
        """Return the error for ``peer``'s closed connection, naming the rank to blame."""
        why = f": {exc}" if exc else ""
        return self._hb.lost_peer(peer, f"tcp: rank {peer} closed its connection", why)

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
            self._bytes += n
            if n < len(view):
                conn.outq[0] = (buf, view[n:])
                return moved
            conn.outq.popleft()
            self._pool.append(buf)
        return moved

    def poll(self) -> bool:
        """Push queued pieces into the sockets; True if bytes moved (part of a piece counts)."""
        moved = (
            self._partial
        )  # bytes of a piece arrived since the last call: progress, byte by byte
        self._partial = False
        for peer, p in self._peers.items():
            for c in p.conns:
                if c.outq and self._flush(peer, c):
                    moved = True
        return moved

    def unsent(self, peer: int) -> int:
        """Pieces to ``peer`` still queued here (not yet in the kernel's socket buffer)."""
        return sum(len(c.outq) for c in self._peers[peer].conns)

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
            self._bytes += n
            self._partial = True
        return view[:nbytes]

    def recv_release(self, peer: int) -> None:
        """Move to the next piece (on the next socket)."""
        p = self._peers[peer]
        p.filled = 0
        p.recv_count += 1

    def check_peers(self, peers: Sequence[int], ctx: CallContext) -> None:
        """Without progress, look for the culprit: a closed socket, stopped heartbeats, a peer's blame.

        Bytes moved elsewhere in the job (a peer's heartbeat counter grew) count as progress: a
        rank waiting on a neighbour that waits on a slow but alive link is not stalled. A dead
        process is seen by its sockets (EOF names the rank, even one this rank is not reading from
        right now); a stopped process or a cut link by its heartbeats, so a survivor never has to
        name only the peer it waits on.
        """
        if ctx.aborted is not None and ctx.aborted.is_set():
            return
        if self._hb.moved_since(ctx.last_progress):
            ctx.progressed()
            return
        if not ctx.stalled():
            return
        for peer, p in self._peers.items():  # a closed socket of a peer this rank does not read now
            for c in p.conns:
                try:
                    if c.sock.recv(1, socket.MSG_PEEK) == b"":
                        raise self._dead(peer, None)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as exc:
                    raise self._dead(peer, exc) from exc
        self._hb.check_stall(ctx, peers)

    def idle(self, rounds: int) -> None:
        """Wait until a socket can be read, or one with queued pieces can be written (20 ms at most)."""
        if rounds < 8:
            return
        conns = [c for p in self._peers.values() for c in p.conns]
        readable = [c.sock for c in conns]
        writable = [c.sock for c in conns if c.outq]
        if readable or writable:
            wait_fds(readable, writable, 0.02)

    def close(self) -> None:
        """Flush what is queued (briefly) and close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + 1.0
        try:
            while time.monotonic() < deadline and any(
                c.outq for p in self._peers.values() for c in p.conns
            ):
                self.poll()
                time.sleep(1e-3)
        except hal.CommError:
            pass
        if self._hb.mine is None:
            self._hb.mine = (-1,)  # closed cleanly, blaming nobody
        self._hb.close()  # first: a rank says why it leaves (whom it blames) before its sockets close
        for p in self._peers.values():
            for c in p.conns:
                c.sock.close()
        self._peers.clear()
