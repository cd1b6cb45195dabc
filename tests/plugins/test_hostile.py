"""Plugins that cannot take the process down: hangs, SystemExit, KeyboardInterrupt, shadowed names.

Each case installs one fixture distribution (tests/plugins/conftest.py) and runs real ``hal``
subprocesses with a wall-clock guard (a hang must not stall the suite): before the time limit
(``HAL_PLUGIN_TIMEOUT_S``) these hung forever, or ended the application silently, or served a
third-party backend under a disabled built-in's name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HANG_IMPORT = """
import time
time.sleep(3600)
"""

_HANG_PROBE = """
import time
from hal.plugins import hookimpl
from hal.spi import BackendImpl

class HangingBackend(BackendImpl):
    name = "fxhangprobe"

    def __init__(self):
        pass

    def devices(self):
        time.sleep(3600)
        return []

@hookimpl
def hal_register_backends(registry):
    registry.add(HangingBackend)
"""

_HANG_HOOK = """
import time
from hal.plugins import hookimpl

@hookimpl
def hal_register_backends(registry):
    time.sleep(3600)
"""

_EXIT = """
import sys
sys.exit(0)
"""

_INTERRUPT = """
raise KeyboardInterrupt
"""

_SHADOW_CPU = """
from hal.backends.cpu import CpuBackend
from hal.plugins import hookimpl

class ImpostorBackend(CpuBackend):
    name = "cpu"

@hookimpl
def hal_register_backends(registry):
    registry.add(ImpostorBackend)
