"""MPI transport: pieces travel with ``MPI_Isend``/``MPI_Irecv`` of mpi4py (processes started by mpiexec)."""

from __future__ import annotations

import collections
import time
from typing import Any

import hal
from hal.comm._transport import StagedTransport, World
from hal.spi import setting

__all__ = ["MpiTransport"]

_TAG = 0x4A1


class MpiTransport(StagedTransport):
    """Host-staged pieces over ``MPI.COMM_WORLD`` (for clusters that already run MPI)."""

    name = "mpi"
    alpha_s = 200e-6
    beta_s_per_byte = 1 / 3e9
    path = "host-mpi"

    @classmethod
    def missing(cls) -> str | None:
        """Return why not when mpi4py is not installed (found without importing it: that starts MPI)."""
        import importlib.util

        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed; pip install 'hal-sdk[mpi]'"
        return None

    @classmethod
    def unusable(cls, world: World) -> str | None:
        """Refuse unless the ranks were started by an MPI launcher with mpi4py installed."""
        try:
            from mpi4py import MPI
        except ImportError as exc:
            return f"mpi4py is not importable ({exc}); pip install 'hal-sdk[mpi]'"
        if MPI.COMM_WORLD.Get_size() != world.size:
            return (
                f"MPI.COMM_WORLD has {MPI.COMM_WORLD.Get_size()} rank(s) but the communicator has "
                f"{world.size}: start the ranks with mpiexec"
            )
        return None

    def __init__(self, world: World) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD.Dup()
        if self._comm.Get_rank() != world.rank:
            raise hal.CommError(
                f"MPI rank {self._comm.Get_rank()} differs from the communicator rank {world.rank}",
                op="init",
            )
        self._chunk = int(setting("HAL_COMM_CHUNK_BYTES", default=1 << 20)) // 64 * 64
        self._pool: list[bytearray] = []
        self._sends: dict[int, collections.deque[tuple[Any, bytearray]]] = collections.defaultdict(
            collections.deque
        )
        self._recv: dict[int, tuple[Any, bytearray]] = {}
        self._closed = False

    @property
    def chunk_bytes(self) -> int:
        """Bytes per piece."""
        return self._chunk

    def _buf(self) -> bytearray:
        return self._pool.pop() if self._pool else bytearray(self._chunk)

    def send_space(self, peer: int) -> memoryview | None:
        """Return a staging buffer unless 4 pieces to ``peer`` are still in flight."""
        if len(self._sends[peer]) >= 4:
            return None
        self._staged = self._buf()
        return memoryview(self._staged)

    def send_commit(self, peer: int, nbytes: int) -> None:
        """Start ``MPI_Isend`` of the staged piece."""
        buf = self._staged
        req = self._comm.Isend([memoryview(buf)[:nbytes], self._mpi.BYTE], dest=peer, tag=_TAG)
        self._sends[peer].append((req, buf))

    def poll(self) -> bool:
        """Retire completed sends."""
        moved = False
        for q in self._sends.values():
            while q and q[0][0].Test():
                self._pool.append(q.popleft()[1])
                moved = True
        return moved

    def unsent(self, peer: int) -> int:
        """Pieces to ``peer`` whose ``MPI_Isend`` has not completed (as of the last :meth:`poll`)."""
        return len(self._sends[peer])

    def recv_data(self, peer: int, nbytes: int) -> memoryview | None:
        """Post (once) and test an ``MPI_Irecv`` for the next piece from ``peer``."""
        if peer not in self._recv:
            buf = self._buf()
            req = self._comm.Irecv(
                [memoryview(buf)[:nbytes], self._mpi.BYTE], source=peer, tag=_TAG
            )
            self._recv[peer] = (req, buf)
        req, buf = self._recv[peer]
        if not req.Test():
            return None
        return memoryview(buf)[:nbytes]

    def recv_release(self, peer: int) -> None:
        """Recycle the piece's buffer."""
        _req, buf = self._recv.pop(peer)
        self._pool.append(buf)

    def close(self) -> None:
        """Let outstanding sends finish (1 s at most), cancel the rest, free the communicator. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + 1.0
        for q in self._sends.values():  # a peer that failed may never receive: do not wait forever
            for req, _buf in q:
                while not req.Test():
                    if time.monotonic() > deadline:
                        req.Cancel()
                        break
                    time.sleep(1e-3)
        self._sends.clear()
        for req, _buf in self._recv.values():
            req.Cancel()
        self._recv.clear()
        self._comm.Free()
