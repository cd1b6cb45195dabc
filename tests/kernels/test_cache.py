"""The compile cache: keys, hits and misses, atomic writes, LRU eviction under a cap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hal
import hal.kernels
from hal.kernels import _cache
from hal.kernels._program import _forget_programs

SRC = "HAL_KERNEL void fill(HAL_GLOBAL hal_f32* p, hal_f32 v, hal_i64 n) {{ hal_i64 i = HAL_GLOBAL_ID(0); if (i < n) p[i] = v + {k}; }}"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HAL_CACHE_DIR", str(tmp_path / "c"))
    _forget_programs()
    yield tmp_path / "c" / "kernels"
    _forget_programs()


def test_miss_then_hit_across_processes(cache: Path, kdev: hal.Device) -> None:
    stats = hal.kernels.cache_stats()
    m0, h0 = stats.misses, stats.hits
    p1 = hal.kernels.compile(SRC.format(k=1), kdev)
    assert stats.misses == m0 + 1
    entries = list(cache.glob("*.halk"))
    assert [e.stem for e in entries] == [p1.key]
    _forget_programs()
    p2 = hal.kernels.compile(SRC.format(k=1), kdev)
    assert stats.hits == h0 + 1 and p2.key == p1.key
    with kdev.create_stream() as s:
        a = hal.asarray([0.0, 0.0], device=kdev, dtype="float32")
        p2.launch("fill", 2, [a, 2.0, 2], stream=s)
        assert a.to_host(stream=s).tolist() == [3.0, 3.0]
    assert not list(cache.glob(".tmp-*")), "no temporary file is left behind"


def test_key_covers_source_options_and_device(cache: Path, kdev: hal.Device) -> None:
    k1 = hal.kernels.compile(SRC.format(k=1), kdev).key
    k2 = hal.kernels.compile(SRC.format(k=2), kdev).key
    k3 = hal.kernels.compile(SRC.format(k=1), kdev, defines={"UNUSED": "1"}).key
    assert len({k1, k2, k3}) == 3
    base = dict(source="s", options=["-DX"], backend="cpu", device="d", compiler={"cc": "1"})
    key = _cache.cache_key(**base)  # type: ignore[arg-type]
    for field, value in [
        ("options", []),
        ("backend", "opencl"),
        ("device", "e"),
        ("compiler", {"cc": "2"}),
    ]:
        assert _cache.cache_key(**{**base, field: value}) != key  # type: ignore[arg-type]


def test_lru_eviction_under_small_cap(
    cache: Path, kdev: hal.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = hal.kernels.compile(SRC.format(k=10), kdev)
    size = (cache / f"{first.key}.halk").stat().st_size
    monkeypatch.setenv("HAL_CACHE_MAX_BYTES", str(int(size * 2.5)))
    second = hal.kernels.compile(SRC.format(k=11), kdev)
    os.utime(cache / f"{second.key}.halk", (1, 1))  # second is now the least recently used
    _forget_programs()
    hal.kernels.compile(SRC.format(k=10), kdev)  # a hit touches first
    third = hal.kernels.compile(SRC.format(k=12), kdev)  # over the cap: evicts the LRU entry
    names = {p.stem for p in cache.glob("*.halk")}
    assert names == {first.key, third.key}
    info = hal.kernels.cache_info()
    assert info.entries == 2 and info.bytes <= info.max_bytes


def test_zero_cap_disables_disk_cache(
    cache: Path, kdev: hal.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAL_CACHE_MAX_BYTES", "0")
    hal.kernels.compile(SRC.format(k=20), kdev)
    assert not list(cache.glob("*.halk")) if cache.exists() else True


def test_bad_cap_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAL_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="HAL_CACHE_MAX_BYTES='lots'"):
        _cache.max_bytes()
    monkeypatch.setenv("HAL_CACHE_MAX_BYTES", "64M")
    assert _cache.max_bytes() == 64 << 20


def test_corrupt_entry_is_rebuilt(cache: Path, kdev: hal.Device) -> None:
    p = hal.kernels.compile(SRC.format(k=30), kdev)
    (cache / f"{p.key}.halk").write_bytes(b"garbage")
    _forget_programs()
    with pytest.warns(hal.HalWarning, match="not a hal compile-cache entry"):
        again = hal.kernels.compile(SRC.format(k=30), kdev)
    assert again.key == p.key and (cache / f"{p.key}.halk").read_bytes().startswith(b"HALK2\n")


def test_cli_cache_info_and_clear(cache: Path, kdev: hal.Device) -> None:
    hal.kernels.compile(SRC.format(k=40), kdev)
    env = {**os.environ}
    out = subprocess.run(
        [sys.executable, "-m", "hal", "cache", "info", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    info = json.loads(out.stdout)
    assert info["entries"] >= 1 and info["path"] == str(cache)
    assert info["items"][0]["kernels"] == ["fill"]
    out = subprocess.run(
        [sys.executable, "-m", "hal", "cache", "clear", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert json.loads(out.stdout)["removed"] >= 1
    assert not list(cache.glob("*.halk"))
