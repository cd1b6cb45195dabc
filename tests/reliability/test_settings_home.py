"""Settings have one home: every HAL_* variable is declared and read through hal.spi.setting."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

import hal
from hal.spi import SETTINGS, parse_list, parse_str, setting, setting_at_import

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hal", "plugins", "backends", "comm", "kernels", "sched", "conformance", "integrations")
# a direct read of a HAL_* variable: os.environ.get("HAL_X"), os.getenv("HAL_X"), os.environ["HAL_X"]
DIRECT = re.compile(r'(?:environ\.get|getenv)\(\s*"(HAL_\w+)"|environ\[\s*"(HAL_\w+)"\s*\](?!\s*=)')
# reads that are not settings, on purpose (docs/architecture.md, "Environment variables")
ALLOWED = {
    ("kernels/_conformance.py", "HAL_KERNELS_STRICT"),  # saved and restored around a check of it
}


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def test_no_module_reads_a_hal_variable_behind_the_settings_back() -> None:
    found = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        for m in DIRECT.finditer(path.read_text(encoding="utf-8")):
            var = m.group(1) or m.group(2)
            if (rel, var) not in ALLOWED:
                found.append(f"{rel}: {var}")
    assert not found, (
        "read these through hal.spi.setting (declare them in hal/_settings.py): " + ", ".join(found)
    )


def test_every_variable_named_to_setting_is_declared() -> None:
    named = set()
    for path in _sources():
        named |= set(
            re.findall(r'setting(?:_at_import)?\(\s*"(\w+)"', path.read_text(encoding="utf-8"))
        )
    assert named and named <= set(SETTINGS), sorted(named - set(SETTINGS))


def test_text_list_and_auto_kinds() -> None:
    assert parse_str("  /tmp/x.json ", "X") == "/tmp/x.json"
    with pytest.raises(hal.ConfigError, match=r"X='a\\x01b' is not plain text"):
        parse_str("a\x01b", "X")
    assert parse_list(" cpu, ,opencl ", "X") == ("cpu", "opencl")
    assert parse_list(["cpu", "cuda"], "X") == ("cpu", "cuda")
    spec = SETTINGS["HAL_CPU_KERNEL_THREADS"]
    assert spec.parse("AUTO") == "auto" and spec.parse("8") == 8
    with pytest.raises(hal.ConfigError, match=r"an integer in 1\.\.4096, or auto"):
        spec.parse("0")
    assert setting("HAL_COMM_CHUNK_BYTES", {}, default=1 << 20) == 1 << 20
    assert setting("HAL_COMM_CHUNK_BYTES", {"HAL_COMM_CHUNK_BYTES": "64K"}, default=1) == 65536


def test_what_import_reads_warns_and_keeps_the_default() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert setting_at_import("HAL_PLUGIN_TIMEOUT_S", {"HAL_PLUGIN_TIMEOUT_S": "inf"}) == 10.0
        assert setting_at_import("HAL_RANK", {"HAL_RANK": "x"}, default=None) is None
    messages = [str(w.message) for w in caught]
    assert any("HAL_PLUGIN_TIMEOUT_S='inf' is not a finite number" in m for m in messages)
    assert all(issubclass(w.category, hal.HalWarning) for w in caught)
