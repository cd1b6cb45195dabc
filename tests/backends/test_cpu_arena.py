"""The CPU emulator's shared device-memory arena (backends/cpu/_arena.py, ``HAL_CPU_ARENA``).

Device memory of 64 KiB and more is a range of one memfd of the process, offered to hal.comm
peers as a shared host region (hal.spi.HostRegion.shared); smaller memory, memory with
``HAL_CPU_ARENA=0`` and memory that finds no room is private NumPy memory. A second process
that opens the memfd (as a peer does) sees what was written, and a forked child's writes stay
its own.
"""

from __future__ import annotations

import gc
import mmap
import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

import hal
from hal import spi
from hal.backends.cpu import _arena
from hal.backends.cpu._backend import CpuMemory

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd here")

_PAGE = mmap.PAGESIZE


def _memory(buf: hal.Buffer) -> CpuMemory:
    mem = buf.spi_memory
    assert isinstance(mem, CpuMemory)
    return mem


def _put(buf: hal.Buffer, data: np.ndarray) -> None:
    with buf.device.create_stream() as s:
        hal.copy(buf, data, stream=s)
        s.synchronize()


def _get(buf: hal.Buffer, n: int) -> np.ndarray:
    out = np.empty(n, np.float32)
    with buf.device.create_stream() as s:
        hal.copy(out, buf, stream=s)
        s.synchronize()
    return out


@pytest.fixture
def cpu(hal_env: Callable[..., None]) -> hal.Device:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1", HAL_MEMORY_POOL="0")
    return hal.device("cpu:0")


def test_large_memory_lives_in_the_shared_arena_small_memory_does_not(cpu: hal.Device) -> None:
    arena = _arena.arena(0)
    assert arena is not None
    assert arena.region in spi.HostRegion.shared()
    big = cpu.alloc(_arena.MIN_BYTES + 1)
    small = cpu.alloc(_arena.MIN_BYTES - 1)
    addr = _memory(big).addr
    assert arena.base <= addr < arena.base + arena.size and (addr - arena.base) % _PAGE == 0
    assert not arena.base <= _memory(small).addr < arena.base + arena.size
    # a second process that opens the memfd (as a hal.comm peer does) reads what was written
    data = np.arange(_arena.MIN_BYTES // 4, dtype=np.uint32)
    _put(big, data)
    code = (
        "import mmap, os, sys, numpy as np\n"
        "fd = os.open(f'/proc/{sys.argv[1]}/fd/{sys.argv[2]}', os.O_RDONLY)\n"
        "m = mmap.mmap(fd, int(sys.argv[4]), prot=mmap.PROT_READ)\n"
        "a = np.frombuffer(m, np.uint32, count=int(sys.argv[5]), offset=int(sys.argv[3]))\n"
        "print(int(a.sum()), os.fstat(fd).st_ino)\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(os.getpid()),
            str(arena.fd),
            str(addr - arena.base),
            str(arena.size),
            str(data.size),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [int(v) for v in out] == [int(data.sum()), arena.inode]
    big.close()
    small.close()


def test_a_range_comes_back_when_its_last_view_is_gone_and_ranges_join(cpu: hal.Device) -> None:
    arena = _arena.arena(0)
    assert arena is not None
    gc.collect()
    before = arena.free_ranges()
    a, b, c = (cpu.alloc(256 << 10) for _ in range(3))
    offsets = [_memory(x).addr - arena.base for x in (a, b, c)]
    assert len(set(offsets)) == 3
    view = _memory(b).bytes(0, 16)  # as queued work holds it
    b.close()
    gc.collect()
    assert all(not (o <= offsets[1] < o + n) for o, n in arena.free_ranges())  # still viewed
    view[:] = 7  # the memory is still there
    del view
    gc.collect()
    assert any(o <= offsets[1] < o + n for o, n in arena.free_ranges())
    a.close()
    c.close()
    gc.collect()
    assert arena.free_ranges() == before  # every range joined its neighbours again


def test_an_arena_without_room_gives_private_memory() -> None:
    arena = _arena.Arena(1 << 20)
    try:
        first = arena.take(768 << 10)
        assert first is not None
        assert arena.take(512 << 10) is None  # 256 KiB left
        second = arena.take(200 << 10)
        assert second is not None and arena.in_use == (768 << 10) + (200 << 10)
        del first, second
        assert arena.free_ranges() == [(0, 1 << 20)] and arena.in_use == 0
    finally:
        os.close(arena.fd)


def test_hal_cpu_arena_0_gives_private_memory(hal_env: Callable[..., None]) -> None:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1", HAL_CPU_ARENA="0")
    dev = hal.device("cpu:0")
    arena = _arena.arena(0)
    with dev.alloc(1 << 20) as buf:
        addr = _memory(buf).addr
        assert arena is None or not arena.base <= addr < arena.base + arena.size
        _put(buf, np.full(1 << 18, 3, np.float32))
        assert (_get(buf, 1 << 18) == 3).all()


def test_a_forked_child_keeps_its_writes_and_offers_no_region(cpu: hal.Device) -> None:
    arena = _arena.arena(0)
    assert arena is not None
    buf = cpu.alloc(1 << 20)
    _put(buf, np.full(1 << 18, 1, np.float32))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write its copy, allocate, report
        try:
            _put(buf, np.full(1 << 18, 2, np.float32))
            out = _get(buf, 1 << 18)
            with cpu.alloc(1 << 20) as mine:
                inside = arena.base <= _memory(mine).addr < arena.base + arena.size
            msg = f"{int(out.sum())} {len(spi.HostRegion.shared())} {int(inside)}"
            os.write(w, msg.encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 100).decode().split()
    os.waitpid(pid, 0)
    os.close(r)
    assert got == [str(2 << 18), "0", "0"]
    assert (_get(buf, 1 << 18) == 1).all()  # the parent's memory never saw the child's write
    assert arena.region in spi.HostRegion.shared()
    buf.close()
