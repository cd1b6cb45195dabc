"""Discovery: ``hal.list_backends()``, ``hal.devices()``, ``hal.device(spec)``, ``hal info --json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

import hal
from hal.cli import main as hal_main

STATUSES = {"available", "unavailable", "failed", "blocked"}


@pytest.mark.usefixtures("requires_cpu")
def test_backends_report_status_and_metadata() -> None:
    infos = hal.list_backends()
    names = [b.name for b in infos]
    assert "cpu" in names
    assert len(names) == len(set(names))
    for b in infos:
        assert isinstance(b, hal.BackendInfo)
        assert b.status in STATUSES, b
        assert (b.reason == "") == (b.status == "available"), b
        assert (b.device_count > 0) == (b.status == "available"), b
        assert set(b.to_dict()) >= {"name", "status", "reason", "dist", "version", "api_version"}
    cpu = next(b for b in infos if b.name == "cpu")
    assert cpu.status == "available"
    assert cpu.dist == "hal-sdk" and cpu.version == hal.__version__
    assert cpu.api_version == ".".join(map(str, hal.API_VERSION))


@pytest.mark.usefixtures("requires_cpu")
def test_emulator_is_last_by_default() -> None:
    """Issue #11: without HAL_BACKENDS real devices come first, the CPU emulator after them."""
    import os

    if os.environ.get("HAL_BACKENDS"):
        pytest.skip("HAL_BACKENDS sets the order")
    names = [b.name for b in hal.list_backends()]
    assert names[-1] == "cpu", names
    devs = hal.devices()
    real = [d for d in devs if d.backend != "cpu"]
    assert devs == real + hal.devices("cpu")
    if real:
        assert devs[0] == real[0] and devs[0].backend != "cpu"


def test_devices_of_each_backend(backend_name: str) -> None:
    devs = hal.devices(backend_name)
    assert devs, backend_name
    assert [d.index for d in devs] == list(range(len(devs)))
    for d in devs:
        assert d.backend == backend_name
        assert str(d) == f"{backend_name}:{d.index}"
        assert hal.device(str(d)) == d
        assert hash(hal.device(str(d))) == hash(d)
        assert isinstance(d.name, str) and d.name
        assert isinstance(d.vendor, str)
        assert isinstance(d.total_memory, int) and d.total_memory > 0
        assert isinstance(d.capabilities, hal.Capabilities)
        assert isinstance(d.properties(), dict)
        assert repr(d).startswith("<hal.Device")
    assert hal.device(backend_name) == devs[0]
    assert all(d in hal.devices() for d in devs)


@pytest.mark.usefixtures("requires_cpu")
def test_device_by_spec() -> None:
    d = hal.device("cpu:1")
    assert (d.backend, d.index) == ("cpu", 1)
    assert d != hal.device("cpu:0")
    assert d.capabilities.p2p


@pytest.mark.parametrize(
    ("spec", "exc", "text"),
    [
        ("cpu:99", ValueError, "has 2 device"),
        ("cpu:x", ValueError, "'cpu:x' must look like"),
        ("cpu:-1", ValueError, "must look like"),
        ("cpu:", ValueError, "must look like"),
        (":0", ValueError, "must look like"),
        ("", ValueError, "must look like"),
        ("nosuch:0", ValueError, "'nosuch' is not a known backend"),
        (1, TypeError, "spec=1"),
        (None, TypeError, "spec=None"),
    ],
)
@pytest.mark.usefixtures("requires_cpu")
def test_bad_device_specs(spec: object, exc: type[Exception], text: str) -> None:
    if spec == "cpu:99" and len(hal.devices("cpu")) != 2:
        text = "device"
    with pytest.raises(exc, match=text):
        hal.device(spec)  # type: ignore[arg-type]


def test_bad_backend_names() -> None:
    with pytest.raises(ValueError, match="known"):
        hal.devices("nosuch")
    with pytest.raises(TypeError, match="backend=3"):
        hal.devices(3)  # type: ignore[arg-type]


def test_unavailable_backends_say_why() -> None:
    for b in hal.list_backends():
        if b.status == "available":
            continue
        with pytest.raises(hal.BackendUnavailableError) as info:
            hal.devices(b.name)
        assert info.value.backend == b.name
        assert b.reason in str(info.value)
        assert b.status in str(info.value)


def test_devices_cannot_be_constructed() -> None:
    with pytest.raises(TypeError, match=r"hal\.devices"):
        hal.Device("cpu", 0, None)  # type: ignore[arg-type]


def _check_info_schema(info: dict[str, Any]) -> None:
    assert isinstance(info["backends"], list) and info["backends"]
    for b in info["backends"]:
        assert {"name", "status", "reason", "devices"} <= set(b), b
        assert b["status"] in STATUSES
        assert isinstance(b["reason"], str)
        for d in b["devices"]:
            assert {"index", "name"} <= set(d)
            assert isinstance(d["index"], int) and isinstance(d["name"], str)
            assert isinstance(d["capabilities"], dict)
        assert len(b["devices"]) == b["device_count"]


def test_info_json_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert hal_main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    _check_info_schema(info)
    by_name = {b["name"]: b for b in info["backends"]}
    assert [b["name"] for b in info["backends"]] == [b.name for b in hal.list_backends()]
    for dev in hal.devices():
        entry = by_name[dev.backend]["devices"][dev.index]
        assert entry["index"] == dev.index and entry["name"] == dev.name
        assert entry["capabilities"] == dev.capabilities.to_dict()


@pytest.mark.usefixtures("requires_cpu")
def test_info_text_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert hal_main(["info"]) == 0
    out = capsys.readouterr().out
    assert "backend cpu: available" in out
    assert "cpu:1" in out


def test_info_json_command(python_json: Callable[..., Any]) -> None:
    info = python_json(["-m", "hal", "info", "--json"], env={"HAL_CPU_DEVICES": "3"})
    _check_info_schema(info)
    cpu = next(b for b in info["backends"] if b["name"] == "cpu")
    assert cpu["status"] == "available" and [d["index"] for d in cpu["devices"]] == [0, 1, 2]
    assert cpu["p2p"][0] == ["local", "peer", "peer"]


def test_plugins_json_command(python_json: Callable[..., Any]) -> None:
    out = python_json(["-m", "hal", "plugins", "--json"])
    rows = {p["name"]: p for p in out["plugins"]}
    assert {"cpu", "opencl", "cuda"} <= set(rows)
    cpu = rows["cpu"]
    assert cpu["status"] == "loaded" and cpu["dist"] == "hal-sdk" and cpu["backends"] == ["cpu"]
    assert cpu["value"] == "hal.backends.cpu:plugin"
    for row in rows.values():
        assert {"name", "value", "dist", "dist_version", "status", "reason", "backends"} <= set(row)


def test_version_flag(python_run: Callable[..., Any]) -> None:
    assert python_run(["-m", "hal", "--version"]).stdout.strip() == hal.__version__


def test_backends_is_a_deprecated_name_of_list_backends() -> None:
    """``hal.backends()`` keeps working for hal-sdk 1.x with a DeprecationWarning, in both forms."""
    import hal._discovery

    want = [b.name for b in hal.list_backends()]
    with pytest.warns(DeprecationWarning, match=r"hal\.list_backends\(\)"):
        assert [b.name for b in hal._discovery.backends()] == want
    import hal.backends.cpu  # binds the package to the hal.backends attribute

    with pytest.warns(DeprecationWarning, match=r"hal\.list_backends\(\)"):
        assert [b.name for b in hal.backends()] == want  # type: ignore[operator]