"""

_REPORT = """
import json, hal, hal.plugins, hal.comm
system = hal.plugins.get_system()
comm = hal.comm.init()  # a world of one rank: must not hang on a plugin
print(json.dumps({
    "plugins": {p.name: p.to_dict() for p in system.plugins if p.dist != "hal-sdk" or p.name == "cpu"},
    "backends": {b.name: {"status": b.status, "reason": b.reason} for b in hal.list_backends()},
    "devices": [str(d) for d in hal.devices()],
    "comm_device": str(comm.device),
}))
comm.close()
"""

_GUARD_S = 60  # far above the 1 s limit; a regression shows as a TimeoutExpired, not a stuck suite


def _run(root: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.update({"HAL_PLUGIN_TIMEOUT_S": "1", "HAL_DISABLE_BACKENDS": "opencl,cuda", **env})
    child["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [child.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, *args],
        env=child,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=_GUARD_S,
        check=False,
    )


def _report(root: Path, **env: str) -> dict[str, Any]:
    proc = _run(root, ["-c", _REPORT], **env)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_hanging_import_is_quarantined(custom_dist: Callable[..., Path]) -> None:
    root = custom_dist("fxhangimport", _HANG_IMPORT)
    out = _report(root)
    rec = out["plugins"]["fxhangimport"]
    assert rec["status"] == "failed"
    assert "timed out after 1 s (HAL_PLUGIN_TIMEOUT_S)" in rec["reason"]
    assert out["backends"]["fxhangimport"]["status"] == "failed"
    assert out["devices"][:2] == ["cpu:0", "cpu:1"] and out["comm_device"] == "cpu:0"


def test_hanging_probe_is_quarantined(custom_dist: Callable[..., Path]) -> None:
    root = custom_dist("fxhangprobe", _HANG_PROBE)
    out = _report(root)
    assert out["backends"]["fxhangprobe"] == {
        "status": "failed",
        "reason": "probe timed out after 1 s (HAL_PLUGIN_TIMEOUT_S)",
    }
    assert out["plugins"]["fxhangprobe"]["status"] == "failed"
    assert "timed out" in out["plugins"]["fxhangprobe"]["reason"]
    assert "cpu:0" in out["devices"]


def test_hanging_hook_is_quarantined_and_hal_info_returns(custom_dist: Callable[..., Path]) -> None:
    root = custom_dist("fxhanghook", _HANG_HOOK)
    proc = _run(root, ["-m", "hal", "info", "--json"])
    assert proc.returncode == 0, proc.stderr
    backends = {b["name"]: b for b in json.loads(proc.stdout)["backends"]}
    assert backends["fxhanghook"]["status"] == "failed"
    assert "hal_register_backends timed out after 1 s" in backends["fxhanghook"]["reason"]
    assert backends["cpu"]["status"] == "available"


def test_sys_exit_in_import_does_not_end_the_application(custom_dist: Callable[..., Path]) -> None:
    root = custom_dist("fxexit", _EXIT)
    proc = _run(root, ["-c", "import hal; print('devices', len(hal.devices('cpu')))"])
    assert proc.returncode == 0 and proc.stdout.strip() == "devices 2", (proc.stdout, proc.stderr)
    assert "plugin fxexit quarantined" in proc.stderr and "SystemExit(0)" in proc.stderr
    out = _report(root)
    assert out["plugins"]["fxexit"]["status"] == "failed"
    assert (
        "SystemExit(0) (a plugin may not end the application)" in out["plugins"]["fxexit"]["reason"]
    )


def test_keyboard_interrupt_from_a_plugin_is_quarantined(custom_dist: Callable[..., Path]) -> None:
    root = custom_dist("fxinterrupt", _INTERRUPT)
    out = _report(root)
    assert out["plugins"]["fxinterrupt"]["status"] == "failed"
    assert (
        "KeyboardInterrupt raised by the plugin itself" in out["plugins"]["fxinterrupt"]["reason"]
    )


def test_third_party_cannot_serve_a_disabled_builtin_name(custom_dist: Callable[..., Path]) -> None:
    """HAL_DISABLE_BACKENDS=cpu: a plugin registering a backend named ``cpu`` is refused, loudly."""
    root = custom_dist("fximpostor", _SHADOW_CPU)
    script = (
        "import json, hal, hal.plugins\n"
        "s = hal.plugins.get_system()\n"
        "print(json.dumps({'cpu': hal.list_backends()[[b.name for b in hal.list_backends()].index('cpu')].status,"
        " 'plugin': [p.to_dict() for p in s.plugins if p.name == 'fximpostor'][0],"
        " 'devices': [str(d) for d in hal.devices()]}))\n"
    )
    proc = _run(root, ["-c", script], HAL_DISABLE_BACKENDS="cpu,opencl,cuda")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["cpu"] == "blocked" and out["devices"] == []
    assert out["plugin"]["status"] == "failed"
    assert "backend name 'cpu' belongs to plugin 'cpu'" in out["plugin"]["reason"]
    assert "HalWarning: hal: plugin 'fximpostor' refused" in proc.stderr


def test_third_party_entry_point_named_like_a_builtin_is_refused(
    custom_dist: Callable[..., Path], imported: Callable[[Path, str], bool]
) -> None:
    root = custom_dist("fxcpuname", _SHADOW_CPU, entry_point="cpu")
    proc = _run(root, ["-m", "hal", "plugins", "--json"], HAL_DISABLE_BACKENDS="cpu,opencl,cuda")
    assert proc.returncode == 0, proc.stderr
    recs = [p for p in json.loads(proc.stdout)["plugins"] if p["name"] == "cpu"]
    assert [r["dist"] for r in recs] == ["hal-sdk", "hal-fixture-fxcpuname"]
    assert recs[0]["status"] == "blocked" and recs[1]["status"] == "failed"
    assert "already taken by distribution hal-sdk" in recs[1]["reason"]
    assert "HalWarning" in proc.stderr
    assert not imported(root, "fxcpuname")


def test_bad_plugin_timeout_is_named(tmp_path: Path) -> None:
    proc = _run(tmp_path, ["-c", "import hal; hal.devices()"], HAL_PLUGIN_TIMEOUT_S="inf")
    assert proc.returncode != 0
    assert (
        "ConfigError: HAL_PLUGIN_TIMEOUT_S='inf' is not a finite number; allowed: a finite number in (0, 3600] s"
        in proc.stderr
    )


def _patched_cpu(name: str, patch: str) -> str:
    """The source of a vendor plugin: the cpu backend as ``name``, each device changed by ``patch``
    (code run with the device as ``d``)."""
    body = textwrap.indent(textwrap.dedent(patch).strip(), " " * 12)
    return f"""
from hal.backends.cpu import CpuBackend
from hal.plugins import hookimpl

class PatchedBackend(CpuBackend):
    name = "{name}"

    def devices(self):
        devs = super().devices()
        for d in devs:
{body}
        return devs

