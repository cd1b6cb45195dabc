"""Device health: HEALTHY -> SUSPECT -> EVICTED with hysteresis, probes and re-admission.

Evidence comes from task outcomes (a device error counts against the device) and from a
periodic probe: a small ``hal.kernels`` kernel on a stream of the device, with a timeout,
plus the backend's error counter (``properties()["errors"]``) where it reports one.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

import hal

__all__ = ["DeviceState", "Health", "HealthConfig"]


class DeviceState(str, enum.Enum):
    """A device's health state in a scheduler."""

    HEALTHY = "healthy"
    SUSPECT = "suspect"
    EVICTED = "evicted"


@dataclasses.dataclass(frozen=True)
class HealthConfig:
    """Thresholds and probing of the health monitor.

    Attributes:
        evict_after: consecutive failures (probe or task) that evict a device.
        recover_after: consecutive successes that clear a SUSPECT device.
        readmit_after: consecutive successful probes that re-admit an EVICTED device.
        interval: seconds between probes (0 disables probing; task outcomes still count).
        timeout: seconds a probe may take before it counts as failed.
    """

    evict_after: int = 3
    recover_after: int = 3
    readmit_after: int = 5
    interval: float = 0.2
    timeout: float = 2.0

    def __post_init__(self) -> None:
        for name in ("evict_after", "recover_after", "readmit_after"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be an integer >= 1")
        if not self.interval >= 0 or not self.timeout > 0:
            raise ValueError(
                f"interval={self.interval!r} must be >= 0 and timeout={self.timeout!r} > 0"
            )


class _Track:
    __slots__ = ("errors_seen", "fails", "inflight", "last_reason", "oks", "state", "transitions")

    def __init__(self) -> None:
        self.state = DeviceState.HEALTHY
        self.fails = 0
        self.oks = 0
        self.inflight: float | None = None
        self.errors_seen: int | None = None
        self.last_reason = ""
        self.transitions: list[tuple[float, str, str]] = []


def probe(device: hal.Device, stream: hal.Stream) -> None:
    """Run the health probe once: a small accumulate kernel, read back and checked.

    Raises:
        hal.HalError: the device failed the probe (the error says how).
    """
    import hal.kernels
    import hal.kernels.spi

    x = hal.asarray(np.full(64, 1.5, np.float32), device=device, stream=stream)
    y = hal.asarray(np.full(64, 2.0, np.float32), device=device, stream=stream)
    with (
        hal.kernels.spi.internal()
    ):  # hal.sched's own probe: never the user's fallback warning or strict error
        hal.kernels.accumulate(x, y, op="sum", stream=stream)
    got = x.to_host(stream=stream)
    stream.synchronize()
    if not np.all(got == 3.5):
        raise hal.DeviceError(f"health probe of {device} computed wrong values", device=str(device))


class Health:
    """Per-device health tracking for one scheduler.

    Args:
        devices: the pool. config: thresholds. on_change: called ``(device, old, new)``
            outside any lock of this object when a state changes.
    """

    def __init__(
        self,
        devices: Sequence[hal.Device],
        config: HealthConfig,
        on_change: Callable[[hal.Device, DeviceState, DeviceState], None],
    ) -> None:
        self.config = config
        self._tracks = {d: _Track() for d in devices}
        self._lock = threading.Lock()
        self._on_change = on_change
        self._stop = threading.Event()
        self._streams: dict[hal.Device, hal.Stream] = {}
        self._thread: threading.Thread | None = None
        self._probes: list[threading.Thread] = []
        if config.interval > 0:
            self._thread = threading.Thread(target=self._loop, name="hal-sched-health", daemon=True)
            self._thread.start()

    def state(self, device: hal.Device) -> DeviceState:
        """Return ``device``'s state."""
        return self._tracks[device].state

    def track(self, device: hal.Device) -> _Track:
        """Return ``device``'s record (internal: the scheduler's workers read its ``state``)."""
        return self._tracks[device]

    def usable(self, device: hal.Device) -> bool:
        """True unless ``device`` is EVICTED."""
        return self._tracks[device].state is not DeviceState.EVICTED

    def history(self, device: hal.Device) -> list[tuple[float, str, str]]:
        """Return ``(time, new_state, reason)`` of every transition of ``device``."""
        return list(self._tracks[device].transitions)

    def reason(self, device: hal.Device) -> str:
        """Return the last failure reason recorded for ``device``."""
        return self._tracks[device].last_reason

    def report(
        self, device: hal.Device, ok: bool, reason: str = "", *, probe: bool = False
    ) -> None:
        """Add one piece of evidence: a task or probe outcome on ``device``.

        An EVICTED device is re-admitted only by probes (tasks no longer run there).
        """
        tr = self._tracks[device]
        c = self.config
        with self._lock:
            old = tr.state
            if ok:
                tr.oks += 1
                tr.fails = 0
                if old is DeviceState.SUSPECT and tr.oks >= c.recover_after:
                    tr.state = DeviceState.HEALTHY
                elif old is DeviceState.EVICTED and probe and tr.oks >= c.readmit_after:
                    tr.state = DeviceState.HEALTHY
            else:
                tr.fails += 1
                tr.oks = 0
                tr.last_reason = reason
                if old is DeviceState.HEALTHY:
                    tr.state = DeviceState.SUSPECT
                if tr.state is DeviceState.SUSPECT and tr.fails >= c.evict_after:
                    tr.state = DeviceState.EVICTED
            new = tr.state
            if new is not old:
                tr.transitions.append(
                    (time.perf_counter(), new.value, reason if not ok else "recovered")
                )
        if new is not old:
            self._on_change(device, old, new)

    def probe_now(self, device: hal.Device) -> None:
        """Probe ``device`` once now, in the background (unless a probe of it is in flight).

        A probe that does not come back counts as failed every ``timeout`` seconds (while
        periodic probing runs).
        """
        tr = self._tracks[device]
        with self._lock:
            if tr.inflight is not None or self._stop.is_set():
                return
            tr.inflight = time.perf_counter()
        t = threading.Thread(
            target=self._probe_one, args=(device,), name=f"hal-probe-{device}", daemon=True
        )
        self._probes = [p for p in self._probes if p.is_alive()] + [t]
        t.start()

    # -- probing ---------------------------------------------------------------------------
    def _probe_one(self, device: hal.Device) -> None:
        tr = self._tracks[device]
        try:
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = device.create_stream()
            with hal.Tracer.muted():  # probes stay off the timeline
                probe(device, stream)
            errors = device.properties().get("errors")
            seen, tr.errors_seen = tr.errors_seen, errors if isinstance(errors, int) else None
            if isinstance(errors, int) and seen is not None and errors > seen:
                raise hal.DeviceError(
                    f"backend error counter rose by {errors - seen}", device=str(device)
                )
            ok, reason = True, ""
        except hal.OutOfMemoryError:  # a full device is busy, not broken: no evidence either way
            tr.inflight = None
            return
        except Exception as exc:  # noqa: BLE001 - any failure is evidence against the device
            ok, reason = False, f"probe: {type(exc).__name__}: {exc}"
        finally:
            tr.inflight = None
        if not self._stop.is_set():
            self.report(device, ok, reason, probe=True)

    def _loop(self) -> None:
        c = self.config
        while not self._stop.wait(c.interval):
            now = time.perf_counter()
            for d, tr in self._tracks.items():
                if tr.inflight is None:
                    tr.inflight = now
                    t = threading.Thread(
                        target=self._probe_one, args=(d,), name=f"hal-probe-{d}", daemon=True
                    )
                    self._probes = [p for p in self._probes if p.is_alive()] + [t]
                    t.start()
                elif now - tr.inflight > c.timeout:
                    tr.inflight = now  # count one timeout per `timeout` seconds while it hangs
                    self.report(d, False, f"probe timed out after {c.timeout} s", probe=True)

    def close(self) -> None:
        """Stop probing and release the probe streams."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for t in self._probes:  # a hung probe is abandoned after its timeout
            t.join(self.config.timeout)
        for s in self._streams.values():
            try:
                s.close()
            except hal.HalError:
                pass
