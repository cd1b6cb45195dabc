"""P2P-*: peer-query consistency, peer copies, copies between devices whatever the path."""

from __future__ import annotations

import itertools

import numpy as np

import hal
from hal.conformance._checks import download, expect_bytes, heavy, pattern, raises, unlike, upload
from hal.conformance._registry import requirement
from hal.conformance._target import Target

_SIZES = (1, 3, 4097, 65_537, 1 << 20 | 5)
_OFFS = ((0, 0), (1, 3), (17, 0))


@requirement(
    "P2P-QUERY",
    "can_access_peer is false for a device itself, stable and symmetric, true only between "
    "devices declaring p2p (each of which has a peer), and copy_path says 'peer' exactly when it "
    "is true.",
    scope="backend",
)
def _query(t: Target) -> None:
    devs = t.all_devices
    probe = {d: t.alloc(1, d) for d in devs}
    host = np.zeros(1, np.uint8)
    for d in devs:
        t.expect(d.can_access_peer(d) is False, f"{d}.can_access_peer({d}) is not False")
        for kind, path in (
            ("host->device", hal.copy_path(probe[d], host)),
            ("device->host", hal.copy_path(host, probe[d])),
            ("same device", hal.copy_path(probe[d], probe[d])),
        ):
            t.expect(path == "local", f"copy_path {kind} on {d} is {path!r}, expected 'local'")
    for a, b in itertools.permutations(devs, 2):
        answers = {bool(a.can_access_peer(b)) for _ in range(3)}
        t.expect(len(answers) == 1, f"{a}.can_access_peer({b}) changes between calls")
        ab = answers.pop()
        ba = bool(b.can_access_peer(a))
        t.expect(ab == ba, f"{a}.can_access_peer({b}) is {ab} but {b}.can_access_peer({a}) is {ba}")
        path = hal.copy_path(probe[a], probe[b])
        t.expect(
            path == ("peer" if ab else "staged"),
            f"copy_path({a} <- {b}) is {path!r} while {a}.can_access_peer({b}) is {ab}",
        )
        if ab:
            for d in (a, b):
                why = d.capabilities.reason_absent("p2p")
                t.expect(
                    why is None,
                    f"{a} and {b} report a peer path, but {d} declares p2p absent ({why})",
                )
    for d in devs:
        if d.capabilities.p2p:
            t.expect(
                any(d.can_access_peer(o) for o in devs if o != d),
                f"{d} declares p2p but can access no other device of the backend",
            )


@requirement(
    "P2P-ENABLE",
    "enable_peer_access succeeds (repeatably) for a pair with peer access and raises "
    "hal.DeviceMismatchError for a pair without.",
    scope="pair",
)
def _enable(t: Target) -> None:
    a, b = t.device, t.peer
    if a.can_access_peer(b):
        a.enable_peer_access(b)
        a.enable_peer_access(b)
    else:
        raises(
            hal.DeviceMismatchError,
            f"{a}.enable_peer_access({b}) without peer access",
            a.enable_peer_access,
            b,
        )


def _cross_copies(t: Target, want_path: str | None) -> None:
    a, b = t.device, t.peer
    sa, sb = t.stream(a), t.stream(b)
    for which, s in (("destination", sa), ("source", sb)):
        for n in _SIZES:
            for soff, doff in _OFFS:
                src, dst = t.alloc(soff + n + 5, b), t.alloc(doff + n + 5, a)
                sc = pattern(t.rng, src.nbytes)
                dc = pattern(t.rng, dst.nbytes)
                dc[doff : doff + n] = unlike(sc[soff : soff + n])
                upload(src, sc, sb)
                upload(dst, dc, sa)
                path = hal.copy(dst, src, stream=s, nbytes=n, src_offset=soff, dst_offset=doff)
                t.expect(
                    path == hal.copy_path(dst, src),
                    f"copy returned path {path!r}, copy_path says otherwise",
                )
                if want_path is not None:
                    t.expect(
                        path == want_path,
                        f"copy {a} <- {b} took path {path!r}, expected {want_path!r}",
                    )
                exp = dc.copy()
                exp[doff : doff + n] = sc[soff : soff + n]
                what = f"{a} <- {b} copy of {n} bytes (src_offset={soff}, dst_offset={doff}, {which} stream, {path})"
                s.synchronize()
                expect_bytes(download(dst, sa), exp, what)
                expect_bytes(download(src, sb), sc, f"the source of a {what}")
    _ordered(t, sa, sb)


def _ordered(t: Target, sa: hal.Stream, sb: hal.Stream) -> None:
    """A cross-device copy runs in its stream's order: after earlier work, before later work."""
    a, b = t.device, t.peer
    n = 65_537
    half = n // 2
    for rnd in range(2):
        src, dst = t.alloc(n, b), t.alloc(n, a)
        sc = pattern(t.rng, n)
        sc[sc == 0x3C] = 0x3D
        upload(src, sc, sb)
        upload(dst, unlike(sc), sa)
        # on the source device's stream: the copy sees a memset enqueued before it
        heavy(t, sb)
        hal.memset(src, 0x3C, stream=sb)
        hal.copy(dst, src, stream=sb)
        sb.synchronize()
        expect_bytes(
            download(dst, sa),
            np.full(n, 0x3C, np.uint8),
            f"round {rnd}: {a} <- {b} copy on {b}'s stream after a memset of the source",
        )
        # on the destination device's stream: after earlier work, before later work
        upload(src, sc, sb)
        heavy(t, sa)
        hal.memset(dst, 0x00, stream=sa)
        hal.copy(dst, src, stream=sa)
        hal.memset(dst, 0xA5, stream=sa, nbytes=half)
        sa.synchronize()
        exp = sc.copy()
        exp[:half] = 0xA5
        expect_bytes(
            download(dst, sa),
            exp,
            f"round {rnd}: {a} <- {b} copy on {a}'s stream between two memsets of the destination",
        )


@requirement(
    "P2P-COPY",
    "Peer copies (path 'peer') are byte-exact at odd sizes and offsets, run in stream order with "
    "a stream of either device, and write nothing outside the range.",
    needs="p2p",
    scope="pair",
)
def _peer_copy(t: Target) -> None:
    if not t.device.can_access_peer(t.peer):
        raise t.not_applicable(
            f"{t.device}.can_access_peer({t.peer}) is False: the backend declares no peer path here",
            capability="p2p",
        )
    t.device.enable_peer_access(t.peer)
    _cross_copies(t, "peer")


@requirement(
    "P2P-CROSS-DEVICE",
    "Copies between two devices of the backend are byte-exact whatever the path (peer or staged) "
    "and run in stream order, with a stream of either device.",
    scope="pair",
)
def _any_copy(t: Target) -> None:
    _cross_copies(t, None)
