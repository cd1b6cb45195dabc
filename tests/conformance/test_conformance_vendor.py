"""The vendor template (examples/vendor_backend) certifies: in process, and from pip in isolation."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import hal
from hal.conformance import Suite, validate
from hal.conformance._isolated import check_env_names, current_hal_sdk_spec, stage_source, tox_ini

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "vendor_backend"


@pytest.fixture
def example_backend(
    tmp_path: Path, hal_env: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The example plugin's entry point as pip would install it (dist-info beside its source)."""
    info = tmp_path / "hal_backend_example-1.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hal-backend-example\nVersion: 1.0.0\nRequires-Dist: hal-sdk>=1.1,<2\n"
    )
    (info / "entry_points.txt").write_text("[hal.backends]\nexample = hal_backend_example:plugin\n")
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    monkeypatch.syspath_prepend(str(tmp_path))
    hal_env()
    yield


def test_example_backend_certifies_full_in_process(example_backend: None) -> None:
    cert = Suite("example").run()
    validate(cert)
    assert cert["verdict"] == "certified" and cert["level"] == "full", cert["verdict_reason"]
    by_id = {r["id"]: r for r in cert["requirements"]}
    assert by_id["P2P-COPY"]["status"] == "skip"
    assert "example devices have no peer links" in by_id["P2P-COPY"]["reason"]
    assert by_id["P2P-CROSS-DEVICE"]["status"] == "pass"  # staged through the host by hal
    assert (
        cert["backend"]["dist"] == "hal-backend-example" and cert["backend"]["version"] == "1.0.0"
    )
    assert all(hal.device(d["spec"]).backend == "example" for d in cert["devices"])


def test_generated_tox_ini_installs_hal_sdk_and_the_plugin(tmp_path: Path) -> None:
    spec = current_hal_sdk_spec()
    assert Path(spec).exists() or spec.startswith("hal-sdk==")
    ini = tox_ini(
        hal_sdk_spec=spec,
        spec=str(EXAMPLE),
        inner_args=["--backend", "example", "-k", "MEM and not OOM"],
    )
    assert f"\n    {spec}\n    {EXAMPLE}\n" in ini
    assert "python -m hal conformance --backend example -k 'MEM and not OOM'" in ini
    assert "skip_install = true" in ini and "HAL_*" in ini


def test_example_backend_registers_its_bench_baseline_through_the_hook(
    example_backend: None,
) -> None:
    from hal.cli.bench._memory import load_baseline

    fn, where = load_baseline("example")
    assert fn is not None and "hal_backend_example" in where, where
    assert fn("h2d", 4096, 2) > 0
    builtin, where = load_baseline("cpu")  # the built-ins come through the same hook
    assert builtin is not None and where == "hal.backends.cpu._baseline"


SECTION = """
from hal.conformance.spi import add_area, requirement

add_area("VND", "A vendor's own requirements", "full")


@requirement("VND-HELLO", "A vendor section registered through hal_register_conformance runs.")
def _hello(t):
    t.attach("hello", str(t.device))
"""

SECTION_PLUGIN = """
from hal.plugins import hookimpl


@hookimpl
def hal_register_conformance(registry):
    registry.add("vnd_section")
"""


def test_vendor_conformance_section_through_the_hook(
    python_run: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    (tmp_path / "vnd_section.py").write_text(SECTION)
    (tmp_path / "vnd_plugin.py").write_text(SECTION_PLUGIN)
    info = tmp_path / "vnd_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vnd-plugin\nVersion: 1.0\nRequires-Dist: hal-sdk>=1.1,<2\n"
    )
    (info / "entry_points.txt").write_text("[hal.backends]\nvnd = vnd_plugin\n")
    listing = python_run(
        ["-m", "hal", "conformance", "--list"], pythonpath=[tmp_path], cwd=tmp_path, check=False
    )
    assert listing.returncode == 0, listing.stderr
    assert (
        "VND-HELLO" in listing.stdout
        and "COMM-ALLREDUCE" in listing.stdout
        and "KERN-CACHE" in listing.stdout
    )
    report = tmp_path / "c.json"
    run = python_run(
        [
            "-m",
            "hal",
            "conformance",
            "--backend",
            "cpu",
            "-k",
            "VND-HELLO",
            "--report",
            str(report),
        ],
        pythonpath=[tmp_path],
        cwd=tmp_path,
        check=False,
    )
    cert = json.loads(report.read_text())
    (entry,) = cert["requirements"]
    assert entry["id"] == "VND-HELLO" and entry["status"] == "pass", run.stdout + run.stderr


