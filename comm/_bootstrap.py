"""Rendezvous: how the ranks of a new communicator find each other (``allgather`` of JSON values).

:class:`TcpBootstrap` is a tiny gather-and-broadcast server run by rank 0 at
``MASTER_ADDR:MASTER_PORT`` / ``HAL_STORE_ADDR`` (every rank, rank 0 included, connects to
it); :class:`MpiBootstrap` uses ``MPI.COMM_WORLD``; :class:`SoloBootstrap` is a world of one.

The server listens on exactly the address asked for (IPv4 or IPv6; ``HAL_COMM_IFNAME``'s
interface when that address is not one of this host's), never on every interface. Each client
proves it holds the job's secret (``HAL_COMM_SECRET``, docs/security.md) in a challenge-response
hello before it may claim a rank; a rank outside the world, a second claim of a rank while the
world is incomplete (the whole generation then fails, every rank told by whom), a late-comer to
a complete world (refused alone), a malformed or
oversized message, or a client silent during its hello is answered by closing that connection.
At most 32 connections may be in their hello at once, 8 from one address (the oldest from the
busiest address is dropped for a newer one), so a flood of idle connections cannot hold threads
or keep the real ranks out.
"""

from __future__ import annotations

import abc
import collections
import errno
import json
import logging
import socket
import struct
import threading
import time
from typing import Any

import hal
from hal.comm._auth import (
    Keys,
    is_loopback,
    local_secret,
    local_secret_dir,
    local_secret_path,
    mismatch_hint,
    new_nonce,
    warn_unauthenticated,
)
from hal.comm._config import job_secret
from hal.spi import setting

__all__ = ["Bootstrap", "MpiBootstrap", "SoloBootstrap", "TcpBootstrap"]

_LEN = struct.Struct("<I")
_log = logging.getLogger("hal.comm")


class Bootstrap(abc.ABC):
    """Collective exchange of small JSON values, used only while a communicator is set up."""

    rank: int
    size: int
    #: the job's secret, which the transports' hellos and heartbeats prove they know (None: none)
    secret: bytes | None = None

    @abc.abstractmethod
    def allgather(self, value: Any) -> list[Any]:
        """Return every rank's ``value``, in rank order."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release what the rendezvous holds. Idempotent."""


class SoloBootstrap(Bootstrap):
    """A world of one rank."""

    rank = 0
    size = 1

    def allgather(self, value: Any) -> list[Any]:
        """Return ``[value]``."""
        return [value]


class MpiBootstrap(Bootstrap):
    """Rendezvous over ``mpi4py.MPI.COMM_WORLD`` (the process was started by mpiexec)."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self._comm = MPI.COMM_WORLD
        self.rank = int(self._comm.Get_rank())
        self.size = int(self._comm.Get_size())

    def allgather(self, value: Any) -> list[Any]:
        """Return every rank's ``value`` (``MPI_Allgather`` of the JSON text)."""
        return [json.loads(v) for v in self._comm.allgather(json.dumps(value))]


_PROTO = "hal-rdzv-1"
_HELLO_LIMIT = 4096  # bytes of a message before the client proved the secret
_MSG_LIMIT = 16 << 20  # bytes of a message from an authenticated rank
_HANDSHAKE_S = 10.0  # a connection must finish its hello within this
_IO_S = 30.0  # an authenticated rank must finish a message it started within this
_MAX_PENDING = 32  # connections in their hello at once; beyond, the oldest is dropped
_MAX_PENDING_PER_SOURCE = (
    8  # ... and at most this many from one address (a flood evicts only itself)
)
_AUTH_LOG_MAX = 8  # refusals for authentication logged per server
_ACCEPT_RETRY = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class _Refused(Exception):
    """A client broke the protocol: hang up on it."""


class _Retry(Exception):
    """The rendezvous hung up during the hello (it was busy or not ready): connect again."""


def _send(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int, *, idle_ok: bool = False) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            part = sock.recv(n - len(buf))
        except TimeoutError:
            if idle_ok and not buf:
                continue  # no message started: an authenticated rank may stay quiet for long
            raise
        if not part:
            raise ConnectionError("connection closed")
        buf += part
    return bytes(buf)


def _recv(sock: socket.socket, limit: int = _MSG_LIMIT, *, idle_ok: bool = False) -> Any:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size, idle_ok=idle_ok))
    if n > limit:
        raise ConnectionError(f"rendezvous message of {n} bytes refused (at most {limit} here)")
    return json.loads(_recv_exact(sock, n))


