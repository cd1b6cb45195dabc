"""Topology: hosts, devices per host, the P2P matrix, the links between hosts (docs/topology.md).

A :class:`Topology` is discovered (``hal topo``: this host's devices, the path of every device
pair and a measured bandwidth/latency per pair through ``hal.copy``) or loaded from the JSON
file named by ``HAL_TOPO_FILE`` (the same format ``hal topo --dump`` writes). At
``hal.comm.init`` each rank resolves its topology (:func:`resolve`); a missing, invalid or
inconsistent file falls back to the flat default (ranks grouped by their real host names) and
logs ``topology fallback: <reason>; hint: <hint>``. Every rank sends the digest of its topology
and of the planner inputs at the rendezvous; a disagreement is a ``CommError`` at init.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import socket
import stat
import time
from collections.abc import Sequence
from typing import Any

import hal
from hal.spi import setting

__all__ = [
    "FALLBACK_MARKER",
    "PATHS",
    "EnvTopology",
    "Link",
    "Pair",
    "Topology",
    "TopologyError",
    "agreement_hash",
    "discover",
    "flat",
    "host_groups",
    "load",
    "planner_key",
    "resolve",
]

_log = logging.getLogger("hal.comm")

#: The fixed marker every rank logs when it falls back to the flat default.
FALLBACK_MARKER = "topology fallback:"
#: How a device pair's copies travel (``hal.copy_path``).
PATHS = ("peer", "staged", "local")
FORMAT_VERSION = 1


class TopologyError(hal.HalError, ValueError):
    """A topology file or dict is invalid or inconsistent (the message says where)."""


@dataclasses.dataclass(frozen=True)
class Pair:
    """One entry of a host's P2P matrix: device ``src`` to device ``dst``."""

    src: int
    dst: int
    path: str
    bandwidth_gbps: float  # GB/s (1e9 bytes per second)
    latency_us: float


@dataclasses.dataclass(frozen=True)
class Link:
    """A network link between two hosts."""

    a: str
    b: str
    bandwidth_gbps: float
    latency_us: float


