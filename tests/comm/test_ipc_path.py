"""hal.comm's direct intra-host path over IPC (issue #15, item 4): real ranks under ``hal run``.

Every rank runs tests/comm/ipc_worker.py on the CPU emulator with ``HAL_CPU_IPC=1`` (its memory
in memfds, so the ranks map each other's buffers). The IPC path is compared with the slot path
call by call, its plans say ``ipc``, a dead rank ends the call with a CommError naming it, and a
buffer reused at once after ``wait()`` is never read half-changed by a slow peer.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hal
from hal.comm import _ipc
from hal.comm._config import parse_algo
from hal.comm._plan import choose

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import comm_launch  # noqa: E402

WORKER = str(HERE / "ipc_worker.py")


def hal_run(
    n: int, args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``hal run -n N ipc_worker.py ARGS`` with a clean HAL_* environment, IPC on."""
    return comm_launch.hal_run(n, [WORKER, *args], {"HAL_CPU_IPC": "1", **(env or {})})


def ok(proc: subprocess.CompletedProcess[str], lines: int) -> list[str]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = [x for x in proc.stdout.splitlines() if x.startswith("OK ")]
    assert len(out) == lines, proc.stdout + proc.stderr
    return out


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_ipc_path_matches_the_slot_path(ranks: int) -> None:
    """all_reduce/all_gather/reduce_scatter/broadcast, in and out of place: same bytes as the slots."""
    args = ["matrix"] if ranks == 2 else ["matrix", "quick"]
    for line in ok(hal_run(ranks, args), ranks):
        exported, imported = (int(v) for v in re.findall(r"(?:exported|imported)=(\d+)", line))
        assert exported > 0 and imported >= exported * (ranks - 1) // 2, line


def test_device_path_across_two_devices_matches_the_slot_path() -> None:
    """HAL_COMM_DLPACK=0: no host views, so the path CUDA takes (hal.copy from the mapped peer buffers,
    hal.kernels.accumulate), with 3 ranks on two emulator devices (peer copies between them)."""
    ok(hal_run(3, ["matrix", "quick"], {"HAL_COMM_DLPACK": "0", "HAL_CPU_DEVICES": "2"}), 3)


def test_handles_are_exported_once_and_released_with_the_buffer() -> None:
    """HAL_COMM_IPC=on: plans say ipc (chosen by HAL_COMM_IPC); one export per buffer; freed ones dropped."""
    for line in ok(hal_run(3, ["cached"], {"HAL_COMM_IPC": "on"}), 3):
        assert "algorithm=ipc" in line and "path=ipc" in line and "(HAL_COMM_IPC)" in line, line


def test_a_buffer_that_cannot_be_shared_falls_back_on_every_rank() -> None:
    """Rank 1 passes adopted host memory (no memfd): every rank runs the slot algorithm, plan.fallback says why."""
    for line in ok(hal_run(3, ["fallback"]), 3):
        assert "algorithm=ipc" not in line
        assert "fallback=ipc: rank 1's send buffer cannot be shared" in line, line


def test_a_dead_rank_ends_the_call_with_an_error_naming_it() -> None:
    """Rank 1 exits after mapping its peers' memory; the others get a CommError naming rank 1 and all_reduce."""
    lines = ok(hal_run(3, ["die"], {"HAL_COMM_TIMEOUT_MS": "5000"}), 2)
    for line in lines:
        assert "op=all_reduce ranks=(1,)" in line and "rank(s) 1 died" in line, line


def test_a_silent_rank_ends_the_call_within_the_timeout() -> None:
    """Rank 2 stalls (alive) after mapping; ranks 0 and 1 get the timeout's CommError naming it and all_reduce."""
    for line in ok(hal_run(3, ["stall"], {"HAL_COMM_TIMEOUT_MS": "1500"}), 2):
        assert "op=all_reduce ranks=(2,)" in line, line
        assert "no progress for 1500 ms (HAL_COMM_TIMEOUT_MS); not heard from rank(s) 2" in line, (
            line
        )


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_buffer_reused_at_once_is_not_read_by_a_slow_peer(ranks: int) -> None:
    """The last rank reads 0.4 s late; the others overwrite their buffers as soon as wait() returns."""
    ok(hal_run(ranks, ["reuse"]), ranks)


def test_impossible_force_is_an_error_naming_why() -> None:
    """Without HAL_CPU_IPC: HAL_COMM_ALGO=allreduce:ipc fails at the call, HAL_COMM_IPC=on at init."""
    for line in ok(hal_run(2, ["forced"], {"HAL_CPU_IPC": "0"}), 2):
        assert "all_reduce:ipc, which cannot run here: rank 0's device cpu:0 has no ipc" in line, (
            line
        )
        assert "HAL_CPU_IPC=1" in line
    proc = hal_run(2, ["forced_init"], {"HAL_CPU_IPC": "0", "HAL_COMM_IPC": "on"})
    for line in ok(proc, 2):
        assert (
            "HAL_COMM_IPC=on, but the direct IPC path cannot run: rank 0's device cpu:0 has no ipc"
            in line
        )