def test_isolated_env_allowlist_and_a_clean_vendor_tree(tmp_path: Path) -> None:
    ini = tox_ini(
        hal_sdk_spec="hal-sdk",
        spec="x",
        inner_args=[],
        pass_env=["MY_LICENSE_FILE", "VENDOR_*", "HAL_*"],
    )
    block = ini.split("pass_env =\n", 1)[1].split("change_dir", 1)[0]
    assert (
        "    MY_LICENSE_FILE\n" in block and "    VENDOR_*\n" in block and block.count("HAL_*") == 1
    )
    assert check_env_names(["A_B", "X_*"]) == ["A_B", "X_*"]
    for bad in ("", "1ABC", "A B", "A=B", "*"):
        with pytest.raises(ValueError, match="not an environment variable name"):
            check_env_names([bad])
    src = tmp_path / "plugin"
    (src / "src" / "pkg").mkdir(parents=True)
    (src / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (src / "src" / "pkg" / "__init__.py").write_text("")
    (src / "build").mkdir()
    (src / "src" / "p.egg-info").mkdir()
    work = tmp_path / "work"
    staged = Path(stage_source(str(src), work))
    assert staged.parent == work / "src" and (staged / "src" / "pkg" / "__init__.py").exists()
    assert not (staged / "build").exists() and not (staged / "src" / "p.egg-info").exists()
    assert (
        stage_source("hal-backend-example==1.0", work) == "hal-backend-example==1.0"
    )  # not a directory


def test_env_without_isolated_is_a_usage_error(
    python_run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    proc = python_run(["-m", "hal", "conformance", "--backend", "cpu", "--env", "X"], check=False)
    assert proc.returncode == 2 and "--env X only applies with --isolated" in proc.stderr


def test_guide_backend_certifies_full_from_the_page_alone(
    tmp_path: Path, hal_env: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/write-a-backend.md's code and pyproject pin, nothing else, certify at level full."""
    doc = (REPO / "docs" / "write-a-backend.md").read_text()
    code = doc.split("## A minimal backend", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    pin = doc.split('dependencies = ["', 1)[1].split('"', 1)[0]
    assert pin == "hal-sdk>=1.1,<2"
    (tmp_path / "hal_hostmem.py").write_text(code)
    info = tmp_path / "hal_hostmem-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: hal-hostmem\nVersion: 0.1\nRequires-Dist: {pin}\n"
    )
    (info / "entry_points.txt").write_text("[hal.backends]\nhostmem = hal_hostmem\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hal_env()
    cert = Suite("hostmem").run()
    validate(cert)
    assert cert["verdict"] == "certified" and cert["level"] == "full", cert["verdict_reason"]
    skipped = {r["id"] for r in cert["requirements"] if r["status"] == "skip"}
    assert "MEM-THREADS" not in skipped and "EVENT-TIMING-BOUNDS" not in skipped


@pytest.mark.slow
def test_example_backend_certifies_from_pip_in_isolation(
    python_run: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """CI's proof that the plugin installs with its declared dependencies and certifies on its own."""
    report, summary = tmp_path / "cert.json", tmp_path / "cert.md"
    before = sorted(p.relative_to(EXAMPLE).as_posix() for p in EXAMPLE.rglob("*"))
    proc = python_run(
        [
            "-m",
            "hal",
            "conformance",
            "--isolated",
            str(EXAMPLE),
            "--backend",
            "example",
            "--report",
            str(report),
            "--summary",
            str(summary),
            "--require",
            "full",
            "-q",
            "--env",
            "EXAMPLE_VENDOR_TOKEN",
        ],
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # nothing built in the vendor's tree (no build/, no *.egg-info)
    assert sorted(p.relative_to(EXAMPLE).as_posix() for p in EXAMPLE.rglob("*")) == before
    cert = json.loads(report.read_text())
    validate(cert)
    assert cert["level"] == "full"
    assert cert["isolation"]["spec"] == str(EXAMPLE) and cert["isolation"]["tool"].startswith(
        "tox "
    )
    assert "EXAMPLE_VENDOR_TOKEN" in cert["isolation"]["pass_env"]
    assert cert["backend"]["dist"] == "hal-backend-example"
    assert "| isolated install |" in summary.read_text()
