"""Performance models: per-(op, device, size-bucket) run-time history and link bandwidth.

Like StarPU's history-based models: an estimate is the robust center (median, or a
trimmed mean) of the last samples once ``min_samples`` exist. Until then it is derived:
from the same op on other calibrated devices scaled by capability scores, else from the
op's size bucket on this device, else from the bytes and the device's capability score.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import socket
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import hal
from hal.spi import setting

__all__ = ["Links", "PerfModel", "capability_score", "size_bucket"]


def size_bucket(nbytes: int) -> int:
    """Return the power-of-two size bucket of ``nbytes`` (0 for 0 or 1 byte)."""
    if type(nbytes) is int:
        return nbytes.bit_length() - 1 if nbytes > 1 else 0
    return max(int(nbytes), 1).bit_length() - 1


def capability_score(device: hal.Device) -> float:
    """Return a relative speed guess from device properties (used until calibrated).

    The product of the reported ``speed`` (the CPU emulator's speed factor) and
    ``compute_units`` (OpenCL), each 1 when absent.
    """
    try:
        props = device.properties()
    except Exception:  # noqa: BLE001 - a broken device scores lowest
        return 1e-3
    score = 1.0
    for key in ("speed", "compute_units"):
        v = props.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            score *= float(v)
    return score


class PerfModel:
    """Run-time history keyed by (op, device, size bucket), with robust estimates.

    Args:
        min_samples: samples needed before the history is trusted for a key.
        window: samples kept per key (the latest).
        estimator: ``"median"`` or ``"trimmed"`` (mean without the top and bottom 20%).
        default_rate: bytes per second assumed for an op never seen anywhere.
        explore_after: a device whose history of a key got no sample while this many
            samples of the key arrived from other devices is *stale*: the EFT policy
            tries it again (one task), so an unlucky history cannot exile a device.
    """

    def __init__(
        self,
        *,
        min_samples: int = 5,
        window: int = 32,
        estimator: str = "median",
        default_rate: float = 2e9,
        explore_after: int = 32,
    ) -> None:
        if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
            raise ValueError(f"min_samples={min_samples!r} must be an integer >= 1")
        if isinstance(window, bool) or not isinstance(window, int) or window < min_samples:
            raise ValueError(f"window={window!r} must be an integer >= min_samples ({min_samples})")
        if estimator not in ("median", "trimmed"):
            raise ValueError(f"estimator={estimator!r} must be 'median' or 'trimmed'")
        self.min_samples = min_samples
        self.window = window
        self.estimator = estimator
        self.default_rate = default_rate
        self.explore_after = explore_after
        self._count: dict[tuple[str, int], int] = collections.Counter()
        self._last: dict[tuple[str, str, int], int] = {}
        self._hist: dict[tuple[str, str, int], collections.deque[float]] = {}
        #: the keys of ``_hist`` by op: a derived estimate scans one op's keys, not all history
        self._by_op: dict[str, dict[tuple[str, int], collections.deque[float]]] = {}
        #: incremental estimates: the robust center of a key, recomputed only after its window
        #: changed by a quarter (a median of 32 samples moves little with one more); derived
        #: estimates cached until a sample of the op arrives
        self._centers: dict[tuple[str, str, int], tuple[int, float]] = {}
        self._seen: dict[tuple[str, str, int], int] = collections.Counter()
        self._derived: dict[tuple[str, str, int], tuple[float, bool]] = {}
        self._scores: dict[str, float] = {}
        #: (op, bucket) -> (count, devices): none of these devices is stale while the key's sample
        #: count stays below ``count`` (counts and last-seen marks only grow)
        self._fresh: dict[tuple[str, int], tuple[int, list[hal.Device]]] = {}
        self._lock = threading.Lock()
        #: bumped whenever an :meth:`estimate` answer may have changed (a calibration step, a
        #: robust center due for recomputation, derived estimates dropped): callers may keep an
        #: estimate while the version holds (the scheduler's placement path does)
        self.version = 0

    def observe(self, op: str, device: hal.Device | str, nbytes: int, seconds: float) -> None:
        """Add one measured run time."""
        if type(nbytes) is int:  # size_bucket(nbytes), inlined
            b = nbytes.bit_length() - 1 if nbytes > 1 else 0
        else:
            b = size_bucket(nbytes)
        key = (op, device if type(device) is str else str(device), b)
        with self._lock:
            dq = self._hist.get(key)
            if dq is None:
                dq = self._hist[key] = collections.deque(maxlen=self.window)
                self._by_op.setdefault(op, {})[(key[1], b)] = dq
            dq.append(seconds if type(seconds) is float else float(seconds))
            seen = self._seen[key] = self._seen[key] + 1
            n = len(dq)
            if n <= self.min_samples:  # a key got (closer to) calibrated: derived estimates move
                self._derived.clear()
                self.version += 1
            else:
                if self._derived:
                    gone = [k for k in self._derived if k[0] == op]
                    for k in gone:
                        del self._derived[k]
                    if gone:
                        self.version += 1
                cached = self._centers.get(key)
                if cached is None or seen - cached[0] >= (n >> 2 or 1):  # max(1, n // 4)
                    self.version += 1  # the next estimate recomputes this key's center
            ck = (op, b)
            self._last[key] = self._count[ck] = self._count[ck] + 1

    def stale(self, op: str, device: hal.Device | str, nbytes: int) -> bool:
        """True if ``device`` should measure this key again: it has no sample while other
        devices have some (never tried), or none for ``explore_after`` samples elsewhere."""
        b = size_bucket(nbytes)
        # two dict reads, atomic under the GIL: no lock on the placement path (a sample that
        # lands meanwhile only moves the answer as it would a moment later)
        last = self._last.get((op, str(device), b))
        count = self._count.get((op, b), 0)
        if last is None:
            return count >= 1
        return count - last >= self.explore_after

    def first_stale(self, op: str, devices: Sequence[hal.Device], nbytes: int) -> hal.Device | None:
        """Return the first of ``devices`` that is :meth:`stale` for this key, or None (one pass)."""
        if type(nbytes) is int:  # size_bucket(nbytes), inlined
            b = nbytes.bit_length() - 1 if nbytes > 1 else 0
        else:
            b = size_bucket(nbytes)
        count = self._count.get((op, b), 0)
        if not count:
            return None  # no sample anywhere yet: nothing is stale
        fresh = self._fresh.get((op, b))
        if fresh is not None and count < fresh[0] and fresh[1] == devices:
            return None  # the same devices, none stale until the count reaches fresh[0]
        last = self._last
        after = self.explore_after
        oldest = count
        for d in devices:
            seen = last.get((op, str(d), b))
            if seen is None or count - seen >= after:
                return d
            if seen < oldest:
                oldest = seen
        if len(self._fresh) > 4096:
            self._fresh.clear()
        self._fresh[(op, b)] = (oldest + after, list(devices))
        return None

    def touch(self, op: str, device: hal.Device | str, nbytes: int) -> None:
        """Note that ``device`` was given this key to explore (it is not stale any more)."""
        b = size_bucket(nbytes)
        with self._lock:
            self._last[(op, str(device), b)] = self._count[(op, b)]

    def samples(self, op: str, device: hal.Device | str, nbytes: int) -> list[float]:
        """Return the stored samples of a key."""
        with self._lock:
            return list(self._hist.get((op, str(device), size_bucket(nbytes)), ()))

    def _center(self, xs: list[float]) -> float:
        if self.estimator == "median":
            return float(statistics.median(xs))
        xs = sorted(xs)
        cut = int(len(xs) * 0.2)
        core = xs[cut : len(xs) - cut] or xs
        return sum(core) / len(core)

    def score(self, device: hal.Device) -> float:
        """Return the (cached) capability score of ``device``."""
        key = str(device)
        s = self._scores.get(key)
        if s is None:
            s = self._scores[key] = capability_score(device)
        return s

    def calibrated(self, op: str, device: hal.Device | str, nbytes: int) -> bool:
        """True once a key has ``min_samples`` samples."""
        return len(self.samples(op, device, nbytes)) >= self.min_samples

    def estimate(self, op: str, device: hal.Device, nbytes: int) -> tuple[float, bool]:
        """Return ``(seconds, calibrated)`` for ``op`` on ``device`` at ``nbytes`` input bytes."""
        bucket = size_bucket(nbytes)
        dev = str(device)
        key = (op, dev, bucket)
        cached = self._centers.get(key)
        if cached is not None:  # the placement path: a calibrated key, read without the lock
            dq = self._hist.get(key)
            if dq is not None and self._seen.get(key, 0) - cached[0] < max(1, len(dq) // 4):
                return cached[1], True
        with self._lock:
            dq = self._hist.get(key)
            if dq is not None and len(dq) >= self.min_samples:
                seen = self._seen[key]
                cached = self._centers.get(key)
                if cached is not None and seen - cached[0] < max(1, len(dq) // 4):
                    return cached[1], True
                center = self._center(list(dq))
                self._centers[key] = (seen, center)
                return center, True
            hit = self._derived.get(key)
            if hit is not None:
                return hit
            keys = self._by_op.get(op, {})
            others = [
                (d, list(v))
                for (d, b), v in keys.items()
                if b == bucket and d != dev and len(v) >= self.min_samples
            ]
            sizes = [
                (b, list(v))
                for (d, b), v in keys.items()
                if d == dev and len(v) >= self.min_samples
            ]
        value = self._derive(op, device, nbytes, bucket, others, sizes)
        with self._lock:
            self._derived[key] = value
        return value

    def _derive(
        self,
        op: str,
        device: hal.Device,
        nbytes: int,
        bucket: int,
        others: list[tuple[str, list[float]]],
        sizes: list[tuple[int, list[float]]],
    ) -> tuple[float, bool]:
        mine = self.score(device)
        if others:  # the same work measured elsewhere, scaled by capability
            guesses = [self._center(v) * self._scores.get(d, 1.0) / mine for d, v in others]
            return float(statistics.median(guesses)), False
        if sizes:  # this device, nearest calibrated size, scaled linearly
            b, v = min(sizes, key=lambda item: abs(item[0] - bucket))
            return self._center(v) * 2.0 ** (bucket - b), False
        return 1e-4 + max(nbytes, 1) / (self.default_rate * mine), False


class Links:
    """Measured bandwidth and latency between devices (hal.copy), cached per pair.

    Args:
        probe_bytes: bytes copied to measure a pair.
        fixed: ``{(src, dst): bytes_per_second}`` overrides.
        topology: a ``hal topo --dump`` file whose P2P matrix (this host's) gives the pairs
            it lists; by default ``HAL_TOPO_FILE`` when set. Other pairs are measured.
    """

    def __init__(
        self,
        *,
        probe_bytes: int = 1 << 22,
        fixed: dict[tuple[str, str], float] | None = None,
        topology: str | os.PathLike[str] | None = None,
    ) -> None:
        self.probe_bytes = probe_bytes
        self._bw: dict[tuple[str, str], tuple[float, float]] = {}
        path = topology if topology is not None else setting("HAL_TOPO_FILE")
        if path:
            self._bw.update(_from_topology(path))
        for (a, b), bw in (fixed or {}).items():
            self._bw[(a, b)] = (float(bw), 0.0)
        self._lock = threading.Lock()
        self._measuring: set[tuple[str, str]] = set()

    def measure(self, src: hal.Device, dst: hal.Device) -> tuple[float, float]:
        """Return ``(bytes_per_second, latency_s)`` of copies ``src -> dst``, measured once."""
        key = (str(src), str(dst))
        with self._lock:
            got = self._bw.get(key)
        if got is not None:
            return got
        try:
            with hal.Tracer.muted():  # measurements stay off the timeline
                got = _measure(src, dst, self.probe_bytes)
        except hal.HalError:
            got = (1.0, 1.0)  # unreachable or failing: as good as no link
        with self._lock:
            self._bw[key] = got
        return got

    def guess(self, src: hal.Device, dst: hal.Device) -> tuple[float, float]:
        """Return the measured figures of a pair, else a default while measuring it in the
        background (placement never waits for a measurement)."""
        key = (str(src), str(dst))
        with self._lock:
            got = self._bw.get(key)
            if got is None and key not in self._measuring:
                self._measuring.add(key)
                threading.Thread(target=self.measure, args=(src, dst), daemon=True).start()
        if got is not None:
            return got
        peer = src.backend == dst.backend
        return (8e9 if peer else 2e9), (2e-5 if peer else 1e-4)

    def cost(self, src: hal.Device, dst: hal.Device, nbytes: int) -> float:
        """Return the estimated seconds to move ``nbytes`` from ``src`` to ``dst`` (0 if same)."""
        if nbytes <= 0 or src == dst:
            return 0.0
        bw, lat = self.guess(src, dst)
        return lat + nbytes / bw

    def table(self) -> dict[str, dict[str, float]]:
        """Return the measured pairs: ``{"src->dst": {"bandwidth": B/s, "latency": s}}``."""
        with self._lock:
            return {
                f"{a}->{b}": {"bandwidth": bw, "latency": lat}
                for (a, b), (bw, lat) in self._bw.items()
            }


def _from_topology(path: str | os.PathLike[str]) -> dict[tuple[str, str], tuple[float, float]]:
    """Read the P2P matrix of this host from a ``hal topo --dump`` file (docs/topology.md).

    Returns ``{(src, dst): (bytes_per_second, latency_s)}``; an unreadable or malformed file
    gives an empty dict (the pairs are then measured), logged at debug level.
    """
    try:
        data = json.loads(Path(path).read_text())
        hosts = [h for h in data["hosts"] if isinstance(h.get("devices"), list)]
        mine = [h for h in hosts if h.get("name") == socket.gethostname()] or hosts[:1]
        out = {}
        for h in mine:
            names = h["devices"]
            for e in h.get("p2p", ()):
                bw, lat = float(e["bandwidth_gbps"]) * 1e9, float(e["latency_us"]) / 1e6
                if bw > 0 and lat >= 0:
                    out[(str(names[e["src"]]), str(names[e["dst"]]))] = (bw, lat)
        return out
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        logging.getLogger("hal.sched").debug(
            "HAL_TOPO_FILE=%s not used for link costs: %s", path, exc
        )
        return {}


def _measure(src: hal.Device, dst: hal.Device, nbytes: int) -> tuple[float, float]:
    stream = dst.create_stream()
    a = hal.asarray(np.zeros(nbytes, np.uint8), device=src)
    b = dst.alloc(nbytes)
    small = 64

    def timed(n: int) -> float:
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            hal.copy(b, a, stream=stream, nbytes=n)
            stream.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    try:
        lat = timed(small)
        big = timed(nbytes)
    finally:
        stream.close()
        a.close()
        b.close()
    return nbytes / max(big - lat, 1e-9), lat
