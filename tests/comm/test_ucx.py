"""The UCX transport (``HAL_COMM_TRANSPORT=ucx``) across real processes (``hal run``), UCX over TCP on loopback.

The collectives matrix (every collective x op x dtype x in/out-of-place, each algorithm) and the
point-to-point cases run over UCX on 2 and 3 ranks, as over tcp in test_multiprocess.py and
test_p2p.py; a silent rank and a dead rank are named CommErrors. Without the UCX binding
(``pip install 'hal-sdk[ucx]'``) these skip, and the test that UCX is reported missing runs instead.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hal.comm._ucx import INSTALL, ucx_missing, ucx_version

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import comm_launch  # noqa: E402
from comm_launch import ok  # noqa: E402

WORKER = str(HERE / "worker.py")
P2P = str(HERE / "p2p_worker.py")
SCEN = str(HERE / "scenarios.py")
UCX_WORKER = str(HERE / "ucx_worker.py")
MISSING = ucx_missing()
needs_ucx = pytest.mark.skipif(MISSING is not None, reason=f"UCX is not installed: {MISSING}")
#: UCX over TCP (loopback), as between the namespace hosts; small pieces so messages take many
UCX_TCP = {"HAL_COMM_TRANSPORT": "ucx", "UCX_TLS": "tcp", "HAL_COMM_CHUNK_BYTES": "16K"}
ALGOS = "all_reduce:ring,broadcast:scatter_allgather,reduce:reduce_scatter_gather;all_reduce:rabenseifner"


def hal_run(
    n: int, args: list[str], env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run ``hal run -n N ARGS`` with a clean HAL_*/UCX_* environment (CPU emulator, 1 device per rank)."""
    return comm_launch.hal_run(n, args, env, timeout, clean=("HAL_", "UCX_"))


@needs_ucx
@pytest.mark.parametrize("ranks", [2, 3])
def test_collectives_matrix_over_ucx_tcp(ranks: int) -> None:
    """Every collective, op and dtype, in and out of place, over UCX (UCX_TLS=tcp); 3 ranks fold (not 2^k).
    On 3 ranks, exchanges without a reduction go straight from/into the arrays; on 2, HAL_COMM_DLPACK=0
    sends everything through host pieces with hal.copy (the path of memory the host cannot address)."""
    sizes = "0,13,5001" if ranks == 3 else "0,1,13"
    env = UCX_TCP if ranks == 3 else {**UCX_TCP, "HAL_COMM_DLPACK": "0"}
    ok(
        hal_run(
            ranks,
            [WORKER, "--sizes", sizes, "--dtypes", "float32,int32", "--algos", ALGOS],
            env,
        ),
        ranks,
    )


@needs_ucx
def test_collectives_over_ucx_default_transports() -> None:
    """UCX left to pick its own transports on one host (shared memory where it has it), larger messages."""
    env = {"HAL_COMM_TRANSPORT": "ucx", "HAL_COMM_CHUNK_BYTES": "64K"}
    ok(
        hal_run(
            2,
            [WORKER, "--sizes", "100003", "--dtypes", "float64", "--algos", "all_reduce:ring"],
            env,
        ),
        2,
    )


