"""Shared helpers of the sections: byte patterns, exact comparisons, slow work, expected errors."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import hal
from hal.conformance._target import ConformanceFailure, Target

__all__ = [
    "OFFSETS",
    "SIZES",
    "download",
    "expect_bytes",
    "heavy",
    "pattern",
    "raises",
    "unlike",
    "upload",
]

#: Odd and awkward sizes in bytes (around powers of two, primes, one byte).
SIZES = (1, 2, 3, 7, 13, 255, 257, 4097, 65537, 1 << 20 | 3)
#: Byte offsets, mostly misaligned.
OFFSETS = (0, 1, 3, 17)

U8 = np.dtype(np.uint8)


def pattern(rng: np.random.Generator, n: int) -> np.ndarray[Any, Any]:
    """Return ``n`` random bytes."""
    return rng.integers(0, 256, size=n, dtype=np.uint8)


def unlike(data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Return bytes that differ from ``data`` at every position (bitwise NOT)."""
    return np.bitwise_not(data)


def expect_bytes(actual: np.ndarray[Any, Any], expected: np.ndarray[Any, Any], what: str) -> None:
    """Fail unless the two byte arrays are identical; the message locates the first difference."""
    a = np.asarray(actual).view(np.uint8).reshape(-1)
    e = np.asarray(expected).view(np.uint8).reshape(-1)
    if a.shape != e.shape:
        raise ConformanceFailure(f"{what}: got {a.size} bytes, expected {e.size}")
    bad = np.flatnonzero(a != e)
    if bad.size:
        i = int(bad[0])
        raise ConformanceFailure(
            f"{what}: {bad.size} of {e.size} bytes differ, first at byte {i} "
            f"(got {int(a[i]):#04x}, expected {int(e[i]):#04x}; last differing byte {int(bad[-1])})"
        )


def upload(
    buf: hal.Buffer, data: np.ndarray[Any, Any], stream: hal.Stream, offset: int = 0
) -> None:
    """Copy host bytes into ``buf`` at ``offset`` and wait for the copy."""
    hal.copy(buf, data, stream=stream, dst_offset=offset)
    stream.synchronize()


def download(
    buf: hal.Buffer, stream: hal.Stream, offset: int = 0, nbytes: int | None = None
) -> np.ndarray[Any, Any]:
    """Return the bytes of ``buf`` (from ``offset``) in a new host array, after the copy completed."""
    n = buf.nbytes - offset if nbytes is None else nbytes
    out = np.empty(n, dtype=np.uint8)
    if n:
        hal.copy(out, buf, stream=stream, src_offset=offset, nbytes=n)
    stream.synchronize()
    return out


def raises(
    expected: type[BaseException] | tuple[type[BaseException], ...],
    what: str,
    fn: Callable[..., object],
    *args: Any,
    **kwargs: Any,
) -> BaseException:
    """Call ``fn`` and return the exception it raised; fail unless it is one of ``expected``."""
    names = " or ".join(
        e.__name__ for e in (expected if isinstance(expected, tuple) else (expected,))
    )
    try:
        fn(*args, **kwargs)
    except expected as exc:
        return exc
    except Exception as exc:
        raise ConformanceFailure(
            f"{what}: raised {type(exc).__name__}: {exc}; expected {names}"
        ) from exc
    raise ConformanceFailure(f"{what}: no error was raised; expected {names}")


# -- slow work: the producer side of ordering checks --------------------------------------
_SCRATCH_MAX = 4 << 20


def delayed_round_trip(
    t: Target, s: hal.Stream, buf: hal.Buffer, ms: float = 15.0
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Enqueue ``ms`` of :func:`heavy` work, then a fresh pattern host -> ``buf`` -> host.

    Return ``(host, data)``: ``host`` holds the pattern only once the stream has reached the
    copy back, so a check that reads it early (a sync that does not wait) sees stale bytes.
    """
    data = pattern(t.rng, buf.nbytes)
    host = unlike(data)
    heavy(t, s, ms=ms)
    hal.copy(buf, data, stream=s)
    hal.copy(host, buf, stream=s)
    return host, data


def _scratch_size(device: hal.Device) -> int:
    limit = device.capabilities.max_alloc_bytes or device.total_memory
    return max(4096, min(_SCRATCH_MAX, device.total_memory // 64, limit))


def heavy(t: Target, stream: hal.Stream, ms: float = 15.0) -> None:
    """Enqueue about ``ms`` milliseconds of device work on ``stream`` (memsets and copies).

    The cost of one operation is measured once per device and suite run (``t.cache``), so
    a consumer that does not wait for this work reliably observes stale data.
    """
    dev = stream.device
    size = _scratch_size(dev)
    scratch = t.alloc(size, dev)
    half = size // 2
    key = ("heavy-ns-per-op", str(dev))
    per_op = t.cache.get(key)
    if per_op is None:
        batch = 8
        stream.synchronize()
        t0 = time.perf_counter()
        for i in range(batch):
            hal.memset(scratch, i, stream=stream)
        stream.synchronize()
        per_op = max(1000, int((time.perf_counter() - t0) / batch * 1e9))
        t.cache[key] = per_op
    reps = min(4000, max(4, math.ceil(ms * 1e6 / per_op)))
    for i in range(reps):
        if i % 2:
            hal.copy(scratch, scratch, stream=stream, nbytes=half, dst_offset=half)
        else:
            hal.memset(scratch, i & 0xFF, stream=stream, nbytes=half)