def _int(msg: Any, key: str, lo: int = 0, hi: int = 1 << 31) -> int:
    value = msg.get(key) if isinstance(msg, dict) else None
    if type(value) is not int or not lo <= value < hi:
        raise _Refused(f"{key}={value!r} is not an integer in {lo}..{hi - 1}")
    return value


def _hexbytes(msg: Any, key: str, n: int) -> bytes | None:
    value = msg.get(key) if isinstance(msg, dict) else None
    if not isinstance(value, str) or len(value) != 2 * n:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def _claim(gen: int, rank: int, size: int) -> bytes:
    return struct.pack("<qqq", gen, rank, size)


def _where(peer: Any) -> str:
    try:
        host, port = peer[0], peer[1]
    except (TypeError, IndexError):
        return str(peer)
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    """Bind exactly ``host`` (every address it resolves to is tried, v4 or v6; never all); not listening yet."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise OSError(errno.EADDRNOTAVAIL, f"{host!r} does not resolve ({exc})") from None
    last: OSError = OSError(errno.EADDRNOTAVAIL, f"{host!r} has no address")
    for family, _type, _proto, _name, sockaddr in infos:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked on it, which closes it
    except OSError:
        pass


class _Server:
    """Rank 0's gather server, one per process and address, serving every communicator
    generation (the n-th ``init`` of each rank meets the n-th of the others)."""

    def __init__(self, host: str, port: int, secret: bytes | None) -> None:
        self.sock = _bind(host, port)
        if secret is None and is_loopback(
            host
        ):  # a same-host job given no secret: one only this user reads
            secret = local_secret(port, create=True)
        self.secret = secret
        self.keys = Keys(secret)
        self.sock.listen(128)  # only now: a rank that connects finds the secret file written
        self.lock = threading.Lock()
        self.conns: dict[tuple[int, int], socket.socket] = {}
        self.sizes: dict[int, int] = {}
        self.rounds: dict[tuple[int, int], dict[int, Any]] = {}
        self.claims: dict[tuple[int, int], str] = {}  # (gen, rank) -> where the claim came from
        self.failed: dict[int, tuple[str, int]] = {}  # gen -> (why, rank): a duplicate claim
        self.lost: dict[int, list[int]] = {}  # gen -> the ranks that never arrived (a rank gave up)
        self.complete: set[int] = (
            set()
        )  # generations whose every rank has claimed: closed to late-comers
        self.pending: dict[
            socket.socket, str
        ] = {}  # connections in their hello -> source, oldest first
        self.refused: collections.deque[str] = collections.deque(maxlen=8)
        self.auth_logged = 0  # refusals for authentication logged so far (at most _AUTH_LOG_MAX)
        self.out_of_fds = 0  # times accept() found no descriptor free (EMFILE and the like)
        self.thread = threading.Thread(target=self._accept, name="hal-comm-store", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError as exc:
                if self.sock.fileno() < 0 or exc.errno in (errno.EBADF, errno.EINVAL):
                    return
                if exc.errno in _ACCEPT_RETRY:  # out of descriptors: drop the oldest hello, retry
                    self.out_of_fds += 1
                    with self.lock:
                        if self.pending:
                            self._evict(None)
                    time.sleep(0.05)
                else:  # ECONNABORTED and the like: that one client only
                    time.sleep(0.001)
                continue
            source = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            with self.lock:
                if sum(1 for h in self.pending.values() if h == source) >= _MAX_PENDING_PER_SOURCE:
                    self._evict(source)
                elif len(self.pending) >= _MAX_PENDING:
                    self._evict(None)
                self.pending[conn] = source
            try:
                threading.Thread(
                    target=self._serve,
                    args=(conn, _where(peer)),
                    name="hal-comm-store-conn",
                    daemon=True,
                ).start()
            except RuntimeError:  # no thread to be had: refuse this one, keep accepting
                with self.lock:
                    self.pending.pop(conn, None)
                conn.close()
                time.sleep(0.05)

    def _evict(self, source: str | None) -> None:
        """Drop the oldest connection in its hello from ``source`` (None: from the busiest source)."""
        if source is None:
            counts = collections.Counter(self.pending.values())
            source = counts.most_common(1)[0][0]
        for conn, h in self.pending.items():
            if h == source:
                del self.pending[conn]
                _shutdown(conn)
                return

    def _refuse(self, where: str, why: str) -> None:
        with self.lock:
            self.refused.append(f"{where} ({why})")
            logged = self.auth_logged
            if "authentication" in why:
                self.auth_logged += 1
        # say at once who was kept out, not only if init times out; a stranger's flood of failed
        # hellos logs 8 lines, not one per connection
        if "authentication" in why and logged < _AUTH_LOG_MAX:
            more = "; further refusals are not logged" if logged == _AUTH_LOG_MAX - 1 else ""
            _log.warning("hal.comm rendezvous: refused %s: %s%s", where, why, more)

    def _serve(self, conn: socket.socket, where: str) -> None:
        key: tuple[int, int] | None = None
        try:
            conn.settimeout(_HANDSHAKE_S)
            gen, rank, size = self._hello(conn, where)
            key = (gen, rank)
            conn.settimeout(_IO_S)
            self._loop(conn, gen, rank, size)
        except _Refused as exc:
            self._refuse(where, str(exc))
        except Exception as exc:  # noqa: BLE001 - garbage, nesting, a lost rank: hang up, never die
            if key is None:
                self._refuse(where, f"{type(exc).__name__}: {exc}"[:200])
        finally:
            with self.lock:
                self.pending.pop(conn, None)
                left = key is not None and self.conns.get(key) is conn
                if left and key is not None:
                    del self.conns[key]
                    gen, rank = key
                    for (g, r), c in self.conns.items():  # a lost rank: tell the others at once
                        if g == gen and r != rank:
                            try:
                                _send(
                                    c, {"error": f"rank {rank} left the rendezvous", "rank": rank}
                                )
                            except OSError:
                                pass
            conn.close()

    def _hello(self, conn: socket.socket, where: str) -> tuple[int, int, int]:
        """Challenge-response, then the claim: return ``(gen, rank, size)`` or raise."""
        hello = _recv(conn, _HELLO_LIMIT)
        if not isinstance(hello, dict) or hello.get("hal") != _PROTO:
            raise _Refused("not a hal rendezvous hello")
        gen, rank, size = _int(hello, "gen"), _int(hello, "rank"), _int(hello, "size", 1)
        nc = _hexbytes(hello, "nonce", 16)
        if nc is None:
            raise _Refused("no nonce")
        ns = new_nonce()
        claim = _claim(gen, rank, size)
        _send(conn, {"nonce": ns.hex(), "mac": self.keys.mac("rdzv-server", nc, ns, claim).hex()})
        try:
            answer = _recv(conn, _HELLO_LIMIT)
        except ConnectionError as exc:
            raise _Refused(
                f"failed authentication claiming rank {rank}: no proof of the job's secret ({exc}): "
                "a rank of another secret (an older hal says no more), or not a hal rank"
            ) from exc
        if isinstance(answer, dict) and answer.get("auth") == "failed":
            raise _Refused(
                f"claimed rank {rank}, then refused authentication: wrong or missing secret "
                f"({mismatch_hint(self.keys.authenticated)}; set the same HAL_COMM_SECRET / "
                "HAL_COMM_SECRET_FILE on every rank)"
            )
        mac = _hexbytes(answer, "mac", 32)
        if mac is None or not self.keys.verify("rdzv-client", mac, ns, nc, claim):
            _send(
                conn,
                {
                    "error": "authentication failed: this rank does not hold rank 0's job secret "
                    "(HAL_COMM_SECRET / HAL_COMM_SECRET_FILE wrong, missing or different)"
                },
            )
            raise _Refused(
                f"failed authentication claiming rank {rank}: its proof does not match this "
                "rendezvous's secret (wrong or missing HAL_COMM_SECRET / HAL_COMM_SECRET_FILE)"
            )
        with self.lock:  # every send to a registered connection happens under the lock
            if self.pending.pop(conn, None) is None:
                raise _Refused("dropped during its hello")
            why: str | None = None
            bad = rank  # the rank the refusal names: this claim's, or the one that failed the world
            if rank >= size:
                why = f"rank {rank} is outside the world of {size} ranks (0..{size - 1})"
            elif gen in self.failed:
                why, bad = self.failed[gen]
            elif gen in self.complete:  # refused without failing the ranks that are in
                why = f"late-comer claiming rank {rank} from {where}: every rank of this rendezvous is in already"
            elif self.sizes.get(gen, size) != size:
                why = f"rank {rank} claims a world of {size} ranks; the ranks before it claimed {self.sizes[gen]}"
            elif (gen, rank) in self.claims:
                first = self.claims[(gen, rank)]
                why = (
                    f"rank {rank} was claimed twice: first by {first}, then by {where} (two processes "
                    "started with the same rank, or a stranger); this rendezvous fails"
                )
                self.failed[gen] = (why, rank)
                for (g, _r), c in self.conns.items():
                    if g == gen:
                        try:
                            _send(c, {"error": why, "rank": rank})
                        except OSError:
                            pass
            if why is not None:
                try:
                    _send(conn, {"error": why, "rank": bad})
                except OSError:
                    pass
                raise _Refused(why)
            self.claims[(gen, rank)] = where
            self.conns[(gen, rank)] = conn
            self.sizes[gen] = size
            if sum(1 for g, _r in self.claims if g == gen) == size:
                self.complete.add(gen)
            _send(conn, {"ok": True})
        return gen, rank, size

    def _loop(self, conn: socket.socket, gen: int, rank: int, size: int) -> None:
        key = (gen, rank)
        next_round = 0
        while True:
            msg = _recv(conn, _MSG_LIMIT, idle_ok=True)
            if not isinstance(msg, dict):
                raise _Refused(f"rank {rank} sent a {type(msg).__name__}, not an object")
            if msg.get("bye") is True:
                with self.lock:
                    if self.conns.get(key) is conn:
                        del self.conns[key]
                return
            if "status" in msg:  # a rank timed out waiting: tell it who is missing
                rnd = _int(msg, "status")
                with self.lock:
                    got = self.rounds.get((gen, rnd))
                    if got is not None:
                        missing = [r for r in range(size) if r not in got]
                        if missing and gen not in self.failed:
                            self._give_up(gen, rank, rnd, missing)
                        _send(conn, {"missing": missing, "refused": list(self.refused)})
                continue
            rnd = _int(msg, "round")
            if rnd != next_round or "value" not in msg:
                raise _Refused(f"rank {rank} sent round {rnd}; round {next_round} was due")
            next_round += 1
            with self.lock:
                if gen in self.failed:
                    why, bad = self.failed[gen]
                    _send(conn, {"error": why, "rank": bad, "missing": self.lost.get(gen)})
                    continue
                got = self.rounds.setdefault((gen, rnd), {})
                got[rank] = msg["value"]
                if len(got) == size:
                    reply = [got[r] for r in range(size)]
                    del self.rounds[(gen, rnd)]
                    # rank 0 (this process) last: once it has its reply it may exit, taking
                    # this daemon thread with it, so every other rank must have had its own
                    for (g, _r), c in sorted(self.conns.items(), key=lambda kv: -kv[0][1]):
                        if g == gen:
                            try:
                                _send(c, {"values": reply})
                            except OSError:
                                pass  # that rank's own thread sees it gone and tells the others

    def _give_up(self, gen: int, rank: int, rnd: int, missing: list[int]) -> None:
        """``rank`` timed out in round ``rnd``: fail the generation and tell every other rank in it
        who never arrived (the rank that gave up, rank 0 perhaps, is about to leave). Under the lock."""
        why = (
            f"rank {rank} gave up waiting in round {rnd} after its init timeout (HAL_COMM_INIT_TIMEOUT_MS); "
            f"rank(s) {', '.join(map(str, missing))} never arrived"
        )
        self.failed[gen] = (why, missing[0])
        self.lost[gen] = missing
        for (g, r), c in self.conns.items():
            if g == gen and r != rank:
                try:
                    _send(c, {"error": why, "rank": missing[0], "missing": missing})
                except OSError:
                    pass


_servers: dict[tuple[str, int], _Server] = {}
_generations: dict[tuple[str, int], int] = {}
_servers_lock = threading.Lock()


def _server(addr: str, port: int, secret: bytes | None = None) -> _Server:
    with _servers_lock:
        if (addr, port) in _servers:
            return _servers[(addr, port)]
        from hal.comm._ports import clash_error

        try:
            srv = _servers[(addr, port)] = _Server(addr, port, secret)
            return srv
        except OSError as exc:
            clash = clash_error(exc, addr, port, "rank 0's rendezvous server")
            if clash is not None:
                raise clash from exc
            error = exc
        spec = setting("HAL_COMM_IFNAME")
        if error.errno == errno.EADDRNOTAVAIL and spec:  # listen on the interface asked for instead
            from hal.comm._ifaces import select_interface

            _name, local = select_interface(spec, family=None)
            try:
                srv = _servers[(addr, port)] = _Server(local, port, secret)
                return srv
            except OSError as exc2:
                clash = clash_error(exc2, local, port, "rank 0's rendezvous server")
                if clash is not None:
                    raise clash from exc2
                error = exc2
        hint = ""
        if error.errno == errno.EADDRNOTAVAIL:
            hint = (
                f"; {addr} is not an address of this host: start rank 0 on the host that MASTER_ADDR / "
                "HAL_STORE_ADDR names, or set HAL_COMM_IFNAME to the interface to listen on "
                "(hal.comm never listens on every interface)"
            )
        raise hal.CommError(
            f"rank 0's rendezvous server cannot listen on {addr}:{port}: {error.strerror or error}{hint}",
            op="init",
        ) from error


def _strip_brackets(addr: str) -> str:
    addr = addr.strip()
    return addr[1:-1] if addr.startswith("[") and addr.endswith("]") else addr


class TcpBootstrap(Bootstrap):
    """Rendezvous through rank 0's gather server at ``addr:port``.

    ``secret`` defaults to ``HAL_COMM_SECRET`` / ``HAL_COMM_SECRET_FILE``; every rank must hold
    the same one (see docs/security.md). Without one, a rendezvous on loopback uses a secret that
    rank 0 writes to a file only this user can read (:func:`hal.comm._auth.local_secret`); at any
    other address the job warns once that it is unauthenticated.
    """

    def __init__(
        self,
        rank: int,
        size: int,
        addr: str,
        port: int,
        timeout_s: float,
        *,
        secret: bytes | None = None,
    ) -> None:
        addr = _strip_brackets(addr)
        self.rank = rank
        self.size = size
        self._round = 0
        self._timeout_s = timeout_s
        self.secret = secret if secret is not None else job_secret()
        local = self._local = self.secret is None and is_loopback(
            addr
        )  # same host: a file of this user's
        if self.secret is None and not local:
            warn_unauthenticated(f"the rendezvous at {addr}:{port}")
        if rank == 0:
            srv = _server(addr, port, self.secret)
            if local:
                self.secret = srv.secret
        self._keys = Keys(self.secret)
        with _servers_lock:
            gen = _generations.get((addr, port), 0)
            _generations[(addr, port)] = gen + 1
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                sock = socket.create_connection(
                    (addr, port), timeout=max(0.1, deadline - time.monotonic())
                )
            except OSError as exc:
                why: BaseException = exc
            else:
                try:
                    if local and rank != 0:  # rank 0 wrote it before listening
                        self.secret = local_secret(port, create=False)
                        self._keys = Keys(self.secret)
                    self._hello(sock, gen, addr, port, deadline)
                    break
                except _Retry as exc:
                    sock.close()
                    why = exc
                except BaseException:
                    sock.close()
                    raise
            if time.monotonic() > deadline:
                raise hal.CommError(
                    f"rank {rank}: cannot reach the rendezvous at {addr}:{port} (rank 0) within "
                    f"{timeout_s:.1f} s (HAL_COMM_INIT_TIMEOUT_MS): {why}",
                    op="init",
                    ranks=(0,),
                ) from why
            time.sleep(0.05)
        if local and self.secret is None:  # no user-only key file: say so, never run open silently
            warn_unauthenticated(
                f"the rendezvous at {addr}:{port} (on loopback, but {local_secret_dir()} is not this "
                "user's alone, so it holds no key file)"
            )
        self._sock = sock
        self._sock.settimeout(timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.local_address = self._sock.getsockname()[0]

    def _hello(self, sock: socket.socket, gen: int, addr: str, port: int, deadline: float) -> None:
        """Prove the job's secret to the server and check its proof; raise _Retry if it hung up."""
        sock.settimeout(max(0.1, min(_HANDSHAKE_S, deadline - time.monotonic())))
        nc = new_nonce()
        claim = _claim(gen, self.rank, self.size)
        try:
            _send(
                sock,
                {
                    "hal": _PROTO,
                    "gen": gen,
                    "rank": self.rank,
                    "size": self.size,
                    "nonce": nc.hex(),
                },
            )
            challenge = _recv(sock, _HELLO_LIMIT)
        except (OSError, ValueError, RecursionError) as exc:  # busy, not ready, or not a hal server
            raise _Retry(f"the rendezvous hung up during the hello ({exc})") from exc
        if isinstance(challenge, dict) and isinstance(challenge.get("error"), str):
            raise hal.CommError(
                f"rank {self.rank}: the rendezvous refused this rank: {challenge['error']}",
                op="init",
            )
        ns, mac = _hexbytes(challenge, "nonce", 16), _hexbytes(challenge, "mac", 32)
        if ns is None or mac is None or not self._keys.verify("rdzv-server", mac, nc, ns, claim):
            try:  # tell rank 0 why this rank hangs up: it records a refusal for a secret mismatch
                _send(sock, {"auth": "failed"})
            except OSError:
                pass
            where = ""
            if self._local:
                where = f" (same host without HAL_COMM_SECRET: rank 0 keeps one in {local_secret_path(port)})"
            raise hal.CommError(
                f"rank {self.rank}: authentication failed at the rendezvous, wrong or missing secret: "
                f"whatever answers at {addr}:{port} did not prove it holds the job's secret, so this rank "
                f"refused it ({mismatch_hint(self._keys.authenticated)}; set the same HAL_COMM_SECRET / "
                f"HAL_COMM_SECRET_FILE on every rank, or something else listens there){where}",
                op="init",
                ranks=(0,),
            )
        try:
            _send(sock, {"mac": self._keys.mac("rdzv-client", ns, nc, claim).hex()})
            reply = _recv(sock, _HELLO_LIMIT)
        except (OSError, ValueError, RecursionError) as exc:
            raise _Retry(f"the rendezvous hung up during the hello ({exc})") from exc
        if isinstance(reply, dict) and isinstance(reply.get("error"), str):
            bad = reply.get("rank")
            raise hal.CommError(
                f"rank {self.rank}: the rendezvous refused this rank: {reply['error']}",
                op="init",
                ranks=(bad,) if type(bad) is int else (),
            )
        if reply != {"ok": True}:
            raise _Retry(f"unexpected answer to the hello: {str(reply)[:100]}")

    def allgather(self, value: Any) -> list[Any]:
        """Return every rank's ``value`` (gathered and broadcast by rank 0's server)."""
        rnd = self._round
        self._round += 1
        try:
            _send(self._sock, {"round": rnd, "value": value})
            reply = _recv(self._sock)
        except TimeoutError:
            reply = self._missing(rnd)
        except (OSError, ValueError, RecursionError) as exc:
            raise hal.CommError(f"rank {self.rank}: rendezvous failed: {exc}", op="init") from exc
        return self._values(reply)

    def _values(self, reply: Any) -> list[Any]:
        if isinstance(reply, dict) and isinstance(reply.get("error"), str):
            bad, lost = reply.get("rank"), reply.get("missing")
            ranks: tuple[int, ...] = (bad,) if type(bad) is int else ()
            if isinstance(lost, list) and lost:  # a rank gave up: these never arrived
                ranks = tuple(r for r in lost if type(r) is int and 0 <= r < self.size)
            raise hal.CommError(
                f"rank {self.rank}: rendezvous failed: {reply['error']}", op="init", ranks=ranks
            )
        values = reply.get("values") if isinstance(reply, dict) else None
        if not isinstance(values, list) or len(values) != self.size:
            raise hal.CommError(
                f"rank {self.rank}: malformed rendezvous reply: {str(reply)[:100]}", op="init"
            )
        return values

    def _missing(self, rnd: int) -> list[Any]:
        """After a timeout, ask the server which ranks have not arrived; raise naming them."""
        try:
            _send(self._sock, {"status": rnd})
            reply = _recv(self._sock)
        except (OSError, ValueError, RecursionError) as exc:
            raise hal.CommError(
                f"rank {self.rank}: rendezvous timed out ({exc})", op="init"
            ) from exc
        if not isinstance(reply, dict) or "missing" not in reply:
            return self._values(reply)  # the round completed meanwhile
        raw = reply["missing"]
        missing = (
            tuple(r for r in raw if type(r) is int and 0 <= r < self.size)
            if isinstance(raw, list)
            else ()
        )
        refused = reply.get("refused")
        extra = ""
        if isinstance(refused, list) and refused:
            extra = f"; the rendezvous refused {len(refused)} connection(s): {'; '.join(map(str, refused[-3:]))}"
        raise hal.CommError(
            f"rank {self.rank}: rendezvous (round {rnd}) timed out after {self._timeout_s:.1f} s "
            f"(HAL_COMM_INIT_TIMEOUT_MS); rank(s) {', '.join(map(str, missing))} never arrived{extra}",
            op="init",
            ranks=missing,
        )

    def close(self) -> None:
        """Leave the rendezvous (rank 0's server stays up for the next communicator). Idempotent."""
        if self._sock.fileno() < 0:
            return
        try:
            _send(self._sock, {"bye": True})
        except OSError:
            pass
        self._sock.close()
