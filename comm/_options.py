"""Settings of hal.comm as an options object: :class:`CommOptions` (``hal.comm.init(options=...)``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, final

from hal.spi import Options, env_field

__all__ = ["CommOptions"]


@final
@dataclasses.dataclass(frozen=True)
class CommOptions(Options):
    """Settings of a communicator; a field left None takes its environment variable, then the default.

    Pass one to :func:`hal.comm.init` or :func:`hal.comm.create` (``options=``): a field given in
    code wins over the environment, field by field (code > environment > default). Every rank
    must agree on ``transport``, ``algo`` and ``provider`` (``init`` checks).

    Attributes:
        timeout_ms: progress timeout of a collective, in milliseconds (``HAL_COMM_TIMEOUT_MS``;
            default 10 minutes).
        transport: ``shm``, ``tcp``, ``mpi``, ``ucx`` or a plugin's (``HAL_COMM_TRANSPORT``;
            default: shared memory on one host, else TCP).
        algo: the algorithm per collective, as ``"allreduce:ring,broadcast:tree"`` or a mapping
            ``{"all_reduce": "ring"}`` (``HAL_COMM_ALGO``; default: the planner chooses).
        inline_bytes: messages up to this size travel inline with the control message
            (``HAL_COMM_INLINE_BYTES``; default 64K).
        provider: the collective provider (``generic``, ``mpi``, ``nccl`` or a plugin's;
            ``HAL_COMM_PROVIDER``; default: the first one every rank can use).
        init_timeout_ms: how long :func:`hal.comm.init` waits for the other ranks to arrive and
            connect (the rendezvous and the transport's set-up), in milliseconds
            (``HAL_COMM_INIT_TIMEOUT_MS``; default: the larger of 60 s and ``timeout_ms``), so a
            short collective timeout does not fail ranks that start seconds apart.
    """

    timeout_ms: float | None = env_field("HAL_COMM_TIMEOUT_MS")
    transport: str | None = env_field("HAL_COMM_TRANSPORT")
    algo: str | Mapping[str, str] | None = env_field("HAL_COMM_ALGO")
    inline_bytes: int | None = env_field("HAL_COMM_INLINE_BYTES")
    provider: str | None = env_field("HAL_COMM_PROVIDER")
    init_timeout_ms: float | None = env_field("HAL_COMM_INIT_TIMEOUT_MS")

    def __post_init__(self) -> None:
        algo: Any = self.algo
        if isinstance(algo, Mapping):  # the mapping form: the same text as HAL_COMM_ALGO
            object.__setattr__(self, "algo", ",".join(f"{k}:{v}" for k, v in algo.items()))
