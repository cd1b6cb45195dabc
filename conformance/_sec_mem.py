"""MEM-*: allocation, zero size, limits, out-of-memory, copies in every direction, memset, close."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np

import hal
from hal.conformance._checks import (
    OFFSETS,
    SIZES,
    download,
    expect_bytes,
    pattern,
    raises,
    unlike,
    upload,
)
from hal.conformance._registry import requirement
from hal.conformance._target import Target

GUARD = 5  # bytes checked untouched on each side of a copied range


@requirement(
    "MEM-ALLOC",
    "Device.alloc(n) returns an open Buffer of exactly n bytes on that device, and live "
    "allocations of odd sizes never alias.",
)
def _alloc(t: Target) -> None:
    dev = t.device
    s = t.stream()
    sizes = [*SIZES, *(int(x) for x in t.rng.integers(1, 70_000, size=24))]
    bufs = []
    for n in sizes:
        b = t.alloc(n)
        t.expect(
            isinstance(b, hal.Buffer), f"alloc({n}) returned {type(b).__name__}, not hal.Buffer"
        )
        t.expect(b.nbytes == n, f"alloc({n}).nbytes == {b.nbytes}")
        t.expect(b.device == dev, f"alloc on {dev} returned a buffer of {b.device}")
        t.expect(not b.closed, f"alloc({n}) returned a closed buffer")
        bufs.append(b)
    datas = [pattern(t.rng, n) for n in sizes]
    for b, d in zip(
        bufs, datas, strict=True
    ):  # write everything first, then read: aliasing shows up
        hal.copy(b, d, stream=s)
    s.synchronize()
    for b, d in zip(bufs, datas, strict=True):
        expect_bytes(download(b, s), d, f"buffer of {b.nbytes} bytes among {len(bufs)} live ones")


@requirement(
    "MEM-ZERO-SIZE",
    "Zero-byte buffers allocate, copy, memset, view and close without error and without touching other memory.",
)
def _zero(t: Target) -> None:
    s = t.stream()
    z = t.alloc(0)
    t.expect(z.nbytes == 0, f"alloc(0).nbytes == {z.nbytes}")
    other = t.alloc(64)
    ref = pattern(t.rng, 64)
    upload(other, ref, s)
    host = np.empty(0, dtype=np.uint8)
    hal.copy(z, host, stream=s)
    hal.copy(host, z, stream=s)
    hal.copy(z, other, stream=s, nbytes=0)
    hal.copy(other, z, stream=s)
    hal.copy(other, ref, stream=s, nbytes=0, dst_offset=64)
    hal.memset(z, 0xAB, stream=s)
    hal.memset(other, 0xAB, stream=s, nbytes=0, offset=17)
    arr = z.view(np.float32)
    t.expect(arr.shape == (0,), f"view of a zero-byte buffer has shape {arr.shape}")
    t.expect(arr.to_host(stream=s).size == 0, "to_host of an empty array is not empty")
    s.synchronize()
    expect_bytes(download(other, s), ref, "a 64-byte buffer after zero-byte copies and memsets")
    z.close()
    z.close()
    t.expect(z.closed, "a closed zero-byte buffer does not say it is closed")


@requirement(
    "MEM-LIMITS",
    "total_memory is positive, max_alloc_bytes (if declared) is within it, and memory_in_use (if "
    "tracked) grows by at least n per allocation and returns to its value on close.",
)
def _limits(t: Target) -> None:
    dev = t.device
    t.expect(
        isinstance(dev.total_memory, int) and dev.total_memory > 0,
        f"total_memory={dev.total_memory!r}",
    )
    m = dev.capabilities.max_alloc_bytes
    if m is not None:
        t.expect(
            isinstance(m, int) and 0 < m <= dev.total_memory,
            f"max_alloc_bytes={m!r} not in 1..total_memory",
        )
        raises(ValueError, f"alloc(max_alloc_bytes + 1 = {m + 1})", dev.alloc, m + 1)
    before = dev.memory_in_use
    if before is None:
        return
    sizes = [12_345, 1, 1 << 16]
    bufs = []
    for n in sizes:
        prev = dev.memory_in_use
        bufs.append(dev.alloc(n))
        now = dev.memory_in_use
        t.expect(
            now is not None and prev is not None and now >= prev + n,
            f"memory_in_use went {prev} -> {now} on alloc({n})",
        )
    for b in bufs:
        b.close()
    after = dev.memory_in_use
    t.expect(
        after == before,
        f"memory_in_use {before} before, {after} after allocating and closing {sizes}",
    )


@requirement(
    "MEM-OOM",
    "An allocation beyond the free memory raises hal.OutOfMemoryError at once, changes neither "
    "memory_in_use nor live data, and the device stays usable.",
)
def _oom(t: Target) -> None:
    dev = t.device
    s = t.stream()
    keep = t.alloc(4099)
    ref = pattern(t.rng, 4099)
    upload(keep, ref, s)
    before = dev.memory_in_use
    limit = dev.capabilities.max_alloc_bytes
    want = dev.total_memory + 1
    held: list[hal.Buffer] = []
    try:
        if limit is None or limit >= want:
            try:
                b = dev.alloc(want)
            except hal.OutOfMemoryError:
                pass
            except Exception as exc:
                raise t.fail(
                    f"alloc(total_memory + 1 = {want}) raised {type(exc).__name__}: {exc}; "
                    "expected hal.OutOfMemoryError"
                ) from exc
            else:
                b.close()
                raise t.fail(
                    f"alloc(total_memory + 1 = {want}) succeeded: memory beyond the device was promised"
                )
        else:
            for _ in range(dev.total_memory // limit + 2):
                try:
                    held.append(dev.alloc(limit))
                except hal.OutOfMemoryError:
                    break
                except Exception as exc:
                    raise t.fail(
                        f"alloc({limit}) near exhaustion raised {type(exc).__name__}: {exc}; "
                        "expected hal.OutOfMemoryError"
                    ) from exc
            else:
                raise t.fail(
                    f"{len(held)} allocations of {limit} bytes (over total_memory) all succeeded"
                )
    finally:
        for b in held:
            b.close()
    after = dev.memory_in_use
    t.expect(after == before, f"memory_in_use {before} before the failed allocation, {after} after")
    expect_bytes(download(keep, s), ref, "a live buffer after an out-of-memory error")
    small = t.alloc(257)
    data = pattern(t.rng, 257)
    upload(small, data, s)
    expect_bytes(download(small, s), data, "a new allocation after an out-of-memory error")


def _host_kinds(rng: np.random.Generator, n: int) -> list[tuple[str, Any, np.ndarray[Any, Any]]]:
    """Host sources of ``n`` bytes of several kinds: (name, object, its bytes)."""
    raw = pattern(rng, n)
    kinds: list[tuple[str, Any, np.ndarray[Any, Any]]] = [
        ("numpy uint8", raw, raw),
        ("bytes", raw.tobytes(), raw),
    ]
    kinds.append(("bytearray", bytearray(raw.tobytes()), raw))
    if n % 4 == 0:
        f = raw.view(np.float32).reshape(2, -1) if n % 8 == 0 else raw.view(np.float32)
        kinds.append(("float32 array", f, raw))
    return kinds


@requirement(
    "MEM-COPY-H2D",
    "Host-to-device copies from any buffer-protocol object are byte-exact at odd sizes and "
    "destination offsets, and write nothing outside the range.",
)
def _h2d(t: Target) -> None:
    s = t.stream()
    for n in (*SIZES, 4096):
        for off in OFFSETS:
            if n <= 4097 and off == 1:
                kinds = _host_kinds(t.rng, n)
            else:
                one = pattern(t.rng, n)
                kinds = [("numpy uint8", one, one)]
            for kind, src, raw in kinds:
                buf = t.alloc(off + n + GUARD)
                before = unlike(
                    np.concatenate([np.zeros(off, np.uint8), raw, np.zeros(GUARD, np.uint8)])
                )
                before[:off] = pattern(t.rng, off)
                before[off + n :] = pattern(t.rng, GUARD)
                upload(buf, before, s)
                path = hal.copy(buf, src, stream=s, dst_offset=off)
                t.expect(
                    path == "local", f"host-to-device copy reported path {path!r}, expected 'local'"
                )
                expected = before.copy()
                expected[off : off + n] = raw
                expect_bytes(
                    download(buf, s), expected, f"H2D of {n} bytes ({kind}) at dst_offset={off}"
                )
    arr = t.alloc(64).view(np.int32, 5, offset=12)
    vals = np.arange(5, dtype=np.int32) * -7
    hal.copy(arr, vals, stream=s)
    t.expect(np.array_equal(arr.to_host(stream=s), vals), "H2D into a hal.Array view at offset 12")


@requirement(
    "MEM-COPY-D2H",
    "Device-to-host copies are byte-exact at odd sizes and source offsets, and write nothing outside the host range.",
)
def _d2h(t: Target) -> None:
    s = t.stream()
    for n in SIZES:
        for off in OFFSETS:
            buf = t.alloc(off + n + GUARD)
            content = pattern(t.rng, buf.nbytes)
            upload(buf, content, s)
            host = pattern(t.rng, n + 2 * GUARD)
            window = host[GUARD : GUARD + n]
            window[:] = unlike(content[off : off + n])
            expected = host.copy()
            expected[GUARD : GUARD + n] = content[off : off + n]
            path = hal.copy(window, buf, stream=s, src_offset=off, nbytes=n)
            s.synchronize()
            t.expect(
                path == "local", f"device-to-host copy reported path {path!r}, expected 'local'"
            )
            expect_bytes(
                host, expected, f"D2H of {n} bytes from src_offset={off} (with host guard bytes)"
            )
    data = np.linspace(-1, 1, 33, dtype=np.float64).reshape(3, 11)
    arr = hal.asarray(data, device=t.device)
    try:
        t.expect(
            np.array_equal(arr.to_host(), data),
            "hal.asarray(...).to_host() of a (3, 11) float64 array",
        )
        t.expect(
            arr.shape == (3, 11) and arr.dtype == np.float64,
            f"asarray kept shape/dtype: {arr.shape} {arr.dtype}",
        )
    finally:
        arr.close()


@requirement(
    "MEM-COPY-D2D",
    "Copies between two buffers of one device are byte-exact at odd sizes and offsets, report "
    "path 'local' and write nothing outside the range.",
)
def _d2d(t: Target) -> None:
    s = t.stream()
    for n in SIZES:
        for soff, doff in ((0, 0), (1, 3), (17, 1), (3, 0)):
            src = t.alloc(soff + n + GUARD)
            dst = t.alloc(doff + n + GUARD)
            sc = pattern(t.rng, src.nbytes)
            dc = pattern(t.rng, dst.nbytes)
            dc[doff : doff + n] = unlike(sc[soff : soff + n])
            upload(src, sc, s)
            upload(dst, dc, s)
            path = hal.copy(dst, src, stream=s, nbytes=n, dst_offset=doff, src_offset=soff)
            t.expect(path == "local", f"same-device copy reported path {path!r}, expected 'local'")
            expected = dc.copy()
            expected[doff : doff + n] = sc[soff : soff + n]
            expect_bytes(
                download(dst, s),
                expected,
                f"D2D of {n} bytes, src_offset={soff}, dst_offset={doff}",
            )
            expect_bytes(download(src, s), sc, "the source of a D2D copy")


@requirement(
    "MEM-COPY-OVERLAP",
    "A copy within one buffer between overlapping ranges behaves like memmove in both directions.",
)
def _overlap(t: Target) -> None:
    s = t.stream()
    size = 110_001
    buf = t.alloc(size)
    for n, shift in (
        (65_537, 1),
        (65_537, -1),
        (4097, 3),
        (4097, -4095),
        (40_000, 17),
        (40_000, -29_999),
    ):
        content = pattern(t.rng, size)
        upload(buf, content, s)
        soff = 30_000
        doff = soff + shift
        hal.copy(buf, buf, stream=s, nbytes=n, src_offset=soff, dst_offset=doff)
        expected = content.copy()
        expected[doff : doff + n] = content[soff : soff + n]
        expect_bytes(
            download(buf, s), expected, f"overlapping copy of {n} bytes shifted by {shift:+d}"
        )


@requirement(
    "MEM-COPY-DEFAULTS",
    "hal.copy without nbytes copies from src_offset to the end of the source, whatever the direction.",
)
def _defaults(t: Target) -> None:
    s = t.stream()
    a = t.alloc(1001)
    b = t.alloc(1001)
    ca = pattern(t.rng, 1001)
    cb = unlike(ca)
    upload(a, ca, s)
    upload(b, cb, s)
    hal.copy(b, a, stream=s, src_offset=400)
    exp = cb.copy()
    exp[:601] = ca[400:]
    expect_bytes(download(b, s), exp, "D2D with nbytes=None from src_offset=400")
    host = np.zeros(601, np.uint8)
    hal.copy(host, a, stream=s, src_offset=400)
    s.synchronize()
    expect_bytes(host, ca[400:], "D2H with nbytes=None from src_offset=400")
    src = pattern(t.rng, 300)
    hal.copy(a, src, stream=s, dst_offset=701)
    exp = ca.copy()
    exp[701:] = src
    expect_bytes(download(a, s), exp, "H2D with nbytes=None at dst_offset=701")


@requirement(
    "MEM-MEMSET",
    "memset sets exactly nbytes bytes at offset to the value (every byte value, odd sizes and "
    "offsets) and nothing else.",
)
def _memset(t: Target) -> None:
    s = t.stream()
    values = [0, 1, 0x5A, 0x80, 0xFF, int(t.rng.integers(0, 256))]
    for i, n in enumerate(SIZES):
        for off in OFFSETS:
            value = values[(i + off) % len(values)]
            buf = t.alloc(off + n + GUARD)
            content = pattern(t.rng, buf.nbytes)
            content[content == value] ^= 1
            upload(buf, content, s)
            hal.memset(buf, value, stream=s, offset=off, nbytes=n)
            expected = content.copy()
            expected[off : off + n] = value
            expect_bytes(
                download(buf, s), expected, f"memset({value:#04x}) of {n} bytes at offset {off}"
            )
    buf = t.alloc(999)
    content = pattern(t.rng, 999)
    content[content == 7] = 8
    upload(buf, content, s)
    hal.memset(buf, 7, stream=s, offset=990)
    expected = content.copy()
    expected[990:] = 7
    expect_bytes(download(buf, s), expected, "memset with nbytes=None from offset 990 of 999")
    arr = buf.view(np.uint16, 4, offset=100)
    hal.memset(arr, 0xFF, stream=s)
    expected[100:108] = 0xFF
    expect_bytes(download(buf, s), expected, "memset of a hal.Array view (8 bytes at offset 100)")


@requirement(
    "MEM-CLOSE",
    "Buffer.close() is idempotent and releases the memory (memory_in_use returns to its value "
    "when tracked), as do the context manager, Array.close() of hal.asarray, and garbage "
    "collection.",
)
def _close(t: Target) -> None:
    dev = t.device
    base = dev.memory_in_use

    def in_use(what: str) -> None:
        dev.empty_cache()  # hal's pool gives its cache back: a backend whose free() loses bytes shows
        now = dev.memory_in_use
        t.expect(now == base, f"memory_in_use is {now} after {what}; it was {base} before")

    b = dev.alloc(100_003)
    t.expect(not b.closed, "a new buffer says it is closed")
    b.close()
    t.expect(b.closed, "a buffer does not say it is closed after close()")
    b.close()
    in_use("alloc + close + close")
    with dev.alloc(77_777) as c:
        t.expect(not c.closed, "buffer closed inside its with-block")
    t.expect(c.closed, "the context manager did not close the buffer")
    in_use("a with-block")
    arr = hal.asarray(np.arange(10_000, dtype=np.float32), device=dev)
    arr.close()
    t.expect(arr.buffer.closed, "Array.close() of hal.asarray did not close its buffer")
    in_use("hal.asarray + Array.close()")
    many = [dev.alloc(int(n)) for n in t.rng.integers(1, 50_000, size=200)]
    for x in many:
        x.close()
    in_use("200 allocations and closes")
    d = dev.alloc(55_555)
    del d
    gc.collect()
    in_use("dropping an unclosed buffer (garbage collection)")


@requirement(
    "MEM-USE-AFTER-CLOSE",
    "Every use of a closed Buffer (copies either way, memset, view, to_host, DLPack) raises "
    "hal.InvalidBufferError and writes nothing.",
)
def _use_after_close(t: Target) -> None:
    s = t.stream()
    live = t.alloc(256)
    ref = pattern(t.rng, 256)
    upload(live, ref, s)
    dead = t.alloc(256)
    arr = dead.view(np.uint8)
    dead.close()
    host = pattern(t.rng, 256)
    host_ref = host.copy()
    E = hal.InvalidBufferError
    raises(E, "copy(host, closed buffer)", hal.copy, host, dead, stream=s)
    raises(E, "copy(closed buffer, host)", hal.copy, dead, host, stream=s)
    raises(E, "copy(live buffer, closed buffer)", hal.copy, live, dead, stream=s)
    raises(E, "copy(closed buffer, live buffer)", hal.copy, dead, live, stream=s)
    raises(E, "copy(host, array over a closed buffer)", hal.copy, host, arr, stream=s)
    raises(E, "memset(closed buffer)", hal.memset, dead, 1, stream=s)
    raises(E, "memset(array over a closed buffer)", hal.memset, arr, 1, stream=s)
    raises(E, "closed buffer .view()", dead.view, np.uint8)
    raises(E, "to_host() of an array over a closed buffer", arr.to_host, stream=s)
    raises((E, BufferError), "__dlpack__ of an array over a closed buffer", arr.__dlpack__)
    s.synchronize()
    expect_bytes(host, host_ref, "host memory after failed copies from a closed buffer")
    expect_bytes(download(live, s), ref, "a live buffer after failed copies involving a closed one")
