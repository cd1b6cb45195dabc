"""docs/torch.md's DDP example, run exactly as the page shows it (real torchrun, 2 ranks)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "hal_torch_support", Path(__file__).with_name("support.py")
)
assert _spec is not None and _spec.loader is not None
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)

ROOT = Path(__file__).resolve().parents[2]


def test_ddp_example_as_documented() -> None:
    exe = support.need_torchrun()
    doc = (ROOT / "docs" / "torch.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", doc, re.S)
    cmd = next(line for b in blocks for line in b.splitlines() if "examples/ddp_torch.py" in line)
    argv = shlex.split(cmd)
    assert argv[0] == "torchrun"
    argv = [exe] + [str(ROOT / a) if a.startswith("examples/") else a for a in argv[1:]]
    proc = subprocess.run(
        argv,
        env=support.child_env(HAL_COMM_TIMEOUT_MS="60000"),
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, (
        f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    )
    m = re.search(
        r"^backend hal: 2 rank\(s\), 30 steps, loss ([\d.]+) -> ([\d.]+), ([\d.]+) ms/step$",
        proc.stdout,
        re.M,
    )
    assert m, proc.stdout
    assert float(m.group(2)) < float(m.group(1)) / 2, "DDP on 'hal' did not train"
