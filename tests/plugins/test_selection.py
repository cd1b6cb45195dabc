"""HAL_BACKENDS (allowlist and order), HAL_DISABLE_BACKENDS (never imported), HAL_STRICT_PLUGINS."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_REPORT = """
import json
import hal
print(json.dumps({
    "backends": {b.name: {"status": b.status, "reason": b.reason} for b in hal.list_backends()},
    "order": [b.name for b in hal.list_backends()],
    "devices": [str(d) for d in hal.devices()],
}))
"""

_STRICT = """
import json
import hal
try:
    infos = hal.list_backends()
except hal.PluginError as exc:
    print(json.dumps({"raised": True, "plugin": exc.plugin, "message": str(exc)}))
else:
    print(json.dumps({"raised": False, "status": {b.name: b.status for b in infos}}))
"""


def test_allowlist_sets_order_and_blocks_the_rest(
    fixture_dists: Callable[..., Path],
    imported: Callable[[Path, str], bool],
    python_json: Callable[..., Any],
) -> None:
    root = fixture_dists("fxcpu", "fxbroken", "fxblocked")
    out = python_json(["-c", _REPORT], env={"HAL_BACKENDS": " fxcpu , cpu "}, pythonpath=[root])
    assert out["order"][:2] == ["fxcpu", "cpu"]
    assert out["devices"] == ["fxcpu:0", "fxcpu:1", "cpu:0", "cpu:1"]
    for name in ("fxbroken", "fxblocked", "opencl", "cuda"):
        assert out["backends"][name]["status"] == "blocked"
        assert "not listed in HAL_BACKENDS" in out["backends"][name]["reason"]
    assert not imported(root, "fxbroken") and not imported(root, "fxblocked")
    assert imported(root, "fxcpu")


def test_allowlist_other_order(
    fixture_dists: Callable[..., Path], python_json: Callable[..., Any]
) -> None:
    root = fixture_dists("fxcpu")
    out = python_json(["-c", _REPORT], env={"HAL_BACKENDS": "cpu,fxcpu"}, pythonpath=[root])
    assert out["order"][:2] == ["cpu", "fxcpu"]
    assert out["devices"] == ["cpu:0", "cpu:1", "fxcpu:0", "fxcpu:1"]


def test_default_order_puts_cpu_first(
    fixture_dists: Callable[..., Path], python_json: Callable[..., Any]
) -> None:
    root = fixture_dists("fxcpu")
    out = python_json(
        ["-c", _REPORT], env={"HAL_DISABLE_BACKENDS": "opencl,cuda"}, pythonpath=[root]
    )
    assert out["order"][0] == "cpu"
    assert out["devices"][:2] == ["cpu:0", "cpu:1"]
    assert "fxcpu:0" in out["devices"]


def test_disable_list_blocks_without_import(
    fixture_dists: Callable[..., Path],
    imported: Callable[[Path, str], bool],
    python_json: Callable[..., Any],
) -> None:
    root = fixture_dists("fxblocked", "fxbroken")
    env = {"HAL_DISABLE_BACKENDS": "fxblocked, fxbroken,opencl,cuda"}
    plugins = python_json(["-m", "hal", "plugins", "--json"], env=env, pythonpath=[root])
    info = python_json(["-m", "hal", "info", "--json"], env=env, pythonpath=[root])
    rows = {p["name"]: p for p in plugins["plugins"]}
    backends = {b["name"]: b for b in info["backends"]}
    for name in ("fxblocked", "fxbroken"):
        assert rows[name]["status"] == "blocked"
        assert rows[name]["dist"] == f"hal-fixture-{name}"
        assert backends[name]["status"] == "blocked"
        assert "HAL_DISABLE_BACKENDS" in backends[name]["reason"]
        assert not imported(root, name)
    assert backends["cpu"]["status"] == "available"


def test_disable_wins_over_allow(
    fixture_dists: Callable[..., Path],
    imported: Callable[[Path, str], bool],
    python_json: Callable[..., Any],
) -> None:
    root = fixture_dists("fxblocked")
    out = python_json(
        ["-c", _REPORT],
        env={"HAL_BACKENDS": "fxblocked,cpu", "HAL_DISABLE_BACKENDS": "fxblocked"},
        pythonpath=[root],
    )
    assert out["backends"]["fxblocked"]["status"] == "blocked"
    assert not imported(root, "fxblocked")


def test_disabling_cpu_leaves_no_cpu_devices(python_json: Callable[..., Any]) -> None:
    out = python_json(["-c", _REPORT], env={"HAL_DISABLE_BACKENDS": "cpu,opencl,cuda"})
    assert out["backends"]["cpu"]["status"] == "blocked"
    assert not any(d.startswith("cpu:") for d in out["devices"])


@pytest.mark.parametrize(
    ("plugin", "text"),
    [
        ("fxbroken", "fixture import boom"),
        ("fxhook", "fixture hook boom"),
        ("fxtypo", "hal_register_backend"),
        ("fxold", "requires hal-sdk<0.1"),
        ("fxapi2", "declares HAL API 2.0"),
        ("fxprobe", "fixture probe boom"),
    ],
)
def test_strict_mode_raises_plugin_error(
    fixture_dists: Callable[..., Path], python_json: Callable[..., Any], plugin: str, text: str
) -> None:
    root = fixture_dists(plugin)
    env = {"HAL_STRICT_PLUGINS": "1", "HAL_BACKENDS": f"cpu,{plugin}"}
    out = python_json(["-c", _STRICT], env=env, pythonpath=[root])
    assert out["raised"], out
    assert out["plugin"] == plugin
    assert text in out["message"] and "HAL_STRICT_PLUGINS=1" in out["message"]


@pytest.mark.parametrize("plugin", ["fxunavail", "fxblocked"])
def test_strict_mode_accepts_unavailable_and_blocked(
    fixture_dists: Callable[..., Path], python_json: Callable[..., Any], plugin: str
) -> None:
    root = fixture_dists(plugin)
    env = {
        "HAL_STRICT_PLUGINS": "true",
        "HAL_BACKENDS": "cpu,fxunavail",
        "HAL_DISABLE_BACKENDS": "fxblocked",
    }
    out = python_json(["-c", _STRICT], env=env, pythonpath=[root])
    assert out["raised"] is False
    assert out["status"]["cpu"] == "available"
    assert out["status"][plugin] == ("unavailable" if plugin == "fxunavail" else "blocked")


def test_strict_mode_in_the_cli_fails_loudly(
    fixture_dists: Callable[..., Path], python_run: Callable[..., Any]
) -> None:
    root = fixture_dists("fxbroken")
    proc = python_run(
        ["-m", "hal", "info", "--json"],
        env={"HAL_STRICT_PLUGINS": "1", "HAL_BACKENDS": "cpu,fxbroken"},
        pythonpath=[root],
        check=False,
    )
    assert proc.returncode != 0
    assert "PluginError" in proc.stderr and "fxbroken" in proc.stderr
    with pytest.raises(json.JSONDecodeError):
        json.loads(proc.stdout or "x")


def test_bad_log_level_is_named(python_run: Callable[..., Any]) -> None:
    """A bad HAL_LOG_LEVEL never makes ``import hal`` fail: a HalWarning names it, the default stays."""
    proc = python_run(
        ["-c", "import hal, logging; print(logging.getLogger('hal').level)"],
        env={"HAL_LOG_LEVEL": "loud"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "HalWarning: HAL_LOG_LEVEL='loud' is not a known choice" in proc.stderr
    assert "debug, info, warning, error, critical" in proc.stderr
    assert proc.stdout.strip() == "0"


def test_log_level_info_reports_loading(python_run: Callable[..., Any]) -> None:
    proc = python_run(
        ["-m", "hal", "info"], env={"HAL_LOG_LEVEL": "info", "HAL_DISABLE_BACKENDS": "cuda,opencl"}
    )
    assert "plugin opencl blocked" in proc.stderr


def test_allowlist_name_no_plugin_has_is_named(
    fixture_dists: Callable[..., Path], python_json: Callable[..., Any]
) -> None:
    """A misspelt HAL_BACKENDS entry is named in the blocked backends' reasons, with what is
    installed, instead of every backend only saying it is not listed."""
    root = fixture_dists("fxcpu")
    out = python_json(["-c", _REPORT], env={"HAL_BACKENDS": "cpux,fxcpu"}, pythonpath=[root])
    assert out["order"][0] == "fxcpu"
    reason = out["backends"]["cpu"]["reason"]
    assert out["backends"]["cpu"]["status"] == "blocked"
    assert "HAL_BACKENDS names 'cpux', which no installed plugin provides" in reason, reason
    assert "cpu" in reason.split("installed: ")[1] and "fxcpu" in reason.split("installed: ")[1]
    out = python_json(["-c", _REPORT], env={"HAL_BACKENDS": "fxcpu,cpu"}, pythonpath=[root])
    assert "no installed plugin" not in out["backends"]["opencl"]["reason"]
