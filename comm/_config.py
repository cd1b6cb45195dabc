"""Environment settings of hal.comm (``HAL_COMM_*``), parsed once per communicator."""

from __future__ import annotations

import dataclasses
import os

__all__ = ["ALGORITHMS", "COLLECTIVES", "Config", "parse_algo", "parse_size"]

#: Algorithms each collective can run (the first is the fallback when nothing else applies).
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "recursive_doubling", "rabenseifner", "hierarchical"),
    "all_gather": ("ring", "recursive_doubling"),
    "reduce_scatter": ("ring",),
    "broadcast": ("tree", "scatter_allgather"),
    "reduce": ("tree", "reduce_scatter_gather"),
    "all_to_all": ("pairwise",),
    "barrier": ("all_to_all",),
    "send": ("direct",),
    "recv": ("direct",),
}
COLLECTIVES = tuple(ALGORITHMS)

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, name: str) -> int:
    """Parse ``"4K"``, ``"256M"``, ``"1048576"``, ``"64KiB"`` into bytes; raise ValueError naming ``name``."""
    raw = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    unit = raw[-1:] if raw[-1:] in _SUFFIX else ""
    number = raw[: len(raw) - len(unit)]
    try:
        value = float(number) * _SUFFIX[unit]
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a size (e.g. 4096, 4K, 256M)") from None
    if value < 0 or value != int(value):
        raise ValueError(f"{name}={text!r} must be a whole number of bytes >= 0")
    return int(value)


def _canonical(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    aliases = {
        "allreduce": "all_reduce",
        "allgather": "all_gather",
        "reducescatter": "reduce_scatter",
        "alltoall": "all_to_all",
        "bcast": "broadcast",
    }
    return aliases.get(key, key)


def parse_algo(text: str | None) -> dict[str, str]:
    """Parse ``HAL_COMM_ALGO`` (``"allreduce:ring,broadcast:tree"``) into ``{collective: algorithm}``."""
    out: dict[str, str] = {}
    if not text or not text.strip():
        return out
    for part in text.split(","):
        if not part.strip():
            continue
        if ":" not in part:
            raise ValueError(f"HAL_COMM_ALGO entry {part.strip()!r} must be COLLECTIVE:ALGORITHM (e.g. allreduce:ring)")
        coll, algo = (s.strip() for s in part.split(":", 1))
        c = _canonical(coll)
        if c not in ALGORITHMS:
            raise ValueError(f"HAL_COMM_ALGO names unknown collective {coll!r}; known: {', '.join(COLLECTIVES)}")
        a = algo.lower().replace("-", "_")
        if a not in ALGORITHMS[c]:
            raise ValueError(
                f"HAL_COMM_ALGO={text!r}: {c} has no algorithm {algo!r}; choose one of {', '.join(ALGORITHMS[c])}"
            )
        out[c] = a
    return out


@dataclasses.dataclass(frozen=True)
class Config:
    """``HAL_COMM_*`` settings."""

    timeout_s: float = 600.0
    algo: dict[str, str] = dataclasses.field(default_factory=dict)
    transport: str | None = None
    inline_bytes: int = 64 << 10

    @classmethod
    def from_env(cls, *, timeout_ms: float | None = None, transport: str | None = None) -> Config:
        """Read ``HAL_COMM_TIMEOUT_MS``, ``HAL_COMM_ALGO`` and ``HAL_COMM_TRANSPORT`` (arguments win)."""
        if timeout_ms is None:
            raw = os.environ.get("HAL_COMM_TIMEOUT_MS")
            if raw:
                try:
                    timeout_ms = float(raw)
                except ValueError:
                    raise ValueError(f"HAL_COMM_TIMEOUT_MS={raw!r} must be a number of milliseconds") from None
        if timeout_ms is not None and not timeout_ms > 0:
            raise ValueError(f"timeout_ms={timeout_ms!r} must be > 0")
        algo = parse_algo(os.environ.get("HAL_COMM_ALGO"))
        tr = transport if transport is not None else (os.environ.get("HAL_COMM_TRANSPORT") or None)
        raw_inline = os.environ.get("HAL_COMM_INLINE_BYTES")
        inline = parse_size(raw_inline, "HAL_COMM_INLINE_BYTES") if raw_inline else 64 << 10
        return cls(
            timeout_s=(timeout_ms / 1e3) if timeout_ms else 600.0, algo=algo, transport=tr, inline_bytes=inline
        )
