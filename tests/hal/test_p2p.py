"""Peer access between devices of one backend: queries, enabling, peer copies, the P2P matrix."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hal
from hal.cli import main as hal_main


def _read(buf: hal.Buffer) -> np.ndarray:
    return buf.view(np.uint8).to_host()


def test_peer_access_is_symmetric_and_matches_capability(
    device_pair: tuple[hal.Device, hal.Device],
) -> None:
    a, b = device_pair
    assert a.can_access_peer(b) == b.can_access_peer(a)
    if a.can_access_peer(b):
        assert a.capabilities.p2p and b.capabilities.p2p
    if not a.capabilities.p2p:
        assert not a.can_access_peer(b)
        assert a.capabilities.reason_absent("p2p")


def test_no_peer_access_to_itself(device: hal.Device) -> None:
    assert not device.can_access_peer(device)
    with pytest.raises(hal.DeviceMismatchError, match="cannot access peer"):
        device.enable_peer_access(device)


def test_peer_arguments_must_be_devices(device: hal.Device) -> None:
    with pytest.raises(TypeError, match="other="):
        device.can_access_peer("cpu:1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="other="):
        device.enable_peer_access(None)  # type: ignore[arg-type]


def test_enable_peer_access(device_pair: tuple[hal.Device, hal.Device]) -> None:
    a, b = device_pair
    if not a.can_access_peer(b):
        with pytest.raises(hal.DeviceMismatchError):
            a.enable_peer_access(b)
        pytest.skip(f"{a} and {b} have no peer path: {a.capabilities.reason_absent('p2p')}")
    a.enable_peer_access(b)
    b.enable_peer_access(a)
    a.enable_peer_access(b)  # enabling twice is harmless


def test_no_peer_access_across_backends() -> None:
    devs = hal.devices()
    pairs = [(x, y) for x in devs for y in devs if x.backend != y.backend]
    if not pairs:
        pytest.skip("only one backend is available")
    for x, y in pairs:
        assert not x.can_access_peer(y)
        with pytest.raises(hal.DeviceMismatchError):
            x.enable_peer_access(y)


def test_peer_copy_round_trip(device_pair: tuple[hal.Device, hal.Device]) -> None:
    """cpu:0 -> cpu:1 -> cpu:0 through peer copies, ordered across the two streams by events."""
    a, b = device_pair
    expected = "peer" if a.can_access_peer(b) else "staged"
    if expected == "peer":
        a.enable_peer_access(b)
        b.enable_peer_access(a)
    data = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    with (
        a.create_stream() as sa,
        b.create_stream() as sb,
        a.alloc(data.nbytes) as x,
        b.alloc(data.nbytes) as y,
        a.alloc(data.nbytes) as z,
    ):
        hal.copy(x, data, stream=sa)
        ev = a.create_event()
        ev.record(sa)
        sb.wait(ev)
        assert hal.copy(y, x, stream=sb) == expected
        ev2 = b.create_event()
        ev2.record(sb)
        sa.wait(ev2)
        assert hal.copy(z, y, stream=sa) == expected
        out = np.empty_like(data)
        hal.copy(out, z, stream=sa)
        sa.synchronize()
        np.testing.assert_array_equal(out, data)


def test_info_p2p_matrix_matches_can_access_peer(
    backend_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert hal_main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    entry = next(b for b in info["backends"] if b["name"] == backend_name)
    devs = hal.devices(backend_name)
    assert len(entry["p2p"]) == len(devs)
    for i, a in enumerate(devs):
        for j, b in enumerate(devs):
            want = "local" if i == j else ("peer" if a.can_access_peer(b) else "staged")
            assert entry["p2p"][i][j] == want