class _Shm:
    """A transport's planning constants (what ``choose`` reads), as the Python shm transport declares them."""

    name = "shm"
    path = "host-shm"
    alpha_s = 200e-6
    beta_s_per_byte = 1 / 4e9


def test_the_cost_model_prefers_one_copy_per_byte_for_large_messages() -> None:
    """The planner: ipc for large messages where it is predicted faster; never where it cannot run."""
    state = _ipc.IpcState(0, "auto", "")

    def plan(n: int, ipc: object) -> str:
        return choose(
            "all_reduce",
            nbytes=n,
            ranks=4,
            hosts=1,
            transport=_Shm,
            chunk_bytes=min(n, 4 << 20) or 64,
            path="host-shm",
            override=None,
            ipc=ipc,
        ).algorithm

    assert plan(64 << 20, state) == "ipc"
    assert plan(64 << 20, None) != "ipc"
    assert plan(64 << 20, _ipc.IpcState(0, "off", "HAL_COMM_IPC=off")) != "ipc"
    assert math.isinf(_ipc.IpcState(0, "auto", "no").predict("all_reduce", 1 << 20, 4, 1e-5))
    assert math.isinf(state.predict("reduce", 1 << 20, 4, 1e-5))  # not an IPC collective
    assert parse_algo("allreduce:ipc,bcast:ipc") == {"all_reduce": "ipc", "broadcast": "ipc"}
    with pytest.raises(ValueError, match="reduce has no algorithm 'ipc'"):
        parse_algo("reduce:ipc")
    with pytest.raises(hal.CommError, match="all_gather:ipc, which cannot run here: no peers here"):
        choose(
            "all_gather",
            nbytes=64,
            ranks=2,
            hosts=1,
            transport=_Shm,
            chunk_bytes=64,
            path="host-shm",
            override="ipc",
            ipc=_ipc.IpcState(0, "auto", "no peers here"),
        )


def _info(mode: str = "auto", ipc: bool = True, device: str = "cpu:0") -> dict[str, object]:
    return {
        "ipc": {
            "mode": mode,
            "ipc": ipc,
            "why": "" if ipc else "no memfds",
            "device": device,
            "sees": ["cpu:0"],
        }
    }


def test_init_decides_the_same_on_every_rank_and_names_why() -> None:
    """hal.comm._ipc.decide: what init makes of every rank's IPC information (one table, same answer)."""
    assert _ipc.decide(0, [_info(), _info()], ["h", "h"]).usable
    assert "2 hosts" in _ipc.decide(0, [_info(), _info()], ["a", "b"]).reason
    assert (
        "rank 1's device cpu:0 has no ipc: no memfds"
        in _ipc.decide(0, [_info(), _info(ipc=False)], ["h"] * 2).reason
    )
    assert (
        "rank 0 has no device cpu:1"
        in _ipc.decide(0, [_info(), _info(device="cpu:1")], ["h"] * 2).reason
    )
    assert _ipc.decide(0, [_info("off"), _info("off")], ["h"] * 2).reason == "HAL_COMM_IPC=off"
    with pytest.raises(
        hal.CommError, match="ranks disagree on HAL_COMM_IPC: rank 0: 'auto', rank 1: 'on'"
    ) as exc:
        _ipc.decide(0, [_info(), _info("on")], ["h"] * 2)
    assert exc.value.ranks == (1,)
    with pytest.raises(
        hal.CommError,
        match="HAL_COMM_IPC=on, but the direct IPC path cannot run: the ranks run on 2",
    ):
        _ipc.decide(0, [_info("on"), _info("on")], ["a", "b"])


def test_hal_bench_comm_times_the_ipc_path_beside_the_slot_path() -> None:
    """``hal bench comm --ipc``: the IPC path on a second communicator, right results, ratios to the slot path."""
    import json

    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1", "HAL_CPU_IPC": "1"})
    args = [
        "-n",
        "2",
        "--min",
        "256K",
        "--max",
        "256K",
        "--batches",
        "1",
        "--iters",
        "2",
        "--ipc",
        "--json",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "bench", "comm", *args],
        env=child,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["ipc_algorithm"] == "ipc"
    (row,) = result["rows"]
    assert row["ipc_wrong"] == 0 and row["oop_wrong"] == 0
    assert row["ipc_ratio"] == pytest.approx(row["ipc_time_us"] / row["oop_time_us"])
    assert row["ipc_inplace_time_us"] > 0 and row["ipc_inplace_ratio"] > 0