@needs_ucx
@pytest.mark.parametrize("ranks", [2, 3])
def test_point_to_point_over_ucx(ranks: int) -> None:
    """hal.comm send/recv over UCX: both directions at once, tags (FIFO per tag), rings."""
    cases = ["exchange", "tags"] if ranks == 2 else ["ring"]
    proc = hal_run(ranks, [P2P, *cases], UCX_TCP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for case in cases:
        for r in range(ranks):
            assert f"OK {case} rank={r} transport=ucx" in proc.stdout, proc.stdout + proc.stderr


@needs_ucx
def test_silent_rank_is_named_within_the_timeout() -> None:
    """Rank 1 stops calling: rank 0's all_reduce fails after HAL_COMM_TIMEOUT_MS naming rank 1."""
    proc = hal_run(2, [SCEN, "stall"], {**UCX_TCP, "HAL_COMM_TIMEOUT_MS": "700"}, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "op=all_reduce ranks=(1,)" in proc.stdout, proc.stdout + proc.stderr
    assert "no progress for 700 ms" in proc.stdout, proc.stdout


@needs_ucx
def test_dead_rank_is_named() -> None:
    """Rank 1 dies between collectives: rank 0's next call fails naming rank 1."""
    proc = hal_run(2, [SCEN, "die"], UCX_TCP, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks=(1,)" in proc.stdout, proc.stdout + proc.stderr


@needs_ucx
@pytest.mark.parametrize(("backend", "path"), [("cpu", "host-ucx"), ("opencl", "staged-ucx")])
def test_plan_names_ucx_and_its_path(backend: str, path: str) -> None:
    """The plan names the transport and the memory path: the CPU emulator's host memory goes into
    UCX's host pieces (host-ucx); PoCL OpenCL memory is staged through them with hal.copy
    (staged-ucx), said once in the log."""
    env = {**UCX_TCP, "HAL_BACKENDS": backend, "HAL_LOG_LEVEL": "info"}
    if backend == "opencl":
        try:
            import pyopencl  # noqa: F401
        except ImportError:
            pytest.skip("pyopencl is not installed")
        env["POCL_DEVICES"] = "pthread"
    proc = hal_run(2, [UCX_WORKER, "plan"], env, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in (0, 1):
        assert f"OK rank={r} transport=ucx path={path} ucx=1." in proc.stdout, (
            proc.stdout + proc.stderr
        )
        assert (
            f"ucx: rank {r}, {backend}:0: " in proc.stderr and f"(plan path {path})" in proc.stderr
        ), proc.stderr
    assert proc.stdout.count("sum=3") == 2, proc.stdout
    # pieces UCX moved without a host piece: the two calls' signatures (NumPy, one each way: 4),
    # plus, for host memory, the all_gather's data
    direct = [int(x) for x in re.findall(r"direct=(\d+)", proc.stdout)]
    assert len(direct) == 2, proc.stdout
    assert all(d > 4 for d in direct) if path == "host-ucx" else direct == [4, 4], direct


def test_missing_ucx_is_a_clear_comm_error(tmp_path: Path) -> None:
    """Without the binding (hidden here by a shadowing ``ucxx`` that fails to import), HAL_COMM_TRANSPORT=ucx
    is a CommError naming the transport, the reason and the install command on every rank; no traceback."""
    (tmp_path / "ucxx").mkdir()
    (tmp_path / "ucxx" / "__init__.py").write_text("raise ImportError('no UCX here (test)')\n")
    env = {
        "HAL_COMM_TRANSPORT": "ucx",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    proc = hal_run(2, [UCX_WORKER, "refused"], env, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("REFUSED")]
    assert len(lines) == 2, proc.stdout + proc.stderr
    for line in lines:
        assert "REFUSED init transport 'ucx' cannot connect these ranks" in line, line
        assert "no UCX here (test)" in line and INSTALL in line, line
    assert "Traceback" not in proc.stderr, proc.stderr


def test_doctor_lists_ucx_with_its_reason(tmp_path: Path) -> None:
    """``hal doctor --json`` lists every transport: ucx installed, or unavailable with the install command."""
    (tmp_path / "ucxx").mkdir()
    (tmp_path / "ucxx" / "__init__.py").write_text("raise ImportError('no UCX here (test)')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAL_", "UCX_"))}
    env["HAL_BACKENDS"] = "cpu"
    for path, want in ((None, MISSING), (str(tmp_path), "no UCX here (test)")):
        run_env = dict(env, PYTHONPATH=path) if path else env
        proc = subprocess.run(
            [sys.executable, "-m", "hal", "doctor", "--json", "--local"],
            env=run_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = json.loads(proc.stdout)
        got = report["transports"]
        assert {"shm", "tcp", "mpi", "ucx"} <= set(got) and got["tcp"] is None, got
        if want is None:
            assert got["ucx"] is None, got
            # with HAL_COMM_TRANSPORT=ucx the version table has the UCX library the binding loaded
            proc = subprocess.run(
                [sys.executable, "-m", "hal", "doctor", "--json", "--local"],
                env=dict(run_env, HAL_COMM_TRANSPORT="ucx"),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            rank0 = json.loads(proc.stdout)["ranks"][0]
            assert rank0["versions"]["ucx"] == ucx_version() and "ucx" in rank0["used"], rank0
        else:
            assert want in got["ucx"] and INSTALL in got["ucx"], got


@needs_ucx
def test_bench_comm_transport_ucx() -> None:
    """``hal bench comm --transport ucx`` times hal's collectives over UCX; an unknown transport is refused."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAL_", "UCX_"))}
    env.update(HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1", UCX_TLS="tcp")
    bench = [sys.executable, "-m", "hal", "bench", "comm", "-n", "2", "--min", "4K", "--max", "4K"]
    proc = subprocess.run(
        [*bench, "--batches", "1", "--transport", "ucx", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["transport"] == "ucx" and result["rows"][0]["oop_wrong"] == 0, result
    bad = subprocess.run(
        [*bench, "--transport", "nosuch"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "transport 'nosuch' is not registered" in bad.stderr, bad.stderr


def test_simulate_knows_ucx(tmp_path: Path) -> None:
    """``hal simulate --transport ucx``: the planner uses UCX's α, β where no link is described (no binding needed)."""
    topo = {"version": 1, "hosts": [{"name": f"n{i}", "devices": 2} for i in range(4)], "links": []}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(topo))
    got = {}
    sim = [sys.executable, "-m", "hal", "simulate", "--topology", str(path), "--size", "64M"]
    for transport in ("tcp", "ucx"):
        proc = subprocess.run(
            [*sim, "--transport", transport, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        got[transport] = json.loads(proc.stdout)
    ucx, tcp = got["ucx"], got["tcp"]
    assert ucx["transport"] == "ucx" and ucx["alpha_us"] == pytest.approx(20.0), ucx
    best = {t: min(r["time_us"] for r in g["algorithms"] if r["time_us"]) for t, g in got.items()}
    assert best["ucx"] < best["tcp"], best  # RDMA-class α, β against hal's TCP
    assert tcp["beta_gbps"] < ucx["beta_gbps"]


@needs_ucx
def test_a_transport_ucx_lacks_is_a_clear_comm_error() -> None:
    """UCX_TLS naming no transport UCX has: every rank's init is a CommError naming UCX_TLS, no crash."""
    proc = hal_run(2, [UCX_WORKER, "refused"], {**UCX_TCP, "UCX_TLS": "nosuch_tl"}, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("REFUSED")]
    assert len(lines) == 2, proc.stdout + proc.stderr
    for line in lines:
        assert (
            "could not open a UCX context and worker" in line and "UCX_TLS='nosuch_tl'" in line
        ), line


@needs_ucx
def test_point_to_point_errors_over_ucx() -> None:
    """Mismatched counts, a receive without a send (the peer moved on to a collective), a timeout: each fails
    the call only, naming both ranks, and the communicator goes on working over UCX (the worker checks)."""
    env = {**UCX_TCP, "HAL_COMM_TIMEOUT_MS": "2500", "HAL_CPU_DEVICES": "2"}
    proc = hal_run(2, [P2P, "errors"], env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK errors rank=0 transport=ucx" in proc.stdout, proc.stdout + proc.stderr
    assert "OK errors rank=1 transport=ucx" in proc.stdout, proc.stdout + proc.stderr
    errs = dict(re.findall(r"^P2P-ERROR (\w+) rank=1 (.*)$", proc.stdout, re.M))
    assert errs["count"].startswith("CommError ranks=(1, 0): send/recv mismatch"), errs
    assert "count 10 vs 12" in errs["count"] and "dtype float32 vs int32" in errs["dtype"], errs
    assert (
        "no matching send" in errs["nosend"] and "rank 0 moved on to all_reduce" in errs["nosend"]
    ), errs
    assert "ranks=(0,)" in errs["timeout"] and "no progress for 2500 ms" in errs["timeout"], errs