@dataclasses.dataclass(frozen=True)
class Topology:
    """Hosts, their devices and P2P matrices, the links between hosts, and optionally each rank's host.

    ``devices[host]`` lists device names, ``p2p[host]`` the measured pairs, ``ranks`` the host of
    each rank (empty: ranks are placed by their real host names at init).
    """

    hosts: tuple[str, ...]
    devices: dict[str, tuple[str, ...]]
    p2p: dict[str, tuple[Pair, ...]]
    links: tuple[Link, ...] = ()
    ranks: tuple[str, ...] = ()
    source: str = "discovered"

    # -- (de)serialization -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (``hal topo --dump``; ``HAL_TOPO_FILE`` reads it back)."""
        out: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "hosts": [
                {
                    "name": h,
                    "devices": list(self.devices.get(h, ())),
                    "p2p": [dataclasses.asdict(p) for p in self.p2p.get(h, ())],
                }
                for h in self.hosts
            ],
            "links": [
                {
                    "hosts": [lk.a, lk.b],
                    "bandwidth_gbps": lk.bandwidth_gbps,
                    "latency_us": lk.latency_us,
                }
                for lk in self.links
            ],
        }
        if self.ranks:
            out["ranks"] = list(self.ranks)
        return out

    @classmethod
    def from_dict(cls, data: object, *, source: str = "dict") -> Topology:
        """Validate ``data`` (the JSON form) and return the topology.

        Raises:
            TopologyError: a missing or mistyped field, an unknown host or device, a bad number.
        """
        if not isinstance(data, dict):
            raise TopologyError(f"topology must be a JSON object, not {type(data).__name__}")
        version = data.get("version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise TopologyError(
                f"topology version {version!r} is not supported (expected {FORMAT_VERSION})"
            )
        raw_hosts = data.get("hosts")
        if not isinstance(raw_hosts, list) or not raw_hosts:
            raise TopologyError("topology 'hosts' must be a non-empty list")
        hosts: list[str] = []
        devices: dict[str, tuple[str, ...]] = {}
        p2p: dict[str, tuple[Pair, ...]] = {}
        for i, h in enumerate(raw_hosts):
            if not isinstance(h, dict) or not isinstance(h.get("name"), str) or not h["name"]:
                raise TopologyError(f"hosts[{i}] must be an object with a non-empty string 'name'")
            name = h["name"]
            if name in devices:
                raise TopologyError(f"hosts[{i}]: host {name!r} is listed twice")
            devs = h.get("devices", [])
            if isinstance(devs, int) and not isinstance(devs, bool) and devs >= 0:
                devs = [f"device{k}" for k in range(devs)]  # compact form: a count
            if not isinstance(devs, list) or not all(isinstance(d, str) for d in devs):
                raise TopologyError(
                    f"hosts[{i}] ({name}): 'devices' must be a list of names or a count"
                )
            pairs = []
            for j, p in enumerate(h.get("p2p", [])):
                where = f"hosts[{i}] ({name}) p2p[{j}]"
                if not isinstance(p, dict):
                    raise TopologyError(f"{where} must be an object")
                src, dst = p.get("src"), p.get("dst")
                for key, v in (("src", src), ("dst", dst)):
                    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < len(devs):
                        raise TopologyError(
                            f"{where}: {key}={v!r} is not a device index of {name} (0..{len(devs) - 1})"
                        )
                if p.get("path") not in PATHS:
                    raise TopologyError(
                        f"{where}: path={p.get('path')!r} must be one of {', '.join(PATHS)}"
                    )
                assert isinstance(src, int) and isinstance(dst, int)
                pairs.append(
                    Pair(
                        src,
                        dst,
                        p["path"],
                        _number(p, "bandwidth_gbps", where),
                        _number(p, "latency_us", where, zero=True),
                    )
                )
            hosts.append(name)
            devices[name] = tuple(devs)
            p2p[name] = tuple(pairs)
        links = []
        for k, lk in enumerate(data.get("links", [])):
            where = f"links[{k}]"
            ends = lk.get("hosts") if isinstance(lk, dict) else None
            if not isinstance(ends, list) or len(ends) != 2:
                raise TopologyError(f"{where} must be an object with 'hosts': [A, B]")
            for e in ends:
                if e not in devices:
                    raise TopologyError(
                        f"{where}: host {e!r} is not in 'hosts' ({', '.join(hosts)})"
                    )
            links.append(
                Link(
                    ends[0],
                    ends[1],
                    _number(lk, "bandwidth_gbps", where),
                    _number(lk, "latency_us", where, zero=True),
                )
            )
        ranks = data.get("ranks", [])
        if not isinstance(ranks, list):
            raise TopologyError("'ranks' must be a list of host names (the host of each rank)")
        for r, h in enumerate(ranks):
            if h not in devices:
                raise TopologyError(
                    f"ranks[{r}]: host {h!r} is not in 'hosts' ({', '.join(hosts)})"
                )
        return cls(tuple(hosts), devices, p2p, tuple(links), tuple(ranks), source)

    def to_json(self) -> str:
        """Return the canonical JSON text (sorted keys)."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    def digest(self) -> str:
        """Return a short hash of the topology (what ranks compare at init)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # -- what the planner uses ---------------------------------------------------------------
    def inter_host(self) -> tuple[float, float] | None:
        """Return (α seconds, β seconds/byte) of the slowest described link, or None without links."""
        if not self.links:
            return None
        worst_bw = min(lk.bandwidth_gbps for lk in self.links)
        worst_lat = max(lk.latency_us for lk in self.links)
        return worst_lat * 1e-6, 1 / (worst_bw * 1e9)

    def rank_hosts(self, real_hosts: Sequence[str]) -> list[str]:
        """Return the host of each rank: ``ranks`` if given, else each rank's real host name.

        Raises:
            TopologyError: ``ranks`` has another length than the world, or a rank's real host
                is not in the topology.
        """
        if self.ranks:
            if len(self.ranks) != len(real_hosts):
                raise TopologyError(
                    f"'ranks' lists {len(self.ranks)} ranks but the world has {len(real_hosts)}"
                )
            return list(self.ranks)
        missing = sorted({h for h in real_hosts if h not in self.devices})
        if missing and self.source != "flat":
            raise TopologyError(
                f"rank host(s) {', '.join(missing)} are not in the topology ({', '.join(self.hosts)})"
            )
        return list(real_hosts)


