"""Rendezvous: how the ranks of a new communicator find each other (``allgather`` of JSON values).

:class:`TcpBootstrap` is a tiny gather-and-broadcast server run by rank 0 at
``MASTER_ADDR:MASTER_PORT`` / ``HAL_STORE_ADDR`` (every rank, rank 0 included, connects to
it); :class:`MpiBootstrap` uses ``MPI.COMM_WORLD``; :class:`SoloBootstrap` is a world of one.
"""

from __future__ import annotations

import abc
import json
import socket
import struct
import threading
import time
from typing import Any

import hal

__all__ = ["Bootstrap", "MpiBootstrap", "SoloBootstrap", "TcpBootstrap"]

_LEN = struct.Struct("<I")


class Bootstrap(abc.ABC):
    """Collective exchange of small JSON values, used only while a communicator is set up."""

    rank: int
    size: int

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


def _send(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError("connection closed")
        buf += part
    return bytes(buf)


def _recv(sock: socket.socket) -> Any:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > 64 << 20:
        raise ConnectionError(f"rendezvous message of {n} bytes refused")
    return json.loads(_recv_exact(sock, n))


class _Server:
    """Rank 0's gather server, one per process and address, serving every communicator
    generation (the n-th ``init`` of each rank meets the n-th of the others)."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_server((host, port))
        self.lock = threading.Lock()
        self.conns: dict[tuple[int, int], socket.socket] = {}
        self.sizes: dict[int, int] = {}
        self.rounds: dict[tuple[int, int], dict[int, Any]] = {}
        self.thread = threading.Thread(target=self._accept, name="hal-comm-store", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="hal-comm-store-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        key = (-1, -1)
        try:
            hello = _recv(conn)
            gen, rank, size = int(hello["gen"]), int(hello["rank"]), int(hello["size"])
            key = (gen, rank)
            with self.lock:
                self.conns[key] = conn
                self.sizes[gen] = size
            while True:
                msg = _recv(conn)
                if msg.get("bye"):
                    with self.lock:
                        self.conns.pop(key, None)
                    conn.close()
                    return
                if "status" in msg:  # a rank timed out waiting: tell it who is missing
                    with self.lock:
                        got = self.rounds.get((gen, int(msg["status"])))
                        if got is not None:
                            _send(conn, {"missing": [r for r in range(size) if r not in got]})
                    continue
                rnd, value = int(msg["round"]), msg["value"]
                with self.lock:
                    got = self.rounds.setdefault((gen, rnd), {})
                    got[rank] = value
                    if len(got) == size:
                        reply = [got[r] for r in range(size)]
                        del self.rounds[(gen, rnd)]
                        # rank 0 (this process) last: once it has its reply it may exit, taking
                        # this daemon thread with it, so every other rank must have had its own
                        for (g, _r), c in sorted(self.conns.items(), key=lambda kv: -kv[0][1]):
                            if g == gen:
                                _send(c, {"values": reply})
        except (ConnectionError, OSError, ValueError, KeyError, TypeError):
            conn.close()  # garbage or a lost rank: hang up (and never leak the socket)
            gen, rank = key
            with self.lock:
                self.conns.pop(key, None)
                for (g, r), c in self.conns.items():
                    if g == gen and r != rank:
                        try:
                            _send(c, {"error": f"rank {rank} left the rendezvous", "rank": rank})
                        except OSError:
                            pass


_servers: dict[tuple[str, int], _Server] = {}
_generations: dict[tuple[str, int], int] = {}
_servers_lock = threading.Lock()


def _server(addr: str, port: int) -> None:
    with _servers_lock:
        if (addr, port) in _servers:
            return
        from hal.comm._ports import clash_error

        try:
            _servers[(addr, port)] = _Server(addr, port)
        except OSError as exc:
            clash = clash_error(exc, addr, port, "rank 0's rendezvous server")
            if clash is not None:
                raise clash from exc
            try:  # addr is not an address of this host (a name for another interface): all of them
                _servers[(addr, port)] = _Server("", port)
            except OSError as exc2:
                clash = clash_error(exc2, "", port, "rank 0's rendezvous server")
                if clash is not None:
                    raise clash from exc2
                raise hal.CommError(f"rank 0's rendezvous server cannot listen on {addr}:{port}: {exc2}", op="init") from exc2


class TcpBootstrap(Bootstrap):
    """Rendezvous through rank 0's gather server at ``addr:port``."""

    def __init__(self, rank: int, size: int, addr: str, port: int, timeout_s: float) -> None:
        self.rank = rank
        self.size = size
        self._round = 0
        if rank == 0:
            _server(addr, port)
        with _servers_lock:
            gen = _generations.get((addr, port), 0)
            _generations[(addr, port)] = gen + 1
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._sock = socket.create_connection((addr, port), timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise hal.CommError(
                        f"rank {rank}: cannot reach the rendezvous at {addr}:{port} (rank 0) within "
                        f"{timeout_s:.0f} s: {exc}",
                        op="init",
                        ranks=(0,),
                    ) from exc
                time.sleep(0.05)
        self._timeout_s = timeout_s
        self._sock.settimeout(timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.local_address = self._sock.getsockname()[0]
        _send(self._sock, {"rank": rank, "size": size, "gen": gen})

    def allgather(self, value: Any) -> list[Any]:
        """Return every rank's ``value`` (gathered and broadcast by rank 0's server)."""
        rnd = self._round
        _send(self._sock, {"round": rnd, "value": value})
        self._round += 1
        try:
            reply = _recv(self._sock)
        except TimeoutError:
            reply = self._missing(rnd)
        except (ConnectionError, OSError) as exc:
            raise hal.CommError(f"rank {self.rank}: rendezvous failed: {exc}", op="init") from exc
        if "error" in reply:
            raise hal.CommError(f"rendezvous failed: {reply['error']}", op="init", ranks=(int(reply["rank"]),))
        return list(reply["values"])

    def _missing(self, rnd: int) -> Any:
        """After a timeout, ask the server which ranks have not arrived; raise naming them."""
        try:
            _send(self._sock, {"status": rnd})
            reply = _recv(self._sock)
        except (TimeoutError, ConnectionError, OSError) as exc:
            raise hal.CommError(f"rank {self.rank}: rendezvous timed out ({exc})", op="init") from exc
        if "missing" not in reply:
            return reply  # the round completed meanwhile
        missing = tuple(reply["missing"])
        raise hal.CommError(
            f"rank {self.rank}: rendezvous timed out after {self._timeout_s:.1f} s (HAL_COMM_TIMEOUT_MS); "
            f"rank(s) {', '.join(map(str, missing))} never arrived",
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
