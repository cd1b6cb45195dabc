"""Broken, incompatible and unavailable plugins are quarantined with a reason; the others work.

Every fixture distribution of ``PLUGIN_SOURCES`` is installed in one folder (the "zoo") on
the ``PYTHONPATH`` of real ``hal`` subprocesses, next to the built-in ``cpu`` plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hal

# Keep the vendor SDKs out of these runs (faster); fxblocked is the plugin under test.
DISABLED = "fxblocked,opencl,cuda"

_CPU_WORKS = """
import json
import numpy as np
import hal

a, b = hal.device("cpu:0"), hal.device("fxcpu:1")
data = np.arange(200, dtype=np.uint8)
with a.create_stream() as s:
    x = hal.asarray(data, device=a)
    y = b.alloc(200)
    path = hal.copy(y, x, stream=s, nbytes=150, src_offset=50)
    s.synchronize()
print(json.dumps({
    "order": [i.name for i in hal.list_backends()],
    "devices": [str(d) for d in hal.devices()],
    "path": path,
    "copy_path": hal.copy_path(x, y),
    "peer": a.can_access_peer(b),
    "ok": bool((y.view(np.uint8, 150).to_host() == data[50:]).all()),
}))
"""


@pytest.fixture(scope="module")
def zoo_run(
    zoo: Path, python_run: Callable[..., Any], python_json: Callable[..., Any]
) -> dict[str, Any]:
    """Run ``hal plugins --json``, ``hal info --json``, ``hal info`` and a cpu job over the zoo."""
    run_json, run_python = python_json, python_run
    env = {"HAL_DISABLE_BACKENDS": DISABLED, "HAL_LOG_LEVEL": "warning"}
    plugins = run_json(["-m", "hal", "plugins", "--json"], env=env, pythonpath=[zoo])
    info = run_json(["-m", "hal", "info", "--json"], env=env, pythonpath=[zoo])
    text = run_python(["-m", "hal", "info"], env=env, pythonpath=[zoo])
    job = run_json(["-c", _CPU_WORKS], env=env, pythonpath=[zoo])
    return {
        "plugins": {p["name"]: p for p in plugins["plugins"]},
        "backends": {b["name"]: b for b in info["backends"]},
        "order": [b["name"] for b in info["backends"]],
        "text": text.stdout,
        "stderr": text.stderr,
        "job": job,
    }


def test_cpu_works_beside_broken_plugins(zoo_run: dict[str, Any]) -> None:
    cpu = zoo_run["backends"]["cpu"]
    assert cpu["status"] == "available" and cpu["reason"] == ""
    assert [d["index"] for d in cpu["devices"]] == [0, 1]
    assert zoo_run["plugins"]["cpu"]["status"] == "loaded"
    job = zoo_run["job"]
    assert job["ok"], job
    assert job["devices"][:2] == ["cpu:0", "cpu:1"]


def test_second_backend_from_a_plugin_copies_staged(zoo_run: dict[str, Any]) -> None:
    """Two backends in one process: a copy between them travels through the host, and says so."""
    assert zoo_run["backends"]["fxcpu"]["status"] == "available"
    assert zoo_run["plugins"]["fxcpu"]["dist"] == "hal-fixture-fxcpu"
    assert zoo_run["plugins"]["fxcpu"]["dist_version"] == "1.0"
    job = zoo_run["job"]
    assert job["peer"] is False
    assert job["path"] == "staged" and job["copy_path"] == "staged"


def test_import_error_is_quarantined(zoo_run: dict[str, Any]) -> None:
    row = zoo_run["plugins"]["fxbroken"]
    assert row["status"] == "failed"
    assert "RuntimeError: fixture import boom" in row["reason"]
    assert "hal_fixture_fxbroken" in row["reason"]
    backend = zoo_run["backends"]["fxbroken"]
    assert backend["status"] == "failed" and "fixture import boom" in backend["reason"]
    assert backend["devices"] == []


def test_hook_error_is_quarantined(zoo_run: dict[str, Any]) -> None:
    row = zoo_run["plugins"]["fxhook"]
    assert row["status"] == "failed"
    assert "hal_register_backends raised ValueError: fixture hook boom" in row["reason"]
    assert zoo_run["backends"]["fxhook"]["status"] == "failed"


def test_misspelled_hook_is_refused(zoo_run: dict[str, Any]) -> None:
    """check_pending() turns an implementation of an unknown hal_* hook into a failure."""
    row = zoo_run["plugins"]["fxtypo"]
    assert row["status"] == "failed"
    assert "hal_register_backend" in row["reason"]
    assert zoo_run["backends"]["fxtypo"]["status"] == "failed"


def test_registering_a_non_backend_is_refused(zoo_run: dict[str, Any]) -> None:
    row = zoo_run["plugins"]["fxbadclass"]
    assert row["status"] == "failed"
    assert "TypeError" in row["reason"] and "BackendImpl" in row["reason"]


def test_incompatible_hal_requirement_refused_without_import(
    zoo_run: dict[str, Any], zoo: Path, imported: Callable[[Path, str], bool]
) -> None:
    row = zoo_run["plugins"]["fxold"]
    assert row["status"] == "failed"
    assert "hal-sdk<0.1" in row["reason"] and hal.__version__ in row["reason"]
    assert "hal-fixture-fxold" in row["reason"]
    assert zoo_run["backends"]["fxold"]["status"] == "failed"
    assert not imported(zoo, "fxold"), "a plugin refused by its metadata was imported"


def test_extra_only_requirement_does_not_refuse(zoo_run: dict[str, Any]) -> None:
    """fxcpu requires ``hal-sdk<0.1`` only for an extra; that does not make it incompatible."""
    assert zoo_run["plugins"]["fxcpu"]["status"] == "loaded"


def test_incompatible_api_major_is_refused(zoo_run: dict[str, Any]) -> None:
    backend = zoo_run["backends"]["fxapi2"]
    assert backend["status"] == "failed"
    assert "2.0" in backend["reason"] and "1.x" in backend["reason"]
    assert backend["api_version"] == "2.0"


def test_unavailable_backend_reports_reason(zoo_run: dict[str, Any]) -> None:
    backend = zoo_run["backends"]["fxunavail"]
    assert backend["status"] == "unavailable"
    assert backend["reason"] == "no fixture device: install fixture-sdk"
    assert backend["devices"] == []
    assert zoo_run["plugins"]["fxunavail"]["status"] == "loaded"


def test_probe_crash_is_failed(zoo_run: dict[str, Any]) -> None:
    backend = zoo_run["backends"]["fxprobe"]
    assert backend["status"] == "failed"
    assert "RuntimeError: fixture probe boom" in backend["reason"]


def test_duplicate_backend_name_is_reported(zoo_run: dict[str, Any]) -> None:
    """A plugin registering an existing backend name does not replace it, and says why."""
    assert zoo_run["backends"]["cpu"]["plugin"] == "cpu"
    row = zoo_run["plugins"]["fxdup"]
    assert row["status"] == "failed"
    assert "already registered" in row["reason"]


def test_blocked_plugin_is_never_imported(
    zoo_run: dict[str, Any], zoo: Path, imported: Callable[[Path, str], bool]
) -> None:
    row = zoo_run["plugins"]["fxblocked"]
    assert row["status"] == "blocked" and "HAL_DISABLE_BACKENDS" in row["reason"]
    assert zoo_run["backends"]["fxblocked"]["status"] == "blocked"
    assert not imported(zoo, "fxblocked")
    assert imported(zoo, "fxbroken") and imported(zoo, "fxcpu")  # the marker mechanism works


def test_text_info_shows_failures_with_reasons(zoo_run: dict[str, Any]) -> None:
    text = zoo_run["text"]
    assert "backend fxbroken: failed" in text
    assert "fixture import boom" in text
    assert "backend fxunavail: unavailable" in text
    assert "backend cpu: available" in text


def test_quarantine_is_logged(zoo_run: dict[str, Any]) -> None:
    """Failures are never silent: HAL_LOG_LEVEL=warning shows each quarantined plugin."""
    for name in ("fxbroken", "fxhook", "fxtypo", "fxold"):
        assert f"plugin {name} quarantined" in zoo_run["stderr"], zoo_run["stderr"]


def test_every_plugin_and_backend_is_listed(zoo_run: dict[str, Any], zoo: Path) -> None:
    names = {p.name.split("-")[0].removeprefix("hal_fixture_") for p in zoo.glob("*.dist-info")}
    assert names <= set(zoo_run["plugins"])
    assert names - {"fxdup"} <= set(zoo_run["backends"])
    # issue #11: real backends first, the CPU emulators (BackendImpl.emulator) after them
    order = zoo_run["order"]
    assert (
        order.index("fxprobe")
        < order.index("fxunavail")
        < order.index("cpu")
        < order.index("fxcpu")
    ), order
