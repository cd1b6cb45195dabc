"""Collective providers: MPI's own collectives under real mpiexec against the generic path,
forced and impossible choices, fallbacks logged once, NCCL's reason where it cannot run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hal
import hal.comm
from hal.comm import _providers

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "provider_worker.py")
MPIEXEC = Path(sys.executable).parent / "mpiexec"

SCRIPT = """
import sys, numpy as np, hal, hal.comm
c = hal.comm.init()
s = c.device.create_stream()
for dt in ("float16", "float16", "float32"):
    x = hal.asarray(np.full(5, c.rank + 1, dt), device=c.device)
    w = c.all_reduce(x, stream=s)
    w.wait()
    print(f"CALL {c.rank} {c.provider} {dt} {w.plan.provider} {w.plan.algorithm} [{w.plan.fallback}] "
          f"{float(x.to_host()[0])} END", flush=True)
c.close()
"""


_CALL = re.compile(r"CALL (\d+) (\w+) (\w+) (\w+) (\w+) \[([^]]*)\] ([\d.]+) END")
_OK = re.compile(r"OK (\d+) provider=(\w+) served=(\d+) fallbacks=(\d+) rank=(\d+)")


def _calls(text: str) -> list[tuple[str, ...]]:
    """The CALL records (mpiexec may interleave the ranks' lines)."""
    return sorted(_CALL.findall(text))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1", "HAL_COMM_TIMEOUT_MS": "60000"})
    env.update(extra)
    return env


def _mpiexec(n: int, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    if not MPIEXEC.exists():
        pytest.skip("mpiexec (mpich wheel) not installed: pip install 'hal-sdk[mpi]'")
    return subprocess.run(
        [str(MPIEXEC), "-n", str(n), sys.executable, *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


def _hal_run(n: int, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``hal run -n N``; ``["-c", SOURCE]`` runs SOURCE from a file (hal run takes scripts)."""
    if args[:1] == ["-c"]:
        import hashlib
        import tempfile

        path = (
            Path(tempfile.gettempdir())
            / f"hal_provider_{hashlib.sha256(args[1].encode()).hexdigest()[:12]}.py"
        )
        path.write_text(args[1])
        args = [str(path), *args[2:]]
    return subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", str(n), *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


@pytest.mark.parametrize("ranks", [2, 3])
def test_mpi_provider_matches_generic_under_mpiexec(ranks: int) -> None:
    """The matrix passes under both; the same random float32 calls agree; MPI served the calls."""
    proc = _mpiexec(ranks, [WORKER, "--sizes", "0,13"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = _OK.findall(proc.stdout)
    generic = [ln for ln in lines if ln[1] == "generic"]
    mpi = [ln for ln in lines if ln[1] == "mpi"]
    assert len(generic) == len(mpi) == ranks, out
    assert all(ln[2] == "0" for ln in generic), out
    assert all(int(ln[2]) > 100 and ln[3] == "0" for ln in mpi), out
    assert proc.stdout.count("SAME generic,mpi") == ranks, out


def test_mpiexec_picks_mpi_by_default_and_falls_back_visibly_once() -> None:
    """Unset HAL_COMM_PROVIDER under mpiexec: mpi serves float32; float16 falls back, logged once per rank."""
    proc = _mpiexec(2, ["-c", SCRIPT])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    calls = _calls(proc.stdout)
    assert len(calls) == 6, out
    for _rank, provider, dt, plan_provider, algorithm, fallback, value in calls:
        assert provider == "mpi" and value == "3.0", out
        if dt == "float32":
            assert (plan_provider, algorithm, fallback) == ("mpi", "mpi", ""), out
        else:
            assert (
                plan_provider == "generic" and fallback == "MPI has no float16 arithmetic for sum"
            ), out
    line = "all_reduce fell back from collective provider mpi to the generic algorithms: MPI has no float16"
    assert proc.stderr.count(line) == 2, out  # once per rank, not once per call


def test_forced_generic_under_mpiexec_and_the_timeline_names_the_provider(tmp_path: Path) -> None:
    """HAL_COMM_PROVIDER=generic: hal's algorithms; with mpi, the timeline slices say provider=mpi."""
    proc = _mpiexec(2, ["-c", SCRIPT], HAL_COMM_PROVIDER="generic")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = _calls(proc.stdout)
    assert len(calls) == 6 and all(c[1] == c[3] == "generic" and c[5] == "" for c in calls), (
        proc.stdout
    )
    assert "fell back" not in proc.stderr
    trace = tmp_path / "trace.json"
    proc = _mpiexec(2, ["-c", SCRIPT], HAL_TRACE=str(trace))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = json.loads((tmp_path / "trace.rank0.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    slices = [e for e in events if e.get("name") == "all_reduce" and e.get("ph") == "X"]
    assert [e["args"]["provider"] for e in slices] == ["generic", "generic", "mpi"], slices
    assert "MPI has no float16" in slices[0]["args"]["fallback"]


def test_forced_provider_that_cannot_serve_is_an_error_naming_why() -> None:
    """Under hal run, HAL_COMM_PROVIDER=mpi / nccl: CommError with each rank's reason."""
    proc = _hal_run(2, ["-c", SCRIPT], HAL_COMM_PROVIDER="mpi")
    assert proc.returncode != 0
    assert (
        "HAL_COMM_PROVIDER=mpi cannot serve this communicator: rank 0: the ranks were not started by "
        "mpiexec (launcher hal)"
    ) in proc.stderr, proc.stderr
    proc = _hal_run(2, ["-c", SCRIPT], HAL_COMM_PROVIDER="nccl")
    assert proc.returncode != 0
    assert (
        "HAL_COMM_PROVIDER=nccl cannot serve this communicator: rank 0: cpu:0 is not a CUDA device"
        in proc.stderr
    )


def test_unknown_provider_and_disagreeing_ranks() -> None:
    """A typo is a ConfigError naming the value and the choices."""
    proc = _hal_run(2, ["-c", SCRIPT], HAL_COMM_PROVIDER="ncl")
    assert proc.returncode != 0
    assert (
        "HAL_COMM_PROVIDER" in proc.stderr
        and "'ncl'" in proc.stderr
        and "generic, nccl, mpi" in proc.stderr
    )


def test_hal_comm_algo_override_keeps_the_generic_algorithm() -> None:
    """HAL_COMM_ALGO=all_reduce:ring asks hal's own ring: not a fallback, not logged."""
    proc = _mpiexec(2, ["-c", SCRIPT], HAL_COMM_ALGO="all_reduce:ring")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    calls = _calls(proc.stdout)
    assert len(calls) == 6 and all(
        c[3:] == ("generic", "ring", "HAL_COMM_ALGO asks all_reduce:ring", "3.0") for c in calls
    ), out
    assert "fell back" not in proc.stderr


def test_nccl_reports_unavailable_with_the_reason() -> None:
    """No CUDA device here: the reason names the device; with a CUDA device, what is missing."""
    dev = hal.devices("cpu")[0]
    why = _providers.NcclProvider.unavailable(device=dev, launcher="hal", size=2, transport=None)
    assert why == f"{dev} is not a CUDA device (NCCL serves the cuda backend)"
    nccl, reason = _providers._nccl_module()
    if nccl is None:
        assert reason and ("libnccl" in reason or "not importable" in reason), reason
    mpi_why = _providers.MpiProvider.unavailable(device=dev, launcher="hal", size=2, transport=None)
    assert mpi_why == "the ranks were not started by mpiexec (launcher hal)"


def test_choose_and_registry() -> None:
    """The first provider every rank can use wins; forced ones must be usable everywhere."""
    tables = [{"nccl": "no GPU", "mpi": None}, {"nccl": "no GPU", "mpi": None}]
    assert _providers.choose(None, tables, ["nccl", "mpi"]) == ("mpi", "every rank can use it")
    assert _providers.choose("generic", tables, ["nccl", "mpi"])[0] == "generic"
    tables[1]["mpi"] = "not under mpiexec"
    name, why = _providers.choose(None, tables, ["nccl", "mpi"])
    assert name == "generic" and "mpi: rank 1: not under mpiexec" in why
    with pytest.raises(
        hal.CommError,
        match=r"HAL_COMM_PROVIDER=mpi cannot serve this communicator: rank 1: not under mpiexec",
    ) as ei:
        _providers.choose("mpi", tables, ["nccl", "mpi"])
    assert ei.value.ranks == (1,)
    ok = [{"nccl": None}, {"nccl": None}]
    same = [("h", "cuda:0"), ("h", "cuda:0")]
    name, why = _providers.choose(None, ok, ["nccl"], placements=same, exclusive=["nccl"])
    assert (
        name == "generic"
        and "nccl: rank 1: it shares cuda:0 on host h with rank 0 (one rank per device)" in why
    )
    assert (
        _providers.choose(
            None, ok, ["nccl"], placements=[("h", "cuda:0"), ("h", "cuda:1")], exclusive=["nccl"]
        )[0]
        == "nccl"
    )
    assert (
        _providers.choose(None, ok, ["nccl"], placements=same)[0] == "nccl"
    )  # not exclusive: shared is fine
    reg = _providers.ProviderRegistry()
    with pytest.raises(TypeError, match="not a subclass"):
        reg.add(object)

    class Generic(_providers.CollectiveProvider):
        name = "generic"

    with pytest.raises(ValueError, match="other than 'generic'"):
        reg.add(Generic)
    assert _providers.providers().names[:2] == ["nccl", "mpi"]
    assert _providers.providers().owners["mpi"] == "hal.comm.builtin"


@pytest.mark.gpu
def test_nccl_serves_cuda_devices_under_hal_run() -> None:
    """On a lent GPU: a rank per CUDA device (at most 2), NCCL serves float32 and float16 all_reduce."""
    try:
        devs = hal.devices("cuda")
    except hal.HalError as exc:
        pytest.skip(f"no CUDA device: {exc}")
    if not devs:
        pytest.skip("no CUDA device")
    why = _providers.NcclProvider.unavailable(
        device=devs[0], launcher="hal", size=2, transport=None
    )
    if why:
        pytest.skip(f"NCCL unavailable: {why}")
    # NCCL refuses two ranks on one GPU: as many ranks as GPUs, up to 2 (one GPU: a world of one)
    n = min(2, len(devs))
    script = SCRIPT.replace('("float16", "float16", "float32")', '("float16", "float32")')
    proc = _hal_run(n, ["-c", script], HAL_BACKENDS="cuda", HAL_COMM_PROVIDER="nccl")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    calls = _calls(proc.stdout)
    want = f"{n * (n + 1) / 2}"
    assert len(calls) == 2 * n and all(
        c[1] == c[3] == c[4] == "nccl" and c[6] == want for c in calls
    ), out


MISMATCH = """
import numpy as np, hal, hal.comm
c = hal.comm.init()
s = c.device.create_stream()
x = hal.asarray(np.ones(5 + c.rank, np.float32), device=c.device)
try:
    c.all_reduce(x, stream=s).wait()
except hal.CommError as exc:
    print(f"ERR {c.rank} {c.provider} {exc} END", flush=True)
c.abort()
"""


def test_mismatch_under_the_mpi_provider_is_named_not_a_hang() -> None:
    """Counts 5 and 6 under the mpi provider: each rank names the mismatch (signatures through MPI first)."""
    proc = _mpiexec(2, ["-c", MISMATCH])
    out = proc.stdout + proc.stderr
    errs = re.findall(r"ERR (\d) (\w+) (.*?) END", proc.stdout)
    assert sorted(e[0] for e in errs) == ["0", "1"], out
    for rank, provider, text in errs:
        assert provider == "mpi", out
        mine, theirs = (5, 6) if rank == "0" else (6, 5)
        assert (
            f"all_reduce mismatch: rank {rank} called all_reduce(op=sum, dtype=float32, count={mine}"
            in text
        ), out
        assert f"count {mine} vs {theirs}" in text, out


def test_plugin_providers_register_through_the_hook() -> None:
    """A plugin's provider joins the registry after hal's own, named with its plugin; one that raises is skipped."""
    import hal.plugins

    class Carrier(_providers.CollectiveProvider):
        name = "carrier"
        collectives = frozenset({"all_reduce"})

        @classmethod
        def unavailable(
            cls, *, device: hal.Device, launcher: str, size: int, transport: str | None
        ) -> str | None:
            return None if launcher == "hal" else "only under hal run"

    class Plugin:
        @hal.plugins.hookimpl
        def hal_register_collective_providers(self, registry: _providers.ProviderRegistry) -> None:
            registry.add(Carrier)

    class Broken:
        @hal.plugins.hookimpl
        def hal_register_collective_providers(self, registry: _providers.ProviderRegistry) -> None:
            raise RuntimeError("provider hook boom")

    system = hal.runtime().plugins
    good, bad = Plugin(), Broken()
    system.manager.register(good, name="carrier-plugin")
    system.manager.register(bad, name="broken-plugin")
    hal.runtime().clear_caches()  # the provider registry is rebuilt from the hooks
    try:
        reg = _providers.providers()
    finally:
        system.manager.unregister(good)
        system.manager.unregister(bad)
        hal.runtime().clear_caches()
    assert reg.names == ["nccl", "mpi", "carrier"]
    assert reg.owners["carrier"] == "carrier-plugin"
    dev = hal.devices("cpu")[0]
    assert reg.availability(device=dev, launcher="hal", size=2, transport=None)["carrier"] is None
    assert (
        reg.availability(device=dev, launcher="mpi", size=2, transport=None)["carrier"]
        == "only under hal run"
    )
    assert (
        _providers.choose(
            None,
            [reg.availability(device=dev, launcher="hal", size=2, transport=None)] * 2,
            reg.names,
        )[0]
        == "carrier"
    )


def test_bench_comm_times_the_mpi_provider_beside_mpi4py() -> None:
    """``hal bench comm --baseline mpi --provider mpi``: the mpi provider served (header, JSON), results right."""
    if not MPIEXEC.exists():
        pytest.skip("mpiexec (mpich wheel) not installed")
    env = _env()
    env["PATH"] = f"{MPIEXEC.parent}{os.pathsep}{env.get('PATH', '')}"
    args = [
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
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "bench", "comm", *args, "--provider", "mpi", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["provider"] == "mpi"
    assert all(r["oop_wrong"] == 0 and r["inplace_wrong"] == 0 for r in result["rows"]), result
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "bench", "comm", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "collective provider generic" in proc.stdout.splitlines()[0]
    )  # the default: hal's own algorithms
