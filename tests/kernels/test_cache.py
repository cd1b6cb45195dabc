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
from hal import _cache  # the compile cache of core (hal.spi.compile_cache), hal.kernels' options
from hal.kernels._program import _forget_programs

SRC = (
    "HAL_KERNEL void fill(HAL_GLOBAL hal_f32* p, hal_f32 v, hal_i64 n) "
    "{{ hal_i64 i = HAL_GLOBAL_ID(0); if (i < n) p[i] = v + {k}; }}"
)


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


# -- nothing from disk runs unchecked (issue #12) -----------------------------------------------

_EVIL = r"""
#include <stdio.h>
#include <stdint.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("constructor ran", f); fclose(f); }
}
void fill(const int64_t *gs, int32_t dims, float *p, float v, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = -1.0f;  /* wrong results if ever called */
}
"""


@pytest.fixture
def cpu_kdev() -> hal.Device:
    dev = hal.device("cpu:0")
    if not dev.capabilities.kernels:
        pytest.skip(f"cpu:0 has no kernels: {dev.capabilities.reason_absent('kernels')}")
    return dev


def _evil_library(tmp_path: Path) -> tuple[bytes, Path]:
    """Compile a library whose constructor writes a marker file; return its bytes and the marker."""
    marker = tmp_path / "constructor-ran"
    src = tmp_path / "evil.c"
    src.write_text(_EVIL)
    lib = tmp_path / "evil.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', str(src), "-o", str(lib)],
        check=True,
        capture_output=True,
    )
    return lib.read_bytes(), marker


def _entry(key: str, binary: bytes) -> bytes:
    """A well-formed entry for ``key``: the header (key, SHA-256, size) names exactly these bytes."""
    return _cache._MAGIC + _cache._header(key, binary, {"backend": "cpu"}) + b"\n" + binary


def _recompiles(dev: hal.Device, k: int, match: str) -> hal.kernels.Program:
    """Compile SRC(k) again: the entry is refused with a HalWarning matching ``match``; results right."""
    _forget_programs()
    stats = hal.kernels.cache_stats()
    misses = stats.misses
    with pytest.warns(hal.HalWarning, match=match):
        prog = hal.kernels.compile(SRC.format(k=k), dev)
    assert stats.misses == misses + 1, "the program was recompiled"
    with dev.create_stream() as s:
        a = hal.asarray([0.0, 0.0, 0.0], device=dev, dtype="float32")
        prog.launch("fill", 3, [a, 1.0, 3], stream=s)
        assert a.to_host(stream=s).tolist() == [1.0 + k] * 3
    return prog


def test_entry_planted_by_another_user_never_runs(
    cache: Path, cpu_kdev: hal.Device, tmp_path: Path
) -> None:
    """A valid-looking entry (right key, right digest) owned by someone else: refused before dlopen."""
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    key = hal.kernels.compile(SRC.format(k=50), cpu_kdev).key
    evil, marker = _evil_library(tmp_path)
    entry = cache / f"{key}.halk"
    entry.write_bytes(_entry(key, evil))
    os.chown(entry, 65534, 65534)
    _recompiles(cpu_kdev, 50, "owned by uid 65534")
    assert not marker.exists(), "the planted library's constructor ran"


def test_world_writable_entry_is_refused(cache: Path, cpu_kdev: hal.Device, tmp_path: Path) -> None:
    key = hal.kernels.compile(SRC.format(k=51), cpu_kdev).key
    evil, marker = _evil_library(tmp_path)
    entry = cache / f"{key}.halk"
    entry.write_bytes(_entry(key, evil))
    entry.chmod(0o666)
    _recompiles(cpu_kdev, 51, r"group- or world-writable \(mode 0666\)")
    assert not marker.exists()
    assert (entry.stat().st_mode & 0o777) == 0o600, "the rebuilt entry is private"


def test_truncated_entry_is_recompiled(cache: Path, cpu_kdev: hal.Device) -> None:
    key = hal.kernels.compile(SRC.format(k=52), cpu_kdev).key
    entry = cache / f"{key}.halk"
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2])  # before: SIGBUS in dlopen
    _recompiles(cpu_kdev, 52, "truncated or padded")


def test_flipped_bytes_are_recompiled(cache: Path, cpu_kdev: hal.Device) -> None:
    key = hal.kernels.compile(SRC.format(k=53), cpu_kdev).key
    entry = cache / f"{key}.halk"
    data = bytearray(entry.read_bytes())
    body = data.index(b"\n", len(_cache._MAGIC)) + 1
    for i in range(body + 0x400, min(len(data), body + 0x1400)):  # code and data: before, SIGILL
        data[i] ^= 0xFF
    entry.write_bytes(bytes(data))
    _recompiles(cpu_kdev, 53, "SHA-256 does not match")


def test_another_valid_library_under_the_key_is_recompiled(
    cache: Path, cpu_kdev: hal.Device
) -> None:
    """An intact entry of another program copied under this key (before: wrong results, silently)."""
    key_a = hal.kernels.compile(SRC.format(k=54), cpu_kdev).key
    key_b = hal.kernels.compile(SRC.format(k=55), cpu_kdev).key
    (cache / f"{key_a}.halk").write_bytes((cache / f"{key_b}.halk").read_bytes())
    _recompiles(cpu_kdev, 54, f"built for key {key_b[:16]}")


def test_foreign_library_with_a_forged_digest_but_wrong_key(
    cache: Path, cpu_kdev: hal.Device, tmp_path: Path
) -> None:
    key = hal.kernels.compile(SRC.format(k=56), cpu_kdev).key
    evil, marker = _evil_library(tmp_path)
    (cache / f"{key}.halk").write_bytes(_entry("0" * 64, evil))
    _recompiles(cpu_kdev, 56, "built for key 0000000000000000")
    assert not marker.exists()


def test_fifo_under_the_key_does_not_hang(cache: Path, cpu_kdev: hal.Device) -> None:
    key = hal.kernels.compile(SRC.format(k=57), cpu_kdev).key
    entry = cache / f"{key}.halk"
    entry.unlink()
    os.mkfifo(entry)
    _recompiles(cpu_kdev, 57, "not a regular file")


def test_group_writable_cache_directory_turns_the_disk_cache_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_kdev: hal.Device
) -> None:
    root = tmp_path / "shared"
    monkeypatch.setenv("HAL_CACHE_DIR", str(root))
    _forget_programs()
    key = hal.kernels.compile(SRC.format(k=58), cpu_kdev).key
    kernels = root / "kernels"
    assert (kernels.stat().st_mode & 0o777) == 0o700, "the entry directory is created private"
    evil, marker = _evil_library(tmp_path)
    (kernels / f"{key}.halk").write_bytes(_entry(key, evil))
    kernels.chmod(0o777)
    _forget_programs()
    with pytest.warns(
        hal.HalWarning, match="compile cache directory .* refused: group- or world-writable"
    ):
        hal.kernels.compile(SRC.format(k=58), cpu_kdev)
    assert not marker.exists()
    _forget_programs()


def test_default_cache_root_is_created_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_kdev: hal.Device
) -> None:
    monkeypatch.delenv("HAL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    _forget_programs()
    hal.kernels.compile(SRC.format(k=59), cpu_kdev)
    for d in (tmp_path / "xdg" / "hal-sdk", tmp_path / "xdg" / "hal-sdk" / "kernels"):
        assert (d.stat().st_mode & 0o777) == 0o700, d
    _forget_programs()
