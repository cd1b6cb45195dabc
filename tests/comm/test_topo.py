"""Topology: ``hal topo``, ``HAL_TOPO_FILE`` (round trip, fallback), agreement at init, hierarchical all_reduce."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hal
from hal.comm import _plan
from hal.comm._topo import (
    FALLBACK_MARKER,
    EnvTopology,
    Topology,
    TopologyError,
    discover,
    host_groups,
    load,
    resolve,
)

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "topo_worker.py")


def two_hosts(ranks: list[str] | None = None, bw: float = 0.5) -> dict[str, Any]:
    """Return a topology dict of hosts a and b (one device each) joined by one link."""
    d: dict[str, Any] = {
        "version": 1,
        "hosts": [{"name": "a", "devices": 1}, {"name": "b", "devices": 1}],
        "links": [{"hosts": ["a", "b"], "bandwidth_gbps": bw, "latency_us": 50}],
    }
    if ranks is not None:
        d["ranks"] = ranks
    return d


def write(tmp_path: Path, name: str, data: object) -> str:
    """Write ``data`` as JSON (or text) to ``tmp_path/name`` and return the path."""
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def env_run(n: int, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``hal run -n N`` with a clean HAL_* environment."""
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1"}, **env)
    return subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", str(n), *args],
        env=child,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


# -- the format -----------------------------------------------------------------------------
def test_discover_measures_every_pair() -> None:
    """Discovery lists this host's devices and a path, bandwidth and latency per ordered pair."""
    devs = hal.devices("cpu")[:2]
    topo = discover(devs, measure_bytes=1 << 16, reps=1)
    (host,) = topo.hosts
    assert topo.devices[host] == tuple(str(d) for d in devs)
    pairs = {(p.src, p.dst): p for p in topo.p2p[host]}
    assert set(pairs) == {(i, j) for i in range(len(devs)) for j in range(len(devs))}
    for (i, j), p in pairs.items():
        assert p.path == (
            "local"
            if i == j
            else hal.copy_path(
                hal.asarray([0.0], device=devs[j]), hal.asarray([0.0], device=devs[i])
            )
        )
        assert p.bandwidth_gbps > 0 and p.latency_us > 0
    assert topo.links == ()


