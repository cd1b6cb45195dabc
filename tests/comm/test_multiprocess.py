"""hal.comm across processes: ``hal run``, shared memory and TCP on loopback, MPI, failures.

Each launch runs many combinations (tests/comm/worker.py runs the whole matrix per rank),
so the suite stays within a few minutes on two cores.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comm_launch import hal_run, ok  # noqa: E402

WORKER = str(HERE / "worker.py")
SCEN = str(HERE / "scenarios.py")
BIN = Path(sys.executable).parent


ALL_ALGOS = (
    "all_reduce:ring,broadcast:scatter_allgather,reduce:reduce_scatter_gather;"
    "all_reduce:recursive_doubling,broadcast:tree,reduce:tree;"
    "all_reduce:rabenseifner"
)


def test_shm_2_ranks_matrix_under_jitter() -> None:
    """Every collective x op x dtype x in/out-of-place, shared memory, 2 ranks, jitter on."""
    ok(hal_run(2, [WORKER, "--sizes", "0,1,13", "--algos", ALL_ALGOS], {"HAL_CPU_JITTER": "3"}), 2)


def test_shm_4_ranks_every_algorithm() -> None:
    """4 ranks (power of two): recursive doubling all_gather included; sizes not divisible by 4."""
    algos = ALL_ALGOS + ";all_gather:recursive_doubling"
    ok(hal_run(4, [WORKER, "--sizes", "0,7", "--dtypes", "float32,int64", "--algos", algos]), 4)


def test_shm_large_messages_pipelined() -> None:
    """Messages of many slots (small chunk size forces the pipeline to wrap the rings)."""
    proc = hal_run(
        3,
        [WORKER, "--sizes", "100003", "--dtypes", "float64", "--algos", ALL_ALGOS],
        {"HAL_COMM_CHUNK_BYTES": "64K", "HAL_COMM_SHM_SLOTS": "2"},
    )
    ok(proc, 3)


def test_shm_through_hal_copy_only() -> None:
    """HAL_COMM_DLPACK=0: every piece moves with hal.copy (the path of non-host memory), 3 ranks."""
    env = {"HAL_COMM_DLPACK": "0", "HAL_COMM_CHUNK_BYTES": "8K", "HAL_CPU_JITTER": "5"}
    ok(
        hal_run(
            3,
            [
                WORKER,
                "--sizes",
                "0,7001",
                "--dtypes",
                "float32,int64",
                "--algos",
                "all_reduce:ring;all_reduce:rabenseifner",
            ],
            env,
        ),
        3,
    )


def test_opencl_ranks() -> None:
    """One PoCL OpenCL device per process: device memory the host cannot map, staged by hal.copy."""
    try:
        import pyopencl  # noqa: F401
    except ImportError:
        pytest.skip("pyopencl is not installed")
    env = {"HAL_BACKENDS": "opencl", "POCL_DEVICES": "pthread"}
    ok(hal_run(2, [WORKER, "--sizes", "0,13", "--dtypes", "float32"], env), 2)


def test_tcp_3_ranks_matrix() -> None:
    """TCP on loopback, 3 ranks (not a power of two: the fold), two sockets per peer."""
    env = {"HAL_COMM_TRANSPORT": "tcp", "HAL_COMM_NSOCKS": "2", "HAL_COMM_CHUNK_BYTES": "16K"}
    ok(
        hal_run(
            3,
            [WORKER, "--sizes", "0,13,5001", "--dtypes", "float32,int32", "--algos", ALL_ALGOS],
            env,
        ),
        3,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_torchrun_environment() -> None:
    """RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (as torchrun sets them) work too."""
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
        env.update(
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            HAL_BACKENDS="cpu",
            HAL_CPU_DEVICES="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, WORKER, "--sizes", "0,3", "--dtypes", "float32"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.startswith("OK"), out + err


def _mpiexec() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    found = BIN / "mpiexec"
    return str(found) if found.exists() else shutil.which("mpiexec")


@pytest.mark.parametrize("transport", ["mpi", "shm"])
def test_under_mpiexec(transport: str) -> None:
    """mpiexec (mpich wheel) + mpi4py: the MPI transport, and shm bootstrapped through MPI."""
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpi4py/mpiexec not installed (pip install 'hal-sdk[mpi]')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    # hal's own algorithms over the transport (under mpiexec MPI's collectives would serve them:
    # the mpi provider, tested against this path in tests/comm/test_providers.py)
    env.update(
        HAL_BACKENDS="cpu",
        HAL_CPU_DEVICES="1",
        HAL_COMM_TRANSPORT=transport,
        HAL_COMM_PROVIDER="generic",
    )
    proc = subprocess.run(
        [
            mpiexec,
            "-n",
            "2",
            sys.executable,
            WORKER,
            "--sizes",
            "0,13",
            "--dtypes",
            "float64,int32",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(f"transport={transport}") == 2, proc.stdout + proc.stderr


# -- failures -------------------------------------------------------------------------------
def test_launcher_stops_the_others_and_names_the_rank() -> None:
    proc = hal_run(3, [SCEN, "fail_rank1"], timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "hal run: rank 1 exited with code 3; stopped the other rank(s) 0, 2" in proc.stderr


def test_launcher_names_a_rank_killed_by_a_signal() -> None:
    proc = hal_run(2, [SCEN, "kill_rank1"], timeout=60)
    assert proc.returncode == 128 + 9, proc.stderr
    assert "hal run: rank 1 was killed by SIGKILL; stopped the other rank(s) 0" in proc.stderr


def test_launcher_store_port_is_outside_the_ephemeral_range(tmp_path: Path) -> None:
    """`hal run` picks its store's port below the kernel's ephemeral range (where every outgoing
    connection takes its local port), so that a shrink's rendezvous at the port + 1 does not
    find it taken by a connection of some other program (seen in CI: "cannot listen on
    127.0.0.1:34522: the address is in use", no listener to name)."""
    script = tmp_path / "port.py"
    script.write_text("import os\nprint('STORE', os.environ['HAL_STORE_ADDR'])\n")
    lo = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if lo <= 10_100:
        pytest.skip(f"the ephemeral range starts at {lo}: no room below it")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    ports = set()
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-m", "hal", "run", "-n", "2", str(script)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        addrs = {ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("STORE")}
        assert len(addrs) == 1, proc.stdout  # both ranks meet at one store
        ports.add(int(addrs.pop().rsplit(":", 1)[1]))
    assert all(10_000 <= p < lo for p in ports), (ports, lo)


def test_launcher_usage_errors() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", "2"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "give a script" in proc.stderr


@pytest.mark.parametrize("scenario", ["mismatch", "mismatch_collective"])
def test_mismatch_detected_on_every_rank(scenario: str) -> None:
    proc = hal_run(2, [SCEN, scenario], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if "CommError" in x]
    assert len(lines) == 2, proc.stdout + proc.stderr
    assert all("ranks=(" in x and "mismatch" in x for x in lines)
    if scenario == "mismatch":
        assert any("count 10 vs 12" in x or "count 12 vs 10" in x for x in lines), lines
        assert any("op 'sum' vs 'max'" in x or "op 'max' vs 'sum'" in x for x in lines), lines
    else:
        assert any("broadcast" in x and "all_reduce" in x for x in lines), lines


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_timeout_names_the_silent_rank(transport: str) -> None:
    proc = hal_run(
        2,
        [SCEN, "stall"],
        {"HAL_COMM_TIMEOUT_MS": "700", "HAL_COMM_TRANSPORT": transport},
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "op=all_reduce ranks=(1,)" in proc.stdout, proc.stdout + proc.stderr
    assert "no progress for 700 ms" in proc.stdout and "not heard from rank(s) 1" in proc.stdout


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_dead_rank_named(transport: str) -> None:
    proc = hal_run(2, [SCEN, "die"], {"HAL_COMM_TRANSPORT": transport}, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks=(1,)" in proc.stdout and "rank" in proc.stdout, proc.stdout + proc.stderr


def test_plan_in_multiprocess_run() -> None:
    proc = hal_run(2, [SCEN, "plan"], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    small, large = proc.stdout.strip().splitlines()[-2:]
    assert "transport=shm" in small and "algorithm=recursive_doubling" in small
    assert "algorithm=recursive_doubling" not in large and "chunk=" in large


# -- hal bench comm ---------------------------------------------------------------------------
def _bench(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update(HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1")
    return subprocess.run(
        [sys.executable, "-m", "hal", "bench", "comm", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.parametrize(
    "op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"]
)
def test_bench_json_every_op(op: str) -> None:
    import json

    proc = _bench(["--op", op, "-n", "2", "--min", "1K", "--max", "2K", "--iters", "2", "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert (
        result["op"] == op
        and result["ranks"] == 2
        and [r["size"] for r in result["rows"]] == [1024, 2048]
    )
    for row in result["rows"]:
        assert row["oop_wrong"] == 0 and row["inplace_wrong"] == 0, row
        factor = {"all_reduce": 1.0, "broadcast": 1.0, "reduce": 1.0}.get(op, 0.5)
        assert row["oop_busbw"] == pytest.approx(row["oop_algbw"] * factor)


def test_bench_table_with_mpi_baseline() -> None:
    if _mpiexec() is None:
        pytest.skip("mpi4py/mpiexec not installed")
    proc = _bench(
        [
            "--op",
            "all_reduce",
            "-n",
            "2",
            "--min",
            "4K",
            "--max",
            "8K",
            "--iters",
            "3",
            "--baseline",
            "mpi",
        ]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "busbw" in proc.stdout and "#wrong" in proc.stdout and "ratio" in proc.stdout
    rows = [x for x in proc.stdout.splitlines() if not x.startswith("#")]
    assert len(rows) == 2 and all(x.split()[2] == "float32" for x in rows)


def test_rendezvous_names_the_rank_that_never_came() -> None:
    """Rank 1 of 2 never starts: rank 0's init fails after the init timeout, naming rank 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update(
        HAL_RANK="0",
        HAL_WORLD_SIZE="2",
        HAL_STORE_ADDR=f"127.0.0.1:{_free_port()}",
        HAL_BACKENDS="cpu",
        HAL_COMM_INIT_TIMEOUT_MS="800",  # the rendezvous' own timeout (not HAL_COMM_TIMEOUT_MS)
    )
    code = (
        "import hal, hal.comm\ntry:\n    hal.comm.init()\n"
        "except hal.CommError as e:\n    print('ranks', e.ranks, e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "ranks (1,)" in proc.stdout and "never arrived" in proc.stdout, proc.stdout + proc.stderr


def test_ranks_disagreeing_on_settings_fail_at_init() -> None:
    """HAL_COMM_ALGO differs between ranks: init fails on every rank, naming the setting."""
    port = str(_free_port())
    procs = []
    for rank, algo in ((0, "allreduce:ring"), (1, "allreduce:rabenseifner")):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
        env.update(
            HAL_RANK=str(rank),
            HAL_WORLD_SIZE="2",
            HAL_STORE_ADDR=f"127.0.0.1:{port}",
            HAL_BACKENDS="cpu",
            HAL_COMM_ALGO=algo,
            HAL_COMM_TIMEOUT_MS="20000",
        )
        code = (
            "import hal, hal.comm\ntry:\n    hal.comm.init()\n"
            "except hal.CommError as e:\n    print('CommError', e)\n"
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert "CommError ranks disagree on HAL_COMM_ALGO" in out, out + err


def test_tiny_rings_do_not_deadlock() -> None:
    """Two slots per ring and 3 ranks: ranks a call apart never block each other (eager sends are
    placed only where there is room)."""
    ok(
        hal_run(
            3,
            [WORKER, "--sizes", "0,1,13,3000", "--dtypes", "float32"],
            {"HAL_COMM_SHM_SLOTS": "2", "HAL_COMM_CHUNK_BYTES": "4K"},
        ),
        3,
    )
