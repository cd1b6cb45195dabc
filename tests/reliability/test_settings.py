"""Settings are parsed in one place (hal/_settings.py): one parser per kind, bounds, the variable named.

Before, garbage escaped raw (``OverflowError``, ``UnicodeDecodeError``, ``RecursionError``),
hung (a FIFO as ``HAL_TOPO_FILE``), grew memory without end (``HAL_CPU_DEVICES=1000000000``)
or moved ``hal.comm.init()`` to another backend without a word (a typo in ``HAL_CPU_DEVICES``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

import hal
from hal.spi import (
    SETTINGS,
    parse_bool,
    parse_choice,
    parse_float,
    parse_int,
    parse_port,
    parse_size,
    setting,
)


def _run(code: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=child,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    ("parse", "raw", "message"),
    [
        (
            lambda r: parse_int(r, "X", lo=1, hi=8),
            "9",
            "X='9' is out of range; allowed: an integer in 1..8",
        ),
        (lambda r: parse_int(r, "X", lo=1, hi=8), "1e3", "X='1e3' is not an integer"),
        (lambda r: parse_int(r, "X", lo=1, hi=8), "9" * 400, "is not an integer"),
        (
            lambda r: parse_size(r, "X", hi=1 << 30),
            "2G",
            "X='2G' is out of range; allowed: a size in bytes, 0..1G",
        ),
        (lambda r: parse_size(r, "X"), "1.5", "X='1.5' is not a whole number of bytes"),
        (lambda r: parse_size(r, "X"), "-4K", "X='-4K' must be >= 0"),
        (lambda r: parse_size(r, "X"), "1e400", "X='1e400' is not a size"),
        (
            lambda r: parse_float(r, "X", lo=0, hi=10, unit="s"),
            "inf",
            "X='inf' is not a finite number; allowed: a finite number in (0, 10] s",
        ),
        (lambda r: parse_float(r, "X", lo=0, hi=10, unit="s"), "nan", "is not a finite number"),
        (lambda r: parse_float(r, "X", lo=0, hi=10, unit="s"), "0", "X='0' is out of range"),
        (lambda r: parse_bool(r, "X"), "maybe", "X='maybe' is not a switch"),
        (
            lambda r: parse_port(r, "X"),
            "65536",
            "X='65536' is out of range; allowed: an integer in 1..65535",
        ),
        (
            lambda r: parse_choice(r, "X", ("a", "b")),
            "c",
            "X='c' is not a known choice; allowed: one of a, b",
        ),
    ],
)
def test_each_parser_names_variable_value_and_range(parse: Any, raw: str, message: str) -> None:
    with pytest.raises(hal.ConfigError) as info:
        parse(raw)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, hal.HalError)
    assert info.value.variable == "X" and info.value.value == raw


def test_parsers_accept_good_values() -> None:
    assert parse_size(" 64KiB ", "X") == 64 << 10 and parse_size("1.5K", "X") == 1536
    assert parse_int("+7", "X", lo=0, hi=9) == 7
    assert parse_float("2.5", "X", lo=0, hi=10) == 2.5
    assert parse_bool("ON", "X") is True and parse_bool("0", "X") is False
    assert parse_port("8080", "X") == 8080
    assert setting("HAL_PLUGIN_TIMEOUT_S", {}) == 10.0
    assert setting("HAL_CPU_DEVICES", {"HAL_CPU_DEVICES": " 3 "}) == 3


def test_every_setting_declares_bounds_and_a_doc() -> None:
    for name, spec in SETTINGS.items():
        assert spec.name == name and spec.doc, name
        assert spec.allowed(), name
        if spec.default is not None:
            assert spec.parse(str(spec.default).lower()) == spec.default, name


def test_huge_cpu_device_count_is_refused_quickly() -> None:
    """HAL_CPU_DEVICES=1000000000 used to build a billion devices; now the backend fails, named."""
    proc = _run(
        "import hal; print([(b.status, b.reason) for b in hal.list_backends() if b.name == 'cpu'][0])",
        HAL_CPU_DEVICES="1000000000",
        HAL_DISABLE_BACKENDS="opencl,cuda",
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "('failed', \"HAL_CPU_DEVICES='1000000000' is out of range; allowed: an integer in 1..1024\")"
        in proc.stdout
    )


def test_cpu_devices_typo_does_not_move_init_to_another_backend() -> None:
    """With OpenCL present a typo used to put the rank on opencl:0 silently; now init() says why."""
    proc = _run("import hal.comm; hal.comm.init()", HAL_CPU_DEVICES="2x", HAL_BACKENDS="cpu,opencl")
    assert proc.returncode != 0
    assert (
        "ConfigError: HAL_CPU_DEVICES='2x' is not an integer; allowed: an integer in 1..1024"
        in proc.stderr
    )
    assert "backend 'cpu' failed on it; hal.comm.init() does not fall back" in proc.stderr


def test_import_hal_survives_a_bad_environment() -> None:
    proc = _run(
        "import hal; print('imported')",
        HAL_LOG_LEVEL="shouty",
        HAL_CPU_DEVICES="x",
        HAL_COMM_TIMEOUT_MS="inf",
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "imported", proc.stderr
    assert "HAL_LOG_LEVEL='shouty'" in proc.stderr


@pytest.mark.parametrize("kind", ["fifo", "binary", "deep", "directory"])
def test_hostile_topology_file_falls_back_with_the_marker(tmp_path: Path, kind: str) -> None:
    """HAL_TOPO_FILE of a FIFO (used to hang), binary (UnicodeDecodeError), deep JSON (RecursionError)."""
    path = tmp_path / "topo"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "binary":
        path.write_bytes(bytes(range(256)))
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    else:
        path.mkdir()
    proc = _run(
        "import hal.comm; c = hal.comm.init(); print('rank', c.rank, 'of', c.size); c.close()",
        HAL_TOPO_FILE=str(path),
        HAL_BACKENDS="cpu",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "rank 0 of 1"
    assert "topology fallback:" in proc.stderr
    why = {
        "fifo": "is a FIFO, not a regular file",
        "binary": "is not UTF-8 text",
        "deep": "too deeply",
        "directory": "is a directory, not a regular file",
    }[kind]
    assert why in proc.stderr