def _number(obj: dict[str, Any], key: str, where: str, *, zero: bool = False) -> float:
    v = obj.get(key)
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or v < 0
        or (v == 0 and not zero)
    ):
        raise TopologyError(
            f"{where}: {key}={v!r} must be a finite number {'>= 0' if zero else '> 0'}"
        )
    return float(v)


#: The largest topology file read (bytes); a larger one is refused.
MAX_FILE_BYTES = 16 << 20


def load(path: str | os.PathLike[str]) -> Topology:
    """Read a topology file (the JSON that ``hal topo --dump`` writes).

    Only a regular file of at most :data:`MAX_FILE_BYTES` of UTF-8 JSON is read: a FIFO,
    a device or a directory is refused without blocking, and so is binary or too deeply
    nested content.

    Raises:
        TopologyError: the file is missing, unreadable, not a regular file, too large, not
            UTF-8, not JSON, nested too deeply, or invalid.
    """
    name = repr(os.fspath(path))
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TopologyError(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(st.st_mode)
                else "a directory"
                if stat.S_ISDIR(st.st_mode)
                else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket or special file"
            )
            raise TopologyError(f"{name} is {kind}, not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise TopologyError(
                f"{name} has {st.st_size} bytes; a topology file may have at most {MAX_FILE_BYTES}"
            )
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TopologyError(f"cannot read {name}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise TopologyError(
            f"{name} has more than {MAX_FILE_BYTES} bytes (the most a topology file may have)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopologyError(
            f"{name} is not UTF-8 text (binary? byte {exc.start} is {raw[exc.start]:#04x})"
        ) from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise TopologyError(f"{name} nests JSON arrays/objects too deeply") from None
    except ValueError as exc:
        raise TopologyError(f"{name} is not valid JSON ({exc})") from None
    return Topology.from_dict(data, source=f"file:{os.fspath(path)}")


def flat(real_hosts: Sequence[str]) -> Topology:
    """Return the flat default: the real hosts of the ranks, no P2P matrix, no link model."""
    hosts = tuple(dict.fromkeys(real_hosts))
    return Topology(hosts, {h: () for h in hosts}, {h: () for h in hosts}, (), (), "flat")


