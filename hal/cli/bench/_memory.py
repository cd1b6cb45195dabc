"""``hal bench memory``: copy bandwidth through hal beside the same copy in the raw library.

For every backend and every size (powers of 4 from ``--min`` to ``--max``), four
directions are timed: ``h2d`` (host -> device 0), ``d2h`` (device 0 -> host), ``d2d``
(within device 0) and ``peer`` (device 1 -> device 0). The raw-library baseline of a
backend lives in ``hal.backends.<name>._baseline`` as::

    def memory_baseline(direction: str, nbytes: int, repeat: int) -> float:
        '''Return the median seconds of one transfer done with the raw library.'''

Method, identical on both sides so that the ratio means something: buffers are
allocated and touched before timing (no allocation in the timed loop), untimed warm-up
transfers on both sides (at least two; small ones until 64 MiB moved, at most 64: CPython's
adaptive interpreter specializes a function only after several calls, so a Python path times
its steady state, as the raw library's C loop does from the start) and two more before each
side's round, then ``repeat`` samples of one transfer followed by a synchronize
(``Stream.synchronize`` / the library's equivalent), timed with ``time.perf_counter``.
The samples are taken in up to three rounds that alternate hal and the baseline (so a
drift in machine load hits both alike); each side reports the median of its round
medians. Sizes go well past the last-level cache (256 MiB by default).
The target is hal time <= 1.10 x raw time for every transfer of at least 1 MiB.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from hal.cli.bench import format_size, parse_size, positive_int

__all__ = [
    "DIRECTIONS",
    "TARGET_MIN_NBYTES",
    "TARGET_OVERHEAD",
    "WARMUP",
    "HalTransfer",
    "add_command",
    "bench_backend",
    "bench_memory",
    "hal_transfer",
    "load_baseline",
    "measure",
    "sizes_between",
    "warmup_count",
]

#: Transfer directions, in report order.
DIRECTIONS = ("h2d", "d2h", "d2d", "peer")
#: hal may take at most this much longer than the raw library ...
TARGET_OVERHEAD = 0.10
#: ... for transfers of at least this many bytes.
TARGET_MIN_NBYTES = 1 << 20
#: Untimed transfers before the samples, at least ...
WARMUP = 2
#: ... and for small transfers as many as move this many bytes, up to :data:`WARMUP_MAX`.
WARMUP_BYTES = 64 << 20
WARMUP_MAX = 64
#: hal and the raw baseline alternate in this many rounds.
ROUNDS = 3

Baseline = Callable[[str, int, int], float]


def add_command(benches: Any) -> None:
    """Add ``memory`` to the ``hal bench`` subparsers ``benches``."""
    p = benches.add_parser(
        "memory",
        help="host<->device, device<->device and peer bandwidth: hal vs the raw library",
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument(
        "--backend",
        metavar="NAME[,NAME...]",
        help="backends to measure (default: every available backend)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON document instead of tables")
    p.add_argument(
        "--min",
        type=parse_size,
        default=1 << 10,
        metavar="SIZE",
        help="smallest transfer (default 1K)",
    )
    p.add_argument(
        "--max",
        type=parse_size,
        default=256 << 20,
        metavar="SIZE",
        help="largest transfer (default 256M)",
    )
    p.add_argument(
        "--repeat",
        type=positive_int,
        default=10,
        metavar="N",
        help="timed samples per measurement (default 10)",
    )
    p.set_defaults(func=cmd_memory)


def sizes_between(smallest: int, largest: int) -> list[int]:
    """Return ``smallest``, ``4 * smallest`` ... up to ``largest`` (always included)."""
    if smallest > largest:
        raise ValueError(f"--min {smallest} is larger than --max {largest}")
    sizes = []
    size = smallest
    while size < largest:
        sizes.append(size)
        size *= 4
    sizes.append(largest)
    return sizes


class BaselineRegistry:
    """Collects raw-library baselines from ``hal_register_baselines`` hooks (see the hookspec)."""

    def __init__(self) -> None:
        self.baselines: dict[str, Baseline | str] = {}

    def add(self, backend: str, baseline: Baseline | str) -> None:
        """Register ``baseline`` (a callable, or ``"module:function"``) for ``backend``.

        Raises:
            ValueError: ``backend`` is not a name, or a string baseline is not ``module:function``.
            TypeError: ``baseline`` is neither callable nor a string.
        """
        if not isinstance(backend, str) or not backend.isidentifier():
            raise ValueError(f"backend={backend!r} must be a backend name")
        if isinstance(baseline, str):
            if baseline.count(":") != 1:
                raise ValueError(f"baseline={baseline!r} must be 'module:function'")
        elif not callable(baseline):
            raise TypeError(f"baseline={baseline!r} must be callable or 'module:function'")
        self.baselines[backend] = baseline


def _hook_baseline(backend: str) -> tuple[Baseline | None, str] | None:
    """The baseline a plugin registered for ``backend`` through ``hal_register_baselines``, if any."""
    from hal.plugins import get_system

    reg = BaselineRegistry()
    get_system().call_plugin_hook("hal_register_baselines", registry=reg)
    found = reg.baselines.get(backend)
    if found is None:
        return None
    if callable(found):
        return found, f"{getattr(found, '__module__', '?')}.{getattr(found, '__qualname__', '?')}"
    module_name, _, attr = found.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr, None)
    except Exception as exc:
        return (
            None,
            f"baseline unavailable: {module_name} failed to import: {type(exc).__name__}: {exc}",
        )
    if not callable(fn):
        return None, f"baseline unavailable: {found} is not a function"
    return fn, module_name


def load_baseline(backend: str) -> tuple[Baseline | None, str]:
    """Return ``(memory_baseline, module name)`` of ``backend``, or ``(None, why not)``.

    From the ``hal_register_baselines`` hook of the backend's plugin (the built-in backends
    register theirs there too); else, for compatibility, ``hal.backends.<name>._baseline``.
    """
    hooked = _hook_baseline(backend)
    if hooked is not None:
        return hooked
    module_name = f"hal.backends.{backend}._baseline"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            return None, (
                f"baseline unavailable: none registered for backend {backend!r} (a plugin registers its raw "
                "library's with the hal_register_baselines hook: docs/write-a-backend.md, 'Test it')"
            )
        return None, f"baseline unavailable: {type(exc).__name__}: {exc}"
    except Exception as exc:
        return (
            None,
            f"baseline unavailable: {module_name} failed to import: {type(exc).__name__}: {exc}",
        )
    fn = getattr(module, "memory_baseline", None)
    if not callable(fn):
        return None, f"baseline unavailable: {module_name} has no memory_baseline()"
    return fn, module_name


def warmup_count(nbytes: int) -> int:
    """Untimed transfers of ``nbytes`` before the samples, on each side (hal and the baseline)."""
    return max(WARMUP, min(WARMUP_MAX, WARMUP_BYTES // max(1, nbytes)))


def _samples(transfer: Callable[[], None], count: int) -> list[float]:
    """Return ``count`` timings (seconds) of ``transfer()``."""
    out = []
    for _ in range(count):
        start = time.perf_counter()
        transfer()
        out.append(time.perf_counter() - start)
    return out


@contextlib.contextmanager
def hal_transfer(direction: str, devices: Sequence[Any], nbytes: int) -> Iterator[HalTransfer]:
    """Set up one ``direction`` transfer of ``nbytes`` through hal; yield it, free it on exit.

    Buffers are allocated and filled here, outside any timed code. ``transfer()`` is one
    ``hal.copy`` followed by ``Stream.synchronize``; ``verify()`` says whether the
    destination holds the source pattern.
    """
    import numpy as np

    import hal

    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} must be one of {', '.join(DIRECTIONS)}")
    d0 = devices[0]
    pattern = np.resize(np.arange(251, dtype=np.uint8), nbytes)
    with contextlib.ExitStack() as stack:
        stream = stack.enter_context(d0.create_stream())
        a = stack.enter_context(d0.alloc(nbytes))
        dst: Any
        src: Any
        if direction == "h2d":
            dst, src = a, pattern
        elif direction == "d2h":
            hal.copy(a, pattern, stream=stream)
            dst, src = np.zeros(nbytes, dtype=np.uint8), a
        elif direction == "d2d":
            b = stack.enter_context(d0.alloc(nbytes))
            hal.copy(b, pattern, stream=stream)
            dst, src = a, b
        else:
            d1 = devices[1]
            if d0.can_access_peer(d1):
                d0.enable_peer_access(d1)
            peer_stream = stack.enter_context(d1.create_stream())
            b = stack.enter_context(d1.alloc(nbytes))
            hal.copy(b, pattern, stream=peer_stream)
            peer_stream.synchronize()
            dst, src = a, b
        stream.synchronize()

        def transfer() -> None:
            hal.copy(dst, src, stream=stream)
            stream.synchronize()

        def verify() -> bool:
            if isinstance(dst, np.ndarray):
                result = dst
            else:
                result = np.empty(nbytes, dtype=np.uint8)
                hal.copy(result, dst, stream=stream)
                stream.synchronize()
            return bool(np.array_equal(result, pattern))

        yield HalTransfer(transfer, verify, hal.copy_path(dst, src))


class HalTransfer(NamedTuple):
    """A prepared hal transfer (see :func:`hal_transfer`)."""

    transfer: Callable[[], None]
    verify: Callable[[], bool]
    path: str


def measure(
    direction: str, devices: Sequence[Any], nbytes: int, repeat: int, baseline: Baseline | None
) -> dict[str, Any]:
    """Time ``direction`` through hal and through ``baseline``, interleaved; return a result row.

    The ``repeat`` samples are split into up to :data:`ROUNDS` rounds that alternate hal
    and the raw baseline, so that a drift in machine load hits both sides alike; each side
    reports the median of its per-round medians.
    """
    rounds = min(ROUNDS, repeat)
    per_round = -(-repeat // rounds)
    row: dict[str, Any] = {"direction": direction, "nbytes": nbytes, "path": None}
    hal_meds: list[float] = []
    raw_meds: list[float] = []
    try:
        with hal_transfer(direction, devices, nbytes) as prepared:
            row["path"] = prepared.path
            warm = warmup_count(nbytes)
            _samples(prepared.transfer, warm)
            if baseline is not None and warm > WARMUP:  # the same warm-up on the raw side
                try:
                    baseline(direction, nbytes, warm)
                except Exception as exc:
                    row["raw_error"] = f"{type(exc).__name__}: {exc}"
            for _ in range(rounds):
                # each side's round starts after WARMUP untimed transfers of its own, not cold
                # from the other side's work (and the baseline's buffers may be new per call)
                _samples(prepared.transfer, WARMUP)
                hal_meds.append(statistics.median(_samples(prepared.transfer, per_round)))
                if baseline is not None and "raw_error" not in row:
                    try:
                        baseline(direction, nbytes, WARMUP)
                        raw_meds.append(float(baseline(direction, nbytes, per_round)))
                    except Exception as exc:
                        row["raw_error"] = f"{type(exc).__name__}: {exc}"
            row["verified"] = prepared.verify()
    except Exception as exc:
        row["hal_error"] = f"{type(exc).__name__}: {exc}"
    hal_s = statistics.median(hal_meds) if hal_meds and "hal_error" not in row else None
    raw_s = statistics.median(raw_meds) if raw_meds and "raw_error" not in row else None
    ratio = hal_s / raw_s if hal_s and raw_s else None
    row.update(
        hal_s=hal_s,
        raw_s=raw_s,
        hal_GBps=_gbps(nbytes, hal_s),
        raw_GBps=_gbps(nbytes, raw_s),
        ratio=ratio,
        overhead=None if ratio is None else ratio - 1.0,
    )
    return row


def _gbps(nbytes: int, seconds: float | None) -> float | None:
    return None if not seconds else nbytes / seconds / 1e9


Progress = Callable[[str, dict[str, Any]], None]


def bench_backend(
    name: str, sizes: Sequence[int], repeat: int, progress: Progress | None = None
) -> dict[str, Any]:
    """Measure every direction and size on backend ``name``; return its JSON section.

    ``progress(name, row)`` is called after each measurement.
    """
    import hal

    try:
        devices = hal.devices(name)
    except (hal.HalError, ValueError) as exc:
        return {
            "backend": name,
            "status": "unavailable",
            "reason": str(exc),
            "devices": [],
            "results": [],
        }
    baseline, baseline_info = load_baseline(name)
    section: dict[str, Any] = {
        "backend": name,
        "status": "available",
        "reason": "",
        "devices": [str(d) for d in devices],
        "baseline": baseline_info,
        "results": [],
    }
    for direction in DIRECTIONS:
        for nbytes in sizes:
            if direction == "peer" and len(devices) < 2:
                row = {"direction": direction, "nbytes": nbytes, "path": None}
                row["skipped"] = f"peer needs two devices; {name} has {len(devices)}"
            else:
                row = measure(direction, devices, nbytes, repeat, baseline)
                if baseline is None:
                    row["raw_error"] = baseline_info
            section["results"].append(row)
            if progress:
                progress(name, row)
    section["target"] = _target(section["results"])
    section["alloc"] = alloc_rows(devices[0], name)
    section["pinned"] = pinned_rows(devices[0], sizes, repeat, baseline)
    small = [
        r for r in section["results"] if r["direction"] == "h2d" and r.get("hal_s") is not None
    ]
    if small:
        section["alloc_vs_copy"] = {
            "copy_nbytes": small[0]["nbytes"],
            "copy_us": small[0]["hal_s"] * 1e6,
        }
    if progress:
        progress(
            name,
            {
                "alloc": section["alloc"],
                "pinned": section["pinned"],
                **section.get("alloc_vs_copy", {}),
            },
        )
    return section


def _pinned_baseline(baseline: Baseline | None) -> Baseline | None:
    """The raw library's transfer from page-locked host memory, where its baseline module has one.

    A baseline module may offer ``transfer_seconds(direction, nbytes, repeat, *, host=...)``
    (the CUDA one does: ``host="pinned"`` is ``cupy.cuda.alloc_pinned_memory``), so that hal's
    pinned copies are compared with the library's pinned copies.
    """
    module = sys.modules.get(getattr(baseline, "__module__", "") or "")
    fn = getattr(module, "transfer_seconds", None)
    if not callable(fn):
        return None
    try:
        if "host" not in inspect.signature(fn).parameters:
            return None
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return None
    return functools.partial(fn, host="pinned")


def pinned_rows(
    device: Any, sizes: Sequence[int], repeat: int, baseline: Baseline | None = None
) -> list[dict[str, Any]]:
    """Time h2d and d2h copies from pageable host memory and from ``hal.alloc_host`` memory, side by side.

    Where the backend's raw baseline can use page-locked memory too (CUDA), its pinned copy is
    timed in the same rounds (``*_raw_pinned_GBps``, ``*_pinned_ratio`` = hal pinned time / raw
    pinned time): pinned against pinned. The sides alternate in up to :data:`ROUNDS` rounds;
    each reports the median of its round medians.
    """
    import numpy as np

    import hal

    raw_pinned = _pinned_baseline(baseline)
    rows = []
    s = device.create_stream()
    try:
        for nbytes in sizes:
            if nbytes > min(device.total_memory // 4, 256 << 20):
                continue
            pageable = np.ones(nbytes, np.uint8)
            pinned = hal.alloc_host(nbytes, device=device)
            pinned[:] = 1
            row: dict[str, Any] = {
                "nbytes": nbytes,
                "pinned_kind": "plain" if device._impl.alloc_host(1) is None else "backend",
            }
            with device.alloc(nbytes) as buf:
                for direction in ("h2d", "d2h"):
                    fns: dict[str, Callable[[], None]] = {}
                    for label, host in (("pageable", pageable), ("pinned", pinned)):

                        def copy(host: Any = host, direction: str = direction) -> None:
                            if direction == "h2d":
                                hal.copy(buf, host, stream=s)
                            else:
                                hal.copy(host, buf, stream=s)
                            s.synchronize()

                        fns[label] = copy
                    meds: dict[str, list[float]] = {k: [] for k in (*fns, "raw_pinned")}
                    rounds = min(ROUNDS, repeat)
                    per_round = -(-repeat // rounds)
                    for fn in fns.values():
                        _samples(fn, warmup_count(nbytes))
                    if raw_pinned is not None and warmup_count(nbytes) > WARMUP:
                        with contextlib.suppress(Exception):  # an error shows in the timed rounds
                            raw_pinned(direction, nbytes, warmup_count(nbytes))
                    for _ in range(rounds):
                        for label, fn in fns.items():
                            _samples(fn, WARMUP)  # each side's round starts warm (as above)
                            meds[label].append(statistics.median(_samples(fn, per_round)))
                        if raw_pinned is not None and "raw_pinned_error" not in row:
                            try:
                                raw_pinned(direction, nbytes, WARMUP)
                                meds["raw_pinned"].append(
                                    float(raw_pinned(direction, nbytes, per_round))
                                )
                            except Exception as exc:
                                row["raw_pinned_error"] = f"{type(exc).__name__}: {exc}"
                    for label, values in meds.items():
                        if values and not (label == "raw_pinned" and "raw_pinned_error" in row):
                            med = statistics.median(values)
                            row[f"{direction}_{label}_GBps"] = (
                                nbytes / med / 1e9 if med > 0 else None
                            )
                            row[f"_{direction}_{label}_s"] = med
                    hal_s, raw_s = (
                        row.pop(f"_{direction}_pinned_s", None),
                        row.pop(f"_{direction}_raw_pinned_s", None),
                    )
                    row.pop(f"_{direction}_pageable_s", None)
                    if hal_s and raw_s:
                        row[f"{direction}_pinned_ratio"] = hal_s / raw_s
            del pinned
            rows.append(row)
    finally:
        s.close()
    return rows


#: Sizes of the alloc+free rows.
ALLOC_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)


def _per_call_us(fn: Callable[[], None], count: int) -> float:
    """Best of 5 rounds of the mean microseconds of ``fn`` (after 2 untimed calls): the cost, not the load."""
    fn()
    fn()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(count):
            fn()
        rounds.append((time.perf_counter() - start) / count * 1e6)
    return min(rounds)


def alloc_rows(device: Any, backend: str, count: int = 500) -> list[dict[str, Any]]:
    """Time one ``Device.alloc(n)`` + ``Buffer.close()`` cycle with the pool and without it.

    On CUDA, CuPy's own pool beside them.
    """
    rows = []
    for n in ALLOC_SIZES:
        if n > device.total_memory // 4:
            continue
        row: dict[str, Any] = {"nbytes": n}

        def cycle(n: int = n) -> None:
            device.alloc(n).close()

        pool = device._memory_pool()
        row["pool_us"] = _per_call_us(cycle, count) if pool is not None else None
        saved = device._pool
        device._pool = None  # the HAL_MEMORY_POOL=0 path, for this measurement only
        try:
            row["no_pool_us"] = _per_call_us(cycle, count)
        finally:
            device._pool = saved
        if backend == "cuda":
            with contextlib.suppress(Exception):
                import cupy

                with cupy.cuda.Device(device.index):

                    def cupy_cycle(n: int = n) -> None:
                        cupy.cuda.alloc(n)  # dropped at once: back to CuPy's default pool

                    row["cupy_pool_us"] = _per_call_us(cupy_cycle, count)
        if row["pool_us"] is not None and row["no_pool_us"]:
            row["speedup"] = row["no_pool_us"] / row["pool_us"]
        rows.append(row)
    return rows


def _target(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Judge the overhead target on the rows of at least ``TARGET_MIN_NBYTES``."""
    checked = [r for r in rows if r["nbytes"] >= TARGET_MIN_NBYTES and r.get("ratio") is not None]
    out: dict[str, Any] = {
        "overhead_max": TARGET_OVERHEAD,
        "min_nbytes": TARGET_MIN_NBYTES,
        "checked": len(checked),
        "met": None,
        "worst": None,
    }
    if checked:
        worst = max(checked, key=lambda r: r["ratio"])
        out["met"] = all(r["ratio"] <= 1.0 + TARGET_OVERHEAD for r in checked)
        out["worst"] = {
            "direction": worst["direction"],
            "nbytes": worst["nbytes"],
            "ratio": worst["ratio"],
        }
    return out


