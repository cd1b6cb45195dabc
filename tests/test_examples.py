"""Every top-level ``examples/*.py`` runs to completion on the CPU emulator.

Each example is run as ``python examples/NAME.py`` in a subprocess, from a scratch
directory (so that the installed package is imported, not the checkout), with hal's
default environment. An example must exit 0 on its own; sub-folders of ``examples/``
are not collected here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))


def test_examples_exist() -> None:
    assert EXAMPLES / "quickstart.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_example_runs(script: Path, python_run: Callable[..., Any], tmp_path: Path) -> None:
    proc = python_run([str(script)], cwd=tmp_path)
    assert proc.stdout.strip(), f"{script.name} printed nothing"


def test_quickstart_reports_peer_path_and_result(
    python_run: Callable[..., Any], tmp_path: Path
) -> None:
    out = python_run([str(EXAMPLES / "quickstart.py")], cwd=tmp_path).stdout
    assert "travelled by 'peer'" in out
    assert "all correct" in out


def test_comm_torch_zero_copy_reduces_in_place(
    python_run: Callable[..., Any], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    out = python_run([str(EXAMPLES / "comm_torch_zero_copy.py")], cwd=tmp_path).stdout
    assert "result == float64 average rounded once to bfloat16: True" in out
    assert "torch.from_dlpack(arr) shares memory: True" in out


def _install_doc_backend(root: Path) -> Path:
    """Install the backend of docs/write-a-backend.md as a distribution under ``root``."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "write-a-backend.md").read_text()
    section = doc.split("## A minimal backend", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    site = root / "site"
    site.mkdir()
    (site / "hal_hostmem.py").write_text(code)
    info = site / "hal_hostmem-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hal-hostmem\nVersion: 0.1\nRequires-Dist: hal-sdk>=0.1,<2\n"
    )
    (info / "entry_points.txt").write_text("[hal.backends]\nhostmem = hal_hostmem\n")
    return site


DOC_BACKEND_CHECK = """
import json, numpy as np, hal
info = {b.name: b for b in hal.list_backends()}
assert info["hostmem"].status == "available", info["hostmem"]
dev = hal.device("hostmem:0")
cpu = hal.device("cpu:0")
data = np.arange(1000, dtype=np.int32)
with dev.create_stream() as s, dev.alloc(data.nbytes) as a, dev.alloc(data.nbytes) as b, \\
        cpu.alloc(data.nbytes) as c, cpu.create_stream() as cs:
    hal.copy(a, data, stream=s)
    hal.memset(b, 0, stream=s)
    hal.copy(b, a, stream=s, nbytes=400, dst_offset=400)
    out = np.empty_like(data)
    hal.copy(out, b, stream=s)
    s.synchronize()
    assert (out[:100] == 0).all() and (out[100:200] == data[:100]).all()
    path = hal.copy(c, a, stream=cs)
    back = np.empty_like(data)
    hal.copy(back, c, stream=cs)
    cs.synchronize()
    assert (back == data).all()
    try:
        dev.alloc(1 << 30)
    except hal.OutOfMemoryError:
        pass
    else:
        raise AssertionError("no OutOfMemoryError")
print(json.dumps({"path": path, "reason": dev.capabilities.reason_absent("p2p")}))
"""


def test_write_a_backend_sketch_works(python_json: Callable[..., Any], tmp_path: Path) -> None:
    site = _install_doc_backend(tmp_path)
    result = python_json(["-c", DOC_BACKEND_CHECK], pythonpath=[site], cwd=tmp_path)
    assert result == {"path": "staged", "reason": "a single device"}
    plugins = python_json(["-m", "hal", "plugins", "--json"], pythonpath=[site], cwd=tmp_path)[
        "plugins"
    ]
    hostmem = next(p for p in plugins if p["name"] == "hostmem")
    assert (hostmem["status"], hostmem["dist"], hostmem["dist_version"]) == (
        "loaded",
        "hal-hostmem",
        "0.1",
    )
