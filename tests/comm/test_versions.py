"""Version agreement at hal.comm.init() and ``hal doctor``, with real processes under ``hal run``.

One rank is made to run a different version the real way: a fixture plugin distribution
(``hal_fxver-VERSION.dist-info`` beside its module, what pip leaves in site-packages)
installed for that rank only. A ``sitecustomize.py`` on every rank's PYTHONPATH puts the
rank's own "site-packages" (``FXVER_SITE_<rank>``) on ``sys.path``, as two hosts with
different installs would have. The plugin registers a transport, ``fxtcp`` (hal's TCP
transport under another name), so a test can make the plugin *used* (``HAL_COMM_TRANSPORT=fxtcp``)
or not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hal.comm import _versions

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "versions_worker.py")

PLUGIN = """
from hal.plugins import hookimpl
from hal.comm._tcp import TcpTransport


class FxTcp(TcpTransport):
    name = "fxtcp"


@hookimpl
def hal_register_transports(registry):
    registry.add(FxTcp)
"""

SITECUSTOMIZE = """
import os, sys
_d = os.environ.get("FXVER_SITE_" + os.environ.get("HAL_RANK", "x"))
if _d:
    sys.path.insert(0, _d)
"""


def _site(root: Path, version: str) -> Path:
    site = root / f"site-{version}"
    info = site / f"hal_fxver-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: hal-fxver\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[hal.backends]\nfxver = hal_fxver\n")
    (site / "hal_fxver.py").write_text(textwrap.dedent(PLUGIN))
    return site


def run(
    tmp: Path,
    versions: list[str | None],
    args: list[str],
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``hal run -n len(versions) ARGS``; rank r gets hal-fxver ``versions[r]`` (None: not installed)."""
    boot = tmp / "boot"
    boot.mkdir(exist_ok=True)
    (boot / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.update(
        {
            "HAL_BACKENDS": "cpu,fxver",
            "HAL_CPU_DEVICES": "1",
            "PYTHONPATH": str(boot),
            "HAL_COMM_TIMEOUT_MS": "30000",
        }
    )
    for r, v in enumerate(versions):
        if v is not None:
            site = tmp / f"site-{v}"
            child[f"FXVER_SITE_{r}"] = str(site if site.exists() else _site(tmp, v))
    child.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", str(len(versions)), *args],
        env=child,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_used_plugin_major_minor_mismatch_is_an_error_naming_ranks_and_versions(
    tmp_path: Path,
) -> None:
    """The plugin provides the transport in use; 1.0.0 against 2.0.0 stops init on every rank."""
    proc = run(tmp_path, ["1.0.0", "2.0.0"], [WORKER], {"HAL_COMM_TRANSPORT": "fxtcp"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "OK " not in proc.stdout, out
    assert "CommError" in out, out
    assert "plugin fxver: rank 0 has hal-fxver 1.0.0; rank 1 has hal-fxver 2.0.0" in out, out
    assert "major.minor differ" in out, out


def test_unused_plugin_mismatch_is_a_warning(tmp_path: Path) -> None:
    """Same two installs, but the ranks use shared memory: a HalWarning, and the collective runs."""
    proc = run(tmp_path, ["1.0.0", "2.0.0"], [WORKER])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert sorted(
        line.split()[:4] for line in proc.stdout.splitlines() if line.startswith("OK")
    ) == [["OK", "0", "shm", "3"], ["OK", "1", "shm", "3"]], out
    assert (
        "HalWarning" in proc.stderr
        and "plugin fxver: rank 0 has hal-fxver 1.0.0; rank 1 has hal-fxver 2.0.0" in out
    )
    assert "no rank's device or transport uses it" in out
    assert proc.stderr.count("ranks run different versions") == 1, out  # once, by rank 0


def test_used_plugin_patch_mismatch_is_a_warning_and_runs(tmp_path: Path) -> None:
    """1.0.0 against 1.0.1 of the plugin whose transport carries the data: a warning, results right."""
    proc = run(tmp_path, ["1.0.0", "1.0.1"], [WORKER], {"HAL_COMM_TRANSPORT": "fxtcp"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert sorted(
        line.split()[:4] for line in proc.stdout.splitlines() if line.startswith("OK")
    ) == [["OK", "0", "fxtcp", "3"], ["OK", "1", "fxtcp", "3"]], out
    assert "only the patch version differs" in out and "hal-fxver 1.0.1" in out, out


def test_plugin_on_one_rank_only_is_a_warning(tmp_path: Path) -> None:
    """A plugin installed on one host only, not used: named as missing on the other."""
    proc = run(tmp_path, ["1.0.0", None], [WORKER])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "plugin fxver: rank 0 has hal-fxver 1.0.0; rank 1 has none" in out, out


def test_doctor_under_hal_run_prints_every_rank_and_fails_on_a_mismatch(tmp_path: Path) -> None:
    """``hal run -n 2 -m hal doctor --json``: rank 0 reports both tables, the error, exit code 1."""
    proc = run(
        tmp_path,
        ["1.0.0", "2.0.0"],
        ["-m", "hal", "doctor", "--json"],
        {"HAL_COMM_TRANSPORT": "fxtcp"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["launcher"] == "hal"
    assert [t["rank"] for t in report["ranks"]] == [0, 1]
    assert report["ranks"][0]["versions"]["plugin fxver"] == "hal-fxver 1.0.0"
    assert report["ranks"][1]["versions"]["plugin fxver"] == "hal-fxver 2.0.0"
    assert "plugin fxver" in report["ranks"][1]["used"]
    assert report["ranks_at_fault"] == [1]
    assert any(
        "rank 0 has hal-fxver 1.0.0; rank 1 has hal-fxver 2.0.0" in e for e in report["errors"]
    )


def test_doctor_agreeing_ranks_and_one_host(tmp_path: Path) -> None:
    """Agreeing ranks: exit 0, "all ranks agree"; plain ``hal doctor``: this host's table."""
    proc = run(tmp_path, [None, None], ["-m", "hal", "doctor"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 ranks on 1 host(s)" in proc.stdout and "all ranks agree" in proc.stdout, proc.stdout
    import numpy as np

    import hal

    one = subprocess.run(
        [sys.executable, "-m", "hal", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("HAL_RANK", "HAL_WORLD"))},
    )
    report = json.loads(one.stdout)
    assert report["launcher"] == "none" and len(report["ranks"]) == 1
    assert report["ranks"][0]["versions"]["hal-sdk"] == hal.__version__
    assert report["ranks"][0]["versions"]["numpy"] == np.__version__


def test_doctor_under_mpiexec_names_the_mpi_library(tmp_path: Path) -> None:
    """Under mpiexec the MPI library's version is in every rank's table (it must agree)."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("mpiexec (mpich wheel) not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1"})
    proc = subprocess.run(
        [str(mpiexec), "-n", "2", sys.executable, "-m", "hal", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    from mpi4py import MPI

    lib = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    assert [t["versions"]["MPI library"] for t in report["ranks"]] == [lib, lib]
    assert "MPI library" in report["ranks"][0]["used"]


def _t(**v: str) -> dict[str, object]:
    return {"versions": v, "used": ["hal-sdk", "hal API", "numpy", "MPI library"]}


@pytest.mark.parametrize(
    ("a", "b", "level", "needle"),
    [
        (
            {"hal-sdk": "1.1.0"},
            {"hal-sdk": "1.2.0"},
            "error",
            "hal-sdk: rank 0 has 1.1.0; rank 1 has 1.2.0 (major.minor differ)",
        ),
        ({"hal-sdk": "1.1.0"}, {"hal-sdk": "1.1.3"}, "warning", "only the patch version differs"),
        (
            {"hal API": "1.1"},
            {"hal API": "1.0"},
            "error",
            "hal API: rank 0 has 1.1; rank 1 has 1.0",
        ),
        (
            {"numpy": "2.4.6"},
            {"numpy": "1.26.4"},
            "error",
            "numpy: rank 0 has 2.4.6; rank 1 has 1.26.4 (major versions differ)",
        ),
        ({"numpy": "2.4.6"}, {"numpy": "2.3.0"}, "warning", "numpy"),
        (
            {"MPI library": "MPICH Version: 5.0.2"},
            {"MPI library": "Open MPI v5.0.3"},
            "error",
            "MPI library",
        ),
        ({"torch": "2.13.0"}, {"torch": "2.12.0"}, "warning", "torch"),
    ],
)
def test_check_levels(a: dict[str, str], b: dict[str, str], level: str, needle: str) -> None:
    """What matters is an error naming both versions; what does not, a warning."""
    errors, warns, bad = _versions.check([_t(**a), _t(**b)])
    got = errors if level == "error" else warns
    assert len(got) == 1 and needle in got[0], (errors, warns)
    assert (errors if level == "warning" else warns) == []
    assert bad == ({1} if level == "error" else set())


def test_check_groups_ranks() -> None:
    """Eight ranks, one odd: "ranks 0-2, 4-7 have 1.1.0; rank 3 has 1.2.0", rank 3 at fault."""
    tables = [_t(**{"hal-sdk": "1.2.0" if r == 3 else "1.1.0"}) for r in range(8)]
    errors, _, bad = _versions.check(tables)
    assert errors == ["hal-sdk: ranks 0-2, 4-7 have 1.1.0; rank 3 has 1.2.0 (major.minor differ)"]
    assert bad == {3}