def bench_memory(
    backends: Sequence[str] | None,
    sizes: Sequence[int],
    repeat: int,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the memory benchmark; return the JSON document ``hal bench memory --json`` prints.

    Args:
        backends: backend names, or ``None`` for every available backend (the unavailable
            ones are listed with their status and reason, and not measured).
        sizes: transfer sizes in bytes.
        repeat: timed samples per measurement.
        progress: called with (backend, row) after each measurement.
    """
    import hal
    from hal.cli.bench import loadavg, memcpy_bandwidth, method

    load_start = loadavg()
    sections = []
    if backends is None:  # every available backend; the others are listed with their reason
        for info in hal.list_backends():
            if info.status == "available":
                sections.append(bench_backend(info.name, sizes, repeat, progress))
            else:
                sections.append(
                    {
                        "backend": info.name,
                        "status": info.status,
                        "reason": info.reason,
                        "devices": [],
                        "results": [],
                    }
                )
    else:
        sections = [bench_backend(name, sizes, repeat, progress) for name in backends]
    judged = [s["target"]["met"] for s in sections if s.get("target", {}).get("met") is not None]
    return {
        "benchmark": "memory",
        "hal_sdk": hal.__version__,
        "method": (
            f"{repeat} samples per side after {WARMUP} to {WARMUP_MAX} warm-up transfers per side "
            f"(small ones until {WARMUP_BYTES >> 20} MiB moved) and {WARMUP} before each side's round, "
            f"in up to {ROUNDS} rounds "
            "alternating hal and the raw library; each sample is one copy followed by a synchronize, "
            "timed on the host; median of the round medians; buffers allocated before timing"
        ),
        "methodology": method(
            clock="time.perf_counter on the host around one copy followed by a synchronize "
            "(Stream.synchronize / the library's own), for hal and the raw library alike",
            repetitions=f"{repeat} samples per side and size after {WARMUP} to {WARMUP_MAX} warm-up "
            f"copies per side (small ones until {WARMUP_BYTES >> 20} MiB moved: steady state), "
            f"{WARMUP} more before each side's round",
            statistic="median of the round medians",
            interleaving=f"up to {ROUNDS} rounds alternating hal and the raw library",
            placement="out of place; buffers allocated and touched before timing; host memory: "
            "pageable on both sides in the main rows, pinned against pinned in the host-memory rows "
            "(where the raw library has a pinned copy)",
        ),
        "loadavg": load_start,
        "loadavg_end": loadavg(),
        "memcpy_GBps": memcpy_bandwidth(),
        "repeat": repeat,
        "warmup": WARMUP,
        "warmup_max": WARMUP_MAX,
        "sizes": list(sizes),
        "directions": list(DIRECTIONS),
        "target": {
            "description": f"hal time <= {1 + TARGET_OVERHEAD:.2f} x raw time for transfers >= 1 MiB",
            "overhead_max": TARGET_OVERHEAD,
            "min_nbytes": TARGET_MIN_NBYTES,
            "met": all(judged) if judged else None,
        },
        "backends": sections,
    }


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


_HEADER = (
    f"  {'dir':<5} {'size':>9} {'path':>7} {'hal GB/s':>9} {'raw GB/s':>9} {'hal us':>10} "
    f"{'raw us':>10} {'ratio':>7}"
)


def _print_row(backend: str, row: dict[str, Any], state: dict[str, str]) -> None:
    if "alloc" in row:
        if row.get("pinned"):
            raw = any("h2d_raw_pinned_GBps" in r for r in row["pinned"])
            print(
                f"  host memory (GB/s): {'size':>9} {'h2d pageable':>13} {'h2d pinned':>11} "
                f"{'d2h pageable':>13} {'d2h pinned':>11}"
                + (f" {'raw h2d pinned':>15} {'raw d2h pinned':>15} {'ratios':>11}" if raw else "")
            )
            for r in row["pinned"]:
                extra = ""
                if raw:
                    extra = (
                        f" {_fmt(r.get('h2d_raw_pinned_GBps')):>15} {_fmt(r.get('d2h_raw_pinned_GBps')):>15}"
                        f" {_fmt(r.get('h2d_pinned_ratio')):>5} {_fmt(r.get('d2h_pinned_ratio')):>5}"
                    )
                print(
                    f"  {'':<18} {format_size(r['nbytes']):>9} {_fmt(r.get('h2d_pageable_GBps')):>13} "
                    f"{_fmt(r.get('h2d_pinned_GBps')):>11} {_fmt(r.get('d2h_pageable_GBps')):>13} "
                    f"{_fmt(r.get('d2h_pinned_GBps')):>11}{extra}  ({r['pinned_kind']})"
                )
        print(
            f"  alloc+free per call (us): {'size':>9} {'pool':>8} {'no pool':>8} {'cupy pool':>9}"
        )
        for r in row["alloc"]:
            print(
                f"  {'':<25} {format_size(r['nbytes']):>9} {_fmt(r.get('pool_us'), 1, 1):>8} "
                f"{_fmt(r.get('no_pool_us'), 1, 1):>8} {_fmt(r.get('cupy_pool_us'), 1, 1):>9}"
            )
        if "copy_us" in row:
            print(
                f"  {'':<25} (a {format_size(row['copy_nbytes'])} h2d copy: {row['copy_us']:.1f} us)",
                flush=True,
            )
        return
    if state.get("backend") != backend:
        state["backend"] = backend
        print(f"\nbackend {backend}")
        print(_HEADER)
    note = row.get("skipped") or row.get("hal_error") or ""
    if not note and row.get("raw_error"):
        note = row["raw_error"]
    if row.get("verified") is False:
        note = "WRONG RESULT " + note
    print(
        f"  {row['direction']:<5} {format_size(row['nbytes']):>9} {row['path'] or '-':>7} "
        f"{_fmt(row.get('hal_GBps')):>9} {_fmt(row.get('raw_GBps')):>9} "
        f"{_fmt(row.get('hal_s'), 1e6, 1):>10} {_fmt(row.get('raw_s'), 1e6, 1):>10} {_fmt(row.get('ratio')):>7}"
        + (f"  {note}" if note else ""),
        flush=True,
    )


def _print_summary(doc: dict[str, Any]) -> None:
    from hal.cli.bench import machine_line

    print("\n" + machine_line(doc["loadavg"], doc["loadavg_end"], doc["memcpy_GBps"]))
    print(f"target: {doc['target']['description']}")
    for s in doc["backends"]:
        if s["status"] != "available":
            print(f"  {s['backend']}: not measured ({s['reason']})")
            continue
        t = s["target"]
        if t["met"] is None:
            verdict = "not checked (no size >= 1 MiB with both timings)"
        else:
            w = t["worst"]
            verdict = "met" if t["met"] else "NOT met"
            verdict += (
                f" (worst ratio {w['ratio']:.2f}: {w['direction']} {format_size(w['nbytes'])})"
            )
        base = s["baseline"]
        print(
            f"  {s['backend']}: {verdict}; {base if base.startswith('baseline ') else 'baseline ' + base}"
        )


def cmd_memory(args: argparse.Namespace) -> int:
    """Run ``hal bench memory``.

    Exit 1 if a backend named by ``--backend`` could not be measured or a copy was wrong.
    """
    try:
        sizes = sizes_between(args.min, args.max)
    except ValueError as exc:
        print(f"hal bench memory: {exc}", file=sys.stderr)
        return 2
    requested = [b.strip() for b in args.backend.split(",") if b.strip()] if args.backend else None
    state: dict[str, str] = {}
    progress = None if args.json else (lambda backend, row: _print_row(backend, row, state))
    if not args.json:
        print(
            f"hal bench memory: {len(sizes)} sizes {format_size(sizes[0])}..{format_size(sizes[-1])}, "
            f"median of {args.repeat} (ratio = hal time / raw time)"
        )
    doc = bench_memory(requested, sizes, args.repeat, progress)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_summary(doc)
    unavailable = requested is not None and any(s["status"] != "available" for s in doc["backends"])
    wrong = any(
        r.get("verified") is False or "hal_error" in r
        for s in doc["backends"]
        for r in s["results"]
    )
    return 1 if unavailable or wrong else 0