def test_round_trip_through_hal_topo_dump(tmp_path: Path) -> None:
    """``hal topo --dump`` writes what HAL_TOPO_FILE loads back unchanged (same digest)."""
    out = tmp_path / "topo.json"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HAL_")},
        "HAL_BACKENDS": "cpu",
        "HAL_CPU_DEVICES": "2",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "topo", "--dump", str(out), "--size", "64K"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    topo = load(out)
    assert len(topo.devices[topo.hosts[0]]) == 2 and len(topo.p2p[topo.hosts[0]]) == 4
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "topo", "--json"],
        env={**env, "HAL_TOPO_FILE": str(out)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    again = Topology.from_dict(json.loads(proc.stdout))
    assert again.digest() == topo.digest()
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "topo"],
        env={**env, "HAL_TOPO_FILE": str(out)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "peer" in proc.stdout and f"digest: {topo.digest()}" in proc.stdout


def test_hal_topo_rejects_a_bad_size() -> None:
    """A bad ``--size`` is a usage error naming the value."""
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "topo", "--size", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "'lots'" in proc.stderr


BAD = {
    "not an object": [1, 2],
    "no hosts": {"version": 1, "hosts": []},
    "wrong version": {"version": 9, "hosts": [{"name": "a"}]},
    "host twice": {"hosts": [{"name": "a"}, {"name": "a"}]},
    "p2p device out of range": {
        "hosts": [
            {
                "name": "a",
                "devices": 1,
                "p2p": [{"src": 0, "dst": 3, "path": "peer", "bandwidth_gbps": 1, "latency_us": 1}],
            }
        ]
    },
    "unknown path": {
        "hosts": [
            {
                "name": "a",
                "devices": 2,
                "p2p": [{"src": 0, "dst": 1, "path": "warp", "bandwidth_gbps": 1, "latency_us": 1}],
            }
        ]
    },
    "negative bandwidth": {
        "hosts": [{"name": "a"}, {"name": "b"}],
        "links": [{"hosts": ["a", "b"], "bandwidth_gbps": -1, "latency_us": 1}],
    },
    "nan latency": {
        "hosts": [{"name": "a"}, {"name": "b"}],
        "links": [{"hosts": ["a", "b"], "bandwidth_gbps": 1, "latency_us": float("nan")}],
    },
    "link to unknown host": {
        "hosts": [{"name": "a"}],
        "links": [{"hosts": ["a", "zz"], "bandwidth_gbps": 1, "latency_us": 1}],
    },
    "rank on unknown host": {"hosts": [{"name": "a"}], "ranks": ["a", "b"]},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_topology_is_rejected_with_the_place(case: str) -> None:
    """Every invalid topology raises TopologyError (a HalError and a ValueError) saying what is wrong."""
    with pytest.raises(TopologyError) as info:
        Topology.from_dict(BAD[case])
    assert isinstance(info.value, hal.HalError) and isinstance(info.value, ValueError)
    assert str(info.value)


@pytest.mark.parametrize("content", ["", "{", '{"hosts": [{"name": "a"}]', "null"])
def test_truncated_file_falls_back_with_the_marker(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A truncated or garbage file: the flat default and one ``topology fallback:`` line with a hint."""
    path = write(tmp_path, "t.json", content)
    state = EnvTopology.read({"HAL_TOPO_FILE": path})
    assert state.key == "fallback" and state.error
    with caplog.at_level(logging.WARNING, logger="hal.comm"):
        topo, ranks = resolve(state, ["h", "h"])
    assert topo.source == "flat" and ranks == ["h", "h"]
    (rec,) = [r for r in caplog.records if FALLBACK_MARKER in r.getMessage()]
    assert "hint:" in rec.getMessage() and path in rec.getMessage()


def test_missing_and_inconsistent_files_fall_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing file, and a file whose ``ranks`` do not fit the world, fall back too."""
    with caplog.at_level(logging.WARNING, logger="hal.comm"):
        topo, _ = resolve(EnvTopology.read({"HAL_TOPO_FILE": str(tmp_path / "nope.json")}), ["h"])
        assert topo.source == "flat"
        good = write(tmp_path, "t.json", two_hosts(["a", "b", "a"]))
        topo, _ = resolve(EnvTopology.read({"HAL_TOPO_FILE": good}), ["h", "h"])
        assert topo.source == "flat"
        # no ``ranks``: the real host names must be in the file
        topo, _ = resolve(
            EnvTopology.read({"HAL_TOPO_FILE": write(tmp_path, "u.json", two_hosts())}), ["h"]
        )
        assert topo.source == "flat"
    msgs = [r.getMessage() for r in caplog.records if FALLBACK_MARKER in r.getMessage()]
    assert len(msgs) == 3
    assert (
        "cannot read" in msgs[0]
        and "lists 3 ranks but the world has 2" in msgs[1]
        and "not in the topology" in msgs[2]
    )


def test_no_file_is_flat_and_silent(caplog: pytest.LogCaptureFixture) -> None:
    """Without HAL_TOPO_FILE ranks are grouped by real host name, with no log line."""
    with caplog.at_level(logging.WARNING, logger="hal.comm"):
        topo, ranks = resolve(EnvTopology.read({}), ["x", "y", "x"])
    assert not caplog.records
    assert topo.hosts == ("x", "y") and host_groups(ranks) == [[0, 2], [1]]


# -- the planner ----------------------------------------------------------------------------
class _Tcp:
    name, alpha_s, beta_s_per_byte = "tcp", 50e-6, 1 / 2e9


def _choose(
    nbytes: int,
    hosts: int,
    per_host: int,
    inter: tuple[float, float] | None,
    override: str | None = None,
) -> _plan.Plan:
    return _plan.choose(
        "all_reduce",
        nbytes=nbytes,
        ranks=hosts * per_host,
        hosts=hosts,
        transport=_Tcp,
        chunk_bytes=1 << 20,
        path="host-tcp",
        override=override,
        per_host=per_host,
        inter=inter,
    )


def test_cost_model_picks_hierarchical_across_slow_links() -> None:
    """Several hosts of several ranks, a slow link: large all_reduce goes hierarchical; one host never."""
    slow = (50e-6, 1 / 1e9)
    assert _choose(256 << 20, 2, 4, slow).algorithm == "hierarchical"
    assert _choose(256 << 20, 16, 8, slow).algorithm == "hierarchical"
    assert _choose(256 << 20, 1, 8, None).algorithm != "hierarchical"
    assert math.isinf(
        _plan.predict(
            "all_reduce", "hierarchical", 1 << 20, 8, 1e-5, 1e-9, 1 << 20, hosts=1, per_host=8
        )
    )
    # uneven hosts (per_host=0) cannot run it
    assert math.isinf(
        _plan.predict(
            "all_reduce", "hierarchical", 1 << 20, 5, 1e-5, 1e-9, 1 << 20, hosts=2, per_host=0
        )
    )


def test_forcing_hierarchical_on_one_host_is_a_clear_error() -> None:
    """HAL_COMM_ALGO=allreduce:hierarchical where it cannot run: CommError naming what it needs."""
    with pytest.raises(hal.CommError, match="several hosts"):
        _choose(1 << 20, 1, 4, None, override="hierarchical")


# -- several processes ----------------------------------------------------------------------
@pytest.mark.parametrize("ranks", [["a", "a", "b", "b"], ["a", "b", "a", "b"]])
def test_hierarchical_all_reduce_on_emulated_hosts(tmp_path: Path, ranks: list[str]) -> None:
    """4 ranks placed on 2 "hosts" by HAL_TOPO_FILE: large calls go hierarchical, results match NumPy."""
    path = write(tmp_path, "t.json", two_hosts(ranks))
    proc = env_run(4, [WORKER, "plan", "0,5,1001,300000"], {"HAL_TOPO_FILE": path})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("OK ")]
    assert len(lines) == 4, proc.stdout + proc.stderr
    for line in lines:
        assert "algos=" in line and line.split("algos=")[1].split()[0].endswith(",hierarchical"), (
            line
        )
        assert "hosts=2" in line
    assert len({line.split("hash=")[1] for line in lines}) == 1


def test_forced_hierarchical_three_hosts_matches_numpy(tmp_path: Path) -> None:
    """HAL_COMM_ALGO forces hierarchical on 3 hosts x 2 ranks, odd sizes included."""
    topo = {
        "hosts": [{"name": h, "devices": 2} for h in "abc"],
        "ranks": ["a", "b", "c", "a", "b", "c"],
    }
    path = write(tmp_path, "t.json", topo)
    proc = env_run(
        6,
        [WORKER, "plan", "1,7,6001"],
        {"HAL_TOPO_FILE": path, "HAL_COMM_ALGO": "allreduce:hierarchical"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("algos=hierarchical,hierarchical,hierarchical") == 6, proc.stdout


def test_fallback_is_logged_on_every_rank(tmp_path: Path) -> None:
    """A broken HAL_TOPO_FILE: every rank logs the marker, and the communicator still works (flat)."""
    path = write(tmp_path, "t.json", '{"hosts": [')
    proc = env_run(2, [WORKER, "plan", "13"], {"HAL_TOPO_FILE": path})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count(FALLBACK_MARKER) == 2, proc.stderr
    assert proc.stdout.count("hosts=1") == 2


def test_ranks_disagreeing_on_the_topology_fail_at_init(tmp_path: Path) -> None:
    """Rank 1 reads another topology: CommError at init on every rank, naming rank 1; no hang."""
    a = write(tmp_path, "a.json", two_hosts(["a", "b"]))
    b = write(tmp_path, "b.json", two_hosts(["a", "b"], bw=5.0))
    proc = env_run(2, [WORKER, "disagree"], {"HAL_TOPO_FILE": a, "HAL_TOPO_FILE_RANK1": b})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if "CommError" in x]
    assert len(lines) == 2, proc.stdout
    for line in lines:
        assert "op=init ranks=(1,)" in line and "topology" in line
