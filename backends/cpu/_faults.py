"""Emulated heterogeneity and injected faults for the CPU emulator's devices.

Each virtual device has a :class:`DeviceFaults` record, set from the environment when the
backend starts and changeable at run time with :func:`inject` / :func:`clear`:

- ``HAL_CPU_SPEED="1,0.25,0.25,0.25"``: relative speed per device (device ``i`` takes item
  ``i``; missing items are 1). A device of speed ``s`` takes ``1/s`` times as long per op.
- ``HAL_CPU_CONFIG=faults.json`` (a file, or the JSON text itself): per-device speed and
  faults; the format is documented in docs/backends/cpu.md ("Speed and faults").

Faults act where the work runs, on the stream's worker thread: a failed device's ops raise
(surfacing as :class:`hal.StreamError` at the next synchronize), spikes multiply an op's
time, transfers are delayed or dropped. Event marks always fire, so nothing hangs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hal import StreamError, spi
from hal.backends.cpu._worker import HostWait, Mark, Worker

if TYPE_CHECKING:
    from hal.backends.cpu._native import NativeWorker

__all__ = [
    "HOST",
    "DeviceFaults",
    "FaultyWorker",
    "Link",
    "clear",
    "clear_links",
    "configure",
    "faults",
    "inject",
    "link",
    "set_link",
]

Op = Callable[[], object]

#: Keys of a device entry in ``HAL_CPU_CONFIG`` (and keyword arguments of :func:`inject`).
FIELDS = (
    "speed",
    "fail",
    "fail_after_ops",
    "delay_ms",
    "spike_every",
    "spike_prob",
    "spike_factor",
    "transfer_delay_ms",
    "transfer_drop_every",
    "transfer_drop_prob",
)


@dataclasses.dataclass
class DeviceFaults:
    """Speed and injected faults of one emulated device, plus its counters.

    Attributes:
        speed: relative speed in (0, 1]; ops take ``1/speed`` times as long.
        fail: every op fails (the device is dead; its health probe fails).
        fail_after_ops: the device fails once it has run this many ops.
        delay_ms: extra latency of every op (a stalled device trips probe timeouts).
        spike_every, spike_prob, spike_factor: every N-th op (or with probability p) takes
            ``spike_factor`` times as long (timing spikes, e.g. 100x).
        transfer_delay_ms: extra latency of every copy that crosses the device boundary.
        transfer_drop_every, transfer_drop_prob: every N-th such copy (or with probability
            p) is dropped: nothing is written and the copy fails.
        ops, errors, spikes, transfers, dropped: counters (reported in device properties).
    """

    speed: float = 1.0
    fail: bool = False
    fail_after_ops: int | None = None
    delay_ms: float = 0.0
    spike_every: int = 0
    spike_prob: float = 0.0
    spike_factor: float = 100.0
    transfer_delay_ms: float = 0.0
    transfer_drop_every: int = 0
    transfer_drop_prob: float = 0.0
    ops: int = 0
    errors: int = 0
    spikes: int = 0
    transfers: int = 0
    dropped: int = 0
    seed: int = 0
    _rng: random.Random = dataclasses.field(default_factory=random.Random, repr=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def counters(self) -> dict[str, int]:
        """Return the counters (ops run, errors raised, spikes, transfers, dropped)."""
        return {
            "ops": self.ops,
            "errors": self.errors,
            "spikes": self.spikes,
            "transfers": self.transfers,
            "dropped": self.dropped,
        }

    def pristine(self) -> bool:
        """True when no speed change or fault is configured (ops then take the fast path)."""
        return (
            self.speed == 1.0
            and not self.fail
            and self.fail_after_ops is None
            and not self.delay_ms
            and not self.spike_every
            and not self.spike_prob
            and not self.transfer_delay_ms
            and not self.transfer_drop_every
            and not self.transfer_drop_prob
        )

    def settings(self) -> dict[str, Any]:
        """Return the current settings (the fields of a ``HAL_CPU_CONFIG`` entry)."""
        return {k: getattr(self, k) for k in FIELDS}


_table: dict[int, DeviceFaults] = {}
_table_lock = threading.Lock()

#: HOST stands for host memory in a link (copies to and from the host).
HOST = -1

#: Bumped by every change of a fault record or link (inject, clear, set_link, clear_links):
#: the native streams re-check whether their device may take the fast path only then.
epoch = 0


def _changed() -> None:
    global epoch
    epoch += 1


def fast_record(index: int) -> DeviceFaults | None:
    """Return device ``index``'s record if it has no speed change, fault or link model, else None.

    Native streams count their ops on it and run them without the fault model; any other
    state takes :meth:`FaultyWorker.submit`. Valid until :data:`epoch` changes.
    """
    rec = faults(index)
    return rec if rec.pristine() and not _links else None


@dataclasses.dataclass(frozen=True)
class Link:
    """A modelled link between two devices (or a device and the host): copies across it take
    at least ``latency_us + nbytes / bandwidth``."""

    bandwidth_gbps: float
    latency_us: float = 0.0

    def seconds(self, nbytes: int) -> float:
        """Return the modelled time of a copy of ``nbytes`` across this link."""
        return self.latency_us * 1e-6 + nbytes / (self.bandwidth_gbps * 1e9)


_links: dict[frozenset[int], Link] = {}


def set_link(a: int, b: int, *, bandwidth_gbps: float, latency_us: float = 0.0) -> Link:
    """Model the link between devices ``a`` and ``b`` (``HOST`` = -1 for host memory)."""
    for name, v in (("bandwidth_gbps", bandwidth_gbps), ("latency_us", latency_us)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"link {a} <-> {b}: {name}={v!r} must be a finite number >= 0")
    if not bandwidth_gbps > 0:
        raise ValueError(f"link {a} <-> {b}: bandwidth_gbps={bandwidth_gbps!r} must be > 0")
    bw, lat = float(bandwidth_gbps), float(latency_us)
    if a == b:
        raise ValueError(f"link {a} <-> {b}: a link joins two different ends")
    link = _links[frozenset((a, b))] = Link(bw, lat)
    _changed()
    return link


def link(a: int, b: int) -> Link | None:
    """Return the modelled link between ``a`` and ``b``, or None (copies run at memory speed)."""
    return _links.get(frozenset((a, b))) if _links else None


def clear_links() -> None:
    """Remove every link model."""
    _links.clear()
    _changed()


def _end(name: object, count: int, where: str) -> int:
    if name == "host":
        return HOST
    idx = name.removeprefix("cpu:") if isinstance(name, str) else ""
    if not idx.isdigit() or int(idx) >= count:
        raise ValueError(f"{where}: end {name!r} is not 'host' or a device of 0..{count - 1}")
    return int(idx)


def faults(index: int) -> DeviceFaults:
    """Return the fault record of emulated device ``index`` (created on first use)."""
    with _table_lock:
        rec = _table.get(index)
        if rec is None:
            rec = _table[index] = DeviceFaults()
            rec._rng.seed(index)
        return rec


def _check(name: str, value: Any, where: str) -> Any:
    if name not in FIELDS:
        raise ValueError(f"{where}: unknown fault setting {name!r} (known: {', '.join(FIELDS)})")
    if name == "fail":
        if not isinstance(value, bool):
            raise ValueError(f"{where}: fail={value!r} must be true or false")
        return value
    if name in ("fail_after_ops", "spike_every", "transfer_drop_every"):
        if value is None and name == "fail_after_ops":
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where}: {name}={value!r} must be an integer >= 0")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"{where}: {name}={value!r} must be a number")
    v = float(value)
    if name == "speed" and not 0 < v <= 1e6:
        raise ValueError(f"{where}: speed={value!r} must be > 0 (1 = full speed)")
    if name in ("spike_prob", "transfer_drop_prob") and not 0 <= v <= 1:
        raise ValueError(f"{where}: {name}={value!r} must be in [0, 1]")
    if name == "spike_factor" and v < 1:
        raise ValueError(f"{where}: spike_factor={value!r} must be >= 1")
    if name in ("delay_ms", "transfer_delay_ms") and v < 0:
        raise ValueError(f"{where}: {name}={value!r} must be >= 0")
    return v


def inject(index: int, **settings: Any) -> DeviceFaults:
    """Change the speed or faults of emulated device ``index`` now (e.g. ``fail=True``).

    Keyword arguments are the fields of :data:`FIELDS`; they apply to ops that start after
    the call. Returns the device's record. Raises ValueError naming a bad setting.
    """
    checked = {k: _check(k, v, f"inject(cpu:{index})") for k, v in settings.items()}
    rec = faults(index)
    with rec._lock:
        for k, v in checked.items():
            setattr(rec, k, v)
    _changed()
    return rec


def clear(index: int | None = None) -> None:
    """Reset device ``index`` (or every device) to full speed with no faults; counters too."""
    with _table_lock:
        keys = list(_table) if index is None else [index]
        for k in keys:
            fresh = DeviceFaults()
            fresh._rng.seed(k)
            _table[k] = fresh
    _changed()


def configure(count: int, env: Mapping[str, str] | None = None) -> None:
    """Apply ``HAL_CPU_SPEED`` and ``HAL_CPU_CONFIG`` to devices ``0..count-1`` (backend start).

    Raises:
        ValueError: a malformed speed list, config file or setting (naming it).
    """
    speeds = spi.setting("HAL_CPU_SPEED", env) or ""
    if speeds:
        items = [x.strip() for x in speeds.split(",")]
        if len(items) > count:
            raise ValueError(
                f"HAL_CPU_SPEED={speeds!r} lists {len(items)} speeds for {count} device(s)"
            )
        for i, item in enumerate(items):
            if not item:
                continue
            try:
                value = float(item)
            except ValueError:
                raise ValueError(f"HAL_CPU_SPEED={speeds!r}: {item!r} is not a number") from None
            inject(i, speed=_check("speed", value, f"HAL_CPU_SPEED={speeds!r}"))
    raw = spi.setting("HAL_CPU_CONFIG", env) or ""
    if not raw:
        return
    where = "HAL_CPU_CONFIG"
    try:
        text = raw if raw.startswith("{") else Path(raw).read_text()
        data = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"HAL_CPU_CONFIG={raw!r} is not a readable JSON file or text: {exc}"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: the top level must be an object with a 'devices' entry")
    devices = data.get("devices", {})
    unknown = set(data) - {"devices", "seed", "links"}
    if unknown or not isinstance(devices, dict):
        raise ValueError(
            f"{where}: unexpected top-level keys {sorted(unknown)} or 'devices' not an object"
        )
    clear_links()
    links = data.get("links", [])
    if not isinstance(links, list):
        raise ValueError(
            f'{where}: \'links\' must be a list of {{"between": [A, B], "bandwidth_gbps": ..}}'
        )
    parsed = []
    for k, entry in enumerate(links):
        lw = f"{where} links[{k}]"
        ends = entry.get("between") if isinstance(entry, dict) else None
        if not isinstance(ends, list) or len(ends) != 2:
            raise ValueError(
                f"{lw}: must be an object with 'between': [A, B] (device names or 'host')"
            )
        extra = set(entry) - {"between", "bandwidth_gbps", "latency_us"}
        if extra:
            raise ValueError(f"{lw}: unknown keys {sorted(extra)}")
        if "bandwidth_gbps" not in entry:
            raise ValueError(f"{lw}: 'bandwidth_gbps' is required")
        parsed.append(
            (
                _end(ends[0], count, lw),
                _end(ends[1], count, lw),
                entry["bandwidth_gbps"],
                entry.get("latency_us", 0.0),
                lw,
            )
        )
    for a, b, bw, lat, lw in parsed:
        try:
            set_link(a, b, bandwidth_gbps=bw, latency_us=lat)
        except ValueError as exc:
            raise ValueError(f"{lw}: {exc}") from None
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{where}: seed={seed!r} must be an integer")
    for key, entry in devices.items():
        idx = key.removeprefix("cpu:")
        if not idx.isdigit() or int(idx) >= count:
            raise ValueError(f"{where}: device {key!r} is not one of 0..{count - 1}")
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: device {key!r} must map to an object of settings")
        rec = inject(int(idx), **entry)
        rec._rng.seed(seed * 1_000_003 + int(idx))


class FaultyWorker:
    """A stream :class:`Worker` whose ops pass through the device's :class:`DeviceFaults`."""

    def __init__(self, worker: Worker | NativeWorker, index: int) -> None:
        self._worker = worker
        self._index = index
        self.label = worker.label
        self.device = worker.device

    def submit(
        self,
        op: Op,
        *,
        transfer: bool = False,
        inline: bool = False,
        peer: int | None = None,
        nbytes: int = 0,
    ) -> None:
        """Queue ``op`` (a copy across the device boundary when ``transfer``).

        ``inline`` is passed on to :meth:`Worker.submit` when the device has no speed change
        or fault configured (a faulted op always runs on the worker thread). ``peer`` (a device
        index, or ``HOST``) and ``nbytes`` describe a copy, for the link model.
        """
        owner = getattr(op, "__self__", None)
        if isinstance(
            owner, (Mark, threading.Event, HostWait)
        ):  # event marks and waits: never faulted
            self._worker.submit(op)
            return
        rec = faults(self._index)
        lk = link(self._index, peer) if peer is not None else None
        if lk is not None:
            inner = op

            def op() -> object:
                t0 = time.perf_counter()
                out = inner()
                rest = lk.seconds(nbytes) - (time.perf_counter() - t0)
                if rest > 0:
                    time.sleep(rest)
                return out

            if rec.pristine():
                with rec._lock:
                    rec.ops += 1
                    rec.transfers += transfer
                self._worker.submit(op)
                return
        if rec.pristine():
            with rec._lock:
                rec.ops += 1
                rec.transfers += transfer
            self._worker.submit(op, inline=inline)
            return
        label = self.label
        device = self.device

        def run() -> None:
            with rec._lock:
                rec.ops += 1
                dead = rec.fail or (rec.fail_after_ops is not None and rec.ops > rec.fail_after_ops)
                spike = (rec.spike_every > 0 and rec.ops % rec.spike_every == 0) or (
                    rec.spike_prob > 0 and rec._rng.random() < rec.spike_prob
                )
                drop = transfer and (
                    (
                        rec.transfer_drop_every > 0
                        and (rec.transfers + 1) % rec.transfer_drop_every == 0
                    )
                    or (rec.transfer_drop_prob > 0 and rec._rng.random() < rec.transfer_drop_prob)
                )
                if transfer:
                    rec.transfers += 1
                if dead or drop:
                    rec.errors += 1
                if drop:
                    rec.dropped += 1
                if spike:
                    rec.spikes += 1
                speed, factor = rec.speed, rec.spike_factor
                delay = rec.delay_ms + (rec.transfer_delay_ms if transfer else 0.0)
            if delay:
                time.sleep(delay / 1e3)
            if dead:
                raise StreamError(
                    f"injected fault: device {device} failed (on {label})", device=device
                )
            if drop:
                raise StreamError(f"injected fault: transfer dropped on {label}", device=device)
            t0 = time.perf_counter()
            op()
            stretch = (1.0 / speed) * (factor if spike else 1.0)
            if stretch > 1.0:
                time.sleep((time.perf_counter() - t0) * (stretch - 1.0))

        self._worker.submit(run)

    def synchronize(self) -> None:
        """Wait for the queued ops; raise the first failure."""
        self._worker.synchronize()

    def idle(self) -> bool:
        """True when every queued op has completed."""
        return self._worker.idle()

    def close(self) -> None:
        """Finish queued work and stop the thread."""
        self._worker.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)  # the wrapped Worker's other attributes
