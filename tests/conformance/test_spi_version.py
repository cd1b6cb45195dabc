"""SPI 1.1/1.2: the shared memory accounting, device health counters, and 1.0 backends still loading."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import hal
from hal.conformance import Suite
from hal.spi import API_VERSION, MemoryAccount

REPO = Path(__file__).resolve().parents[2]


def test_api_version_is_1_2_and_hal_sdk_matches_the_documented_pin() -> None:
    assert API_VERSION == (1, 2) and hal.API_VERSION == (1, 2)
    major, minor = (int(x) for x in hal.__version__.split(".")[:2])
    assert (major, minor) >= API_VERSION and major < 2  # what "hal-sdk>=1.1,<2" in the docs admits
    for doc in (
        "docs/write-a-backend.md",
        "docs/certify.md",
        "examples/vendor_backend/pyproject.toml",
    ):
        text = (REPO / doc).read_text()
        assert "hal-sdk>=1.1,<2" in text and "hal-sdk>=0.1" not in text, doc


def test_memory_account_reserves_releases_and_names_the_device() -> None:
    acct = MemoryAccount(1000, "acme:3", hint="raise ACME_MEMORY")
    acct.reserve(600)
    assert (acct.in_use, acct.free) == (600, 400)
    with pytest.raises(
        hal.OutOfMemoryError,
        match=r"cannot allocate 401 bytes: 400 of 1000 free \(raise ACME_MEMORY\)",
    ) as info:
        acct.reserve(401)
    assert info.value.device == "acme:3" and acct.in_use == 600  # nothing counted for the refusal
    acct.release(600)
    assert acct.in_use == 0
    with pytest.raises(ValueError, match="capacity=-1"):
        MemoryAccount(-1, "acme:0")


def test_memory_account_is_exact_under_threads() -> None:
    acct = MemoryAccount(1 << 40, "acme:0")
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        for n in range(1, 2001):
            acct.reserve(n)
            acct.release(n)
            acct.reserve(1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert acct.in_use == 8 * 2000


def test_device_health_counters_show_in_properties() -> None:
    dev = hal.device("cpu:0")
    health = dev.health()
    assert set(health) == {"errors"} and health["errors"] >= 0
    assert dev.properties()["errors"] == health["errors"] and "speed" in dev.properties()


def test_a_backend_written_against_spi_1_0_still_loads_and_certifies(
    tmp_path: Path, hal_env: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = (REPO / "docs" / "write-a-backend.md").read_text()
    code = doc.split("## A minimal backend", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "api_version = (1, 1)" in code
    old = code.replace("api_version = (1, 1)", "api_version = (1, 0)").replace(
        'name = "hostmem"', 'name = "oldmem"'
    )
    (tmp_path / "hal_oldmem.py").write_text(old)
    info = tmp_path / "hal_oldmem-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hal-oldmem\nVersion: 0.1\nRequires-Dist: hal-sdk>=1,<2\n"
    )
    (info / "entry_points.txt").write_text("[hal.backends]\noldmem = hal_oldmem\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hal_env()
    rec = {b.name: b for b in hal.list_backends()}["oldmem"]
    assert rec.status == "available" and rec.api_version == "1.0", rec
    entry, _ = Suite("oldmem").run_requirement(
        next(r for r in Suite("oldmem").catalogue if r.id == "MEM-THREADS")
    )
    assert entry["status"] == "pass", entry["reason"]