def _time_copy(dst: hal.Array, src: hal.Array, stream: hal.Stream, reps: int) -> float:
    hal.copy(dst, src, stream=stream)  # warm-up
    stream.synchronize()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        hal.copy(dst, src, stream=stream)
        stream.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def discover(
    devices: Sequence[hal.Device] | None = None, *, measure_bytes: int = 4 << 20, reps: int = 3
) -> Topology:
    """Discover this host: its devices and, per ordered device pair, path, bandwidth and latency.

    Bandwidth is measured with a ``measure_bytes`` ``hal.copy`` (best of ``reps``), latency with
    an 8-byte copy. A pair ``(i, i)`` is a copy within one device (path ``local``).
    """
    import numpy as np

    devs = list(hal.devices() if devices is None else devices)
    host = socket.gethostname()
    n = max(measure_bytes // 4, 2)
    arrays = [hal.asarray(np.zeros(n, dtype=np.float32), device=d) for d in devs]
    small = [hal.asarray(np.zeros(2, dtype=np.float32), device=d) for d in devs]
    pairs: list[Pair] = []
    try:
        for i, a in enumerate(devs):
            stream = devs[i].create_stream()
            try:
                for j in range(len(devs)):
                    path = "local" if i == j else hal.copy_path(arrays[j], arrays[i])
                    src = arrays[i]
                    dst = (
                        arrays[j]
                        if i != j
                        else hal.asarray(np.zeros(n, dtype=np.float32), device=a)
                    )
                    t_bw = _time_copy(dst, src, stream, reps)
                    t_lat = _time_copy(
                        small[j] if i != j else small[i],
                        small[i] if i != j else small[j],
                        stream,
                        reps,
                    )
                    if i == j:
                        dst.close()
                    pairs.append(
                        Pair(
                            i,
                            j,
                            path,
                            round(n * 4 / max(t_bw, 1e-9) / 1e9, 3),
                            round(t_lat * 1e6, 2),
                        )
                    )
            finally:
                stream.close()
    finally:
        for arr in arrays + small:
            arr.close()
    return Topology(
        (host,), {host: tuple(str(d) for d in devs)}, {host: tuple(pairs)}, (), (), "discovered"
    )


@dataclasses.dataclass(frozen=True)
class EnvTopology:
    """What ``HAL_TOPO_FILE`` gave this rank: a topology, or why it could not (``error``)."""

    path: str | None
    topology: Topology | None
    error: str | None

    @classmethod
    def read(cls, env: dict[str, str] | None = None) -> EnvTopology:
        """Load ``HAL_TOPO_FILE`` if set (never raises: a failure is kept in ``error``)."""
        try:
            path = setting("HAL_TOPO_FILE", env)
        except hal.ConfigError as exc:  # kept, like a file that does not load
            return cls(str(exc.value), None, str(exc))
        if path is None:
            return cls(None, None, None)
        try:
            return cls(path, load(path), None)
        except TopologyError as exc:
            return cls(path, None, str(exc))

    @property
    def key(self) -> str:
        """Return what ranks compare at the rendezvous: the topology digest, ``flat`` or ``fallback``."""
        if self.topology is not None:
            return self.topology.digest()
        return "fallback" if self.error else "flat"


def resolve(state: EnvTopology, real_hosts: Sequence[str]) -> tuple[Topology, list[str]]:
    """Return the topology and the host of every rank (what ``hal.comm.init`` uses).

    A file that could not be loaded, or does not fit the world (``ranks`` of another length, a
    rank's host missing), logs ``topology fallback: <reason>; hint: <hint>`` and gives
    :func:`flat`. No ``HAL_TOPO_FILE``: the flat default, silently.
    """
    error = state.error
    if state.topology is not None:
        try:
            return state.topology, state.topology.rank_hosts(real_hosts)
        except TopologyError as exc:
            error = f"{state.path!r} does not fit this world: {exc}"
    if error:
        _log.warning(
            "%s %s; hint: fix or regenerate it with `hal topo --dump %s`, or unset HAL_TOPO_FILE "
            "(using the flat default: ranks grouped by host name)",
            FALLBACK_MARKER,
            error,
            state.path,
        )
    return flat(real_hosts), list(real_hosts)


def host_groups(rank_hosts: Sequence[str]) -> list[list[int]]:
    """Return the ranks of each host, hosts in order of their first rank."""
    groups: dict[str, list[int]] = {}
    for r, h in enumerate(rank_hosts):
        groups.setdefault(h, []).append(r)
    return list(groups.values())


def planner_key() -> str:
    """Return a hash of the planner itself (cost constants, algorithm lists).

    hal-sdk's own version is compared in plain text by the version agreement (hal.comm._versions).
    """
    from hal.comm import _plan
    from hal.comm._config import ALGORITHMS

    blob = json.dumps([_plan.GAMMA_S_PER_BYTE, _plan.PIECE_S, ALGORITHMS], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def agreement_hash(topo: Topology, rank_hosts: Sequence[str], config: Any) -> str:
    """Return the hash of everything the planner reads (topology, rank placement, overrides)."""
    from hal.comm import _plan

    blob = json.dumps(
        [
            topo.digest(),
            list(rank_hosts),
            sorted(getattr(config, "algo", {}).items()),
            _plan.GAMMA_S_PER_BYTE,
            _plan.PIECE_S,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