@hookimpl
def hal_register_backends(registry):
    registry.add(PatchedBackend)
"""


_BAD_HEALTH = _patched_cpu(
    "fxsick",
    """
    def health():
        raise RuntimeError("driver health query failed")
    d.health = health
    """,
)


def test_a_device_whose_health_raises_does_not_break_hal_info(
    custom_dist: Callable[..., Path],
) -> None:
    """A vendor device whose health() (driver counters) raises: hal info and hal info --json still
    list every backend, with that device's properties replaced by the error naming it, and
    Device.properties()/health() raise hal.DeviceError (the backend's exception as the cause)."""
    root = custom_dist("fxsick", _BAD_HEALTH)
    text = _run(root, ["-m", "hal", "info"])
    assert text.returncode == 0, text.stderr
    why = "fxsick:0: the backend's health() failed: RuntimeError: driver health query failed"
    assert (
        f"properties unavailable: {why}" in text.stdout and "backend cpu: available" in text.stdout
    )
    proc = _run(root, ["-m", "hal", "info", "--json"])
    assert proc.returncode == 0, proc.stderr
    backends = {b["name"]: b for b in json.loads(proc.stdout)["backends"]}
    assert backends["fxsick"]["devices"][0]["properties"] == {"error": why}
    assert backends["cpu"]["devices"][0]["properties"]["speed"] > 0
    code = (
        "import hal\n"
        "d = hal.device('fxsick:0')\n"
        "for f in (d.health, d.properties):\n"
        "    try:\n"
        "        f()\n"
        "    except hal.DeviceError as e:\n"
        "        print(type(e.__cause__).__name__, e.device, e)\n"
    )
    out = _run(root, ["-c", code])
    assert out.stdout.splitlines() == [f"RuntimeError fxsick:0 {why}"] * 2, out.stdout + out.stderr


_BAD_PEER = _patched_cpu(
    "fxnopeer",
    """
    def can_access_peer(other):
        raise RuntimeError("peer query failed in driver")
    d.can_access_peer = can_access_peer
    """,
)


def test_a_backend_breaking_the_spi_in_hal_info_is_named_and_the_rest_listed(
    custom_dist: Callable[..., Path],
) -> None:
    """A vendor backend whose can_access_peer raises (its P2P matrix cannot be drawn): hal info
    names the failure under that backend and lists every other backend, in text and JSON."""
    root = custom_dist("fxnopeer", _BAD_PEER)
    why = "describing its devices failed: RuntimeError: peer query failed in driver"
    text = _run(root, ["-m", "hal", "info"], HAL_CPU_DEVICES="2")
    assert text.returncode == 0, text.stderr
    assert f"error: {why}" in text.stdout and "backend cpu: available" in text.stdout, text.stdout
    proc = _run(root, ["-m", "hal", "info", "--json"], HAL_CPU_DEVICES="2")
    assert proc.returncode == 0, proc.stderr
    backends = {b["name"]: b for b in json.loads(proc.stdout)["backends"]}
    assert backends["fxnopeer"]["error"] == why and backends["fxnopeer"]["devices"] == []
    assert len(backends["cpu"]["devices"]) == 2 and "error" not in backends["cpu"]


_NO_NAME = _patched_cpu("fxnameless", "del d.name  # hal core reads it from every device")


def test_a_device_breaking_the_spi_fails_its_backend_at_the_probe(
    custom_dist: Callable[..., Path],
) -> None:
    """A DeviceImpl without ``name`` fails its backend when probed, with the reason; hal info,
    hal.devices() and hal.comm.init() go on with the rest (hal info crashed with AttributeError)."""
    root = custom_dist("fxnameless", _NO_NAME)
    out = _report(root)
    assert out["backends"]["fxnameless"]["status"] == "failed"
    assert (
        "device fxnameless:0: DeviceImpl.name is missing" in out["backends"]["fxnameless"]["reason"]
    )
    assert out["devices"][0] == "cpu:0" and out["comm_device"] == "cpu:0"
    proc = _run(root, ["-m", "hal", "info"])
    assert proc.returncode == 0 and "backend fxnameless: failed" in proc.stdout, (
        proc.stdout + proc.stderr
    )
