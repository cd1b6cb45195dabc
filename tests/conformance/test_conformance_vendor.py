"""The vendor template (examples/vendor_backend) certifies: in process, and from pip in isolation."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import hal
from hal.conformance import Suite, validate
from hal.conformance._isolated import current_hal_sdk_spec, tox_ini

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "vendor_backend"


@pytest.fixture
def example_backend(tmp_path: Path, hal_env: Callable[..., None], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
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
    assert cert["backend"]["dist"] == "hal-backend-example" and cert["backend"]["version"] == "1.0.0"
    assert all(hal.device(d["spec"]).backend == "example" for d in cert["devices"])


def test_generated_tox_ini_installs_hal_sdk_and_the_plugin(tmp_path: Path) -> None:
    spec = current_hal_sdk_spec()
    assert Path(spec).exists() or spec.startswith("hal-sdk==")
    ini = tox_ini(hal_sdk_spec=spec, spec=str(EXAMPLE), inner_args=["--backend", "example", "-k", "MEM and not OOM"])
    assert f"\n    {spec}\n    {EXAMPLE}\n" in ini
    assert "python -m hal conformance --backend example -k 'MEM and not OOM'" in ini
    assert "skip_install = true" in ini and "HAL_*" in ini


@pytest.mark.slow
def test_example_backend_certifies_from_pip_in_isolation(
    python_run: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """CI's proof that the plugin installs with its declared dependencies and certifies on its own."""
    report, summary = tmp_path / "cert.json", tmp_path / "cert.md"
    proc = python_run(
        ["-m", "hal", "conformance", "--isolated", str(EXAMPLE), "--backend", "example", "--report", str(report),
         "--summary", str(summary), "--require", "full", "-q"],
        cwd=tmp_path, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    cert = json.loads(report.read_text())
    validate(cert)
    assert cert["level"] == "full"
    assert cert["isolation"]["spec"] == str(EXAMPLE) and cert["isolation"]["tool"].startswith("tox ")
    assert cert["backend"]["dist"] == "hal-backend-example"
    assert "| isolated install |" in summary.read_text()
