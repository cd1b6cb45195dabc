"""MEM-* at scale: copies and memsets across chunk boundaries, many host threads at once."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import hal
from hal.conformance._checks import download, expect_bytes, pattern
from hal.conformance._registry import requirement
from hal.conformance._target import Target

#: Sizes across the usual chunk boundaries of drivers and staging buffers (1, 4, 16, 64 MiB).
LARGE_SIZES = ((1 << 20) + 1, (4 << 20) - 3, (16 << 20) + 5, (64 << 20) + 7)
#: Host threads of MEM-THREADS, and the iterations of each.
THREADS, ITERATIONS = 8, 40


def _large_sizes(dev: hal.Device) -> list[int]:
    """The sizes of :data:`LARGE_SIZES` that two buffers of fit in the device's declared memory."""
    limit = min(dev.capabilities.max_alloc_bytes or dev.total_memory, dev.total_memory // 3)
    sizes = [n for n in LARGE_SIZES if n <= limit]
    return sizes or [max(1, limit)]


@requirement(
    "MEM-COPY-LARGE",
    "Host-to-device, device-to-device and device-to-host copies and memsets of sizes across chunk "
    "boundaries up to 64 MiB (bounded by the declared memory) are byte-exact to the last byte.",
)
def _large(t: Target) -> None:
    dev = t.device
    s = t.stream()
    done = []
    for n in _large_sizes(dev):
        a, b = dev.alloc(n), dev.alloc(n)
        try:
            data = pattern(t.rng, n)
            hal.copy(a, data, stream=s)
            hal.copy(b, a, stream=s)
            host = np.zeros(n, np.uint8)
            hal.copy(host, b, stream=s)
            s.synchronize()
            expect_bytes(host, data, f"{n} bytes host -> device -> device -> host")
            value = int(data[-1]) ^ 0xFF
            hal.memset(a, value, stream=s)
            tail = min(n, 3 << 20)
            got = download(a, s, offset=n - tail)
            expect_bytes(
                got,
                np.full(tail, value, np.uint8),
                f"the last {tail} bytes of a memset of {n} bytes",
            )
            head = download(a, s, nbytes=min(n, 4096))
            expect_bytes(
                head,
                np.full(head.size, value, np.uint8),
                f"the first bytes of a memset of {n} bytes",
            )
            done.append(n)
        finally:
            a.close()
            b.close()
    t.attach("sizes", done)


@requirement(
    "MEM-THREADS",
    "Eight host threads allocating, copying, recording and waiting for events and freeing on one "
    "device at once each see exactly their own data, and memory_in_use (when tracked) is exact "
    "afterwards.",
)
def _threads(t: Target) -> None:
    dev = t.device
    before = dev.memory_in_use
    errors: list[str] = []
    barrier = threading.Barrier(THREADS)
    seeds = [int(x) for x in t.rng.integers(0, 1 << 62, size=THREADS)]

    def work(k: int) -> None:
        rng = np.random.default_rng(seeds[k])
        try:
            s = dev.create_stream()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(f"thread {k}: create_stream raised {type(exc).__name__}: {exc}")
            return
        try:
            barrier.wait(30)
            held: list[tuple[hal.Buffer, np.ndarray[Any, Any]]] = []
            for i in range(ITERATIONS):
                n = int(rng.integers(1, 20_000))
                buf = dev.alloc(n)
                data = pattern(rng, n)
                hal.copy(buf, data, stream=s)
                ev = dev.create_event()
                ev.record(s)
                ev.synchronize()
                ev.close()
                held.append((buf, data))
                if len(held) > 3 or i == ITERATIONS - 1:
                    for b, d in held:
                        out = np.empty(b.nbytes, np.uint8)
                        hal.copy(out, b, stream=s)
                        s.synchronize()
                        if not np.array_equal(out, d):
                            errors.append(
                                f"thread {k}, iteration {i}: a buffer of {b.nbytes} bytes holds other data"
                            )
                        b.close()
                    held.clear()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(f"thread {k}: {type(exc).__name__}: {exc}")
        finally:
            s.close()

    threads = [
        threading.Thread(target=work, args=(k,), name=f"hal-conformance mem-{k}", daemon=True)
        for k in range(THREADS)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    t.expect(not any(th.is_alive() for th in threads), "a host thread did not finish within 60 s")
    t.expect(
        not errors, f"{len(errors)} error(s) with {THREADS} threads at once; first: {errors[:1]}"
    )
    dev.empty_cache()  # hal's pool gives its cache back: the backend's frees are counted too
    after = dev.memory_in_use
    t.expect(
        after == before,
        f"memory_in_use is {after} after {THREADS} threads allocated and freed "
        f"{THREADS * ITERATIONS} buffers at once; it was {before} before (accounting without a lock?)",
    )
