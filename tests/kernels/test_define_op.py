"""hal.kernels.spi.define_op: an op added from outside hal runs generic, host and dedicated, and is measured.

Defining an op changes the process-wide op table, so every check runs in its own process.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

SCRIPT = """
import json, numpy as np, hal, hal.kernels as hk, hal.kernels.spi as hks
from hal.kernels._accuracy import accuracy
from hal.kernels._ops import plan_route

hyp = hks.define_op("hypot2", summary="out = x*x + y*y", reference=lambda x, y: x * x + y * y,
                   expression="x * x + y * y", arity=2, tolerances={"float32": (2e-6, 1e-5)})
wrong = hks.define_op("badsq", summary="a generic kernel that disagrees with its reference",
                     reference=lambda x: x * x, expression="x * x + (CT)1")
out = {}
d = hal.device("cpu:0")
x = hal.asarray(np.arange(5, dtype=np.float32), device=d)
with d.create_stream() as s, hk.trace() as rec:
    out["values"] = hyp(x, x, stream=s).to_host(stream=s).tolist()
out["routes"] = [r.implementation for r in rec]
out["plan"] = plan_route("hypot2", d, "float32")[0]
rows = accuracy("cpu", ops=["hypot2", "badsq"])
out["accuracy"] = {f"{r.op}/{r.dtype}": [r.passed, r.tolerance_source] for r in rows}
hks.register("hypot2", "cpu", lambda call: hk.scale(call.inputs[0], 0.0, out=call.out, stream=call.stream),
            dtypes=["float32"], name="test:zero")
with d.create_stream() as s, hk.trace() as rec:
    out["dedicated"] = hyp(x, x, stream=s).to_host(stream=s).tolist()
out["dedicated_route"] = next(r.implementation for r in rec if r.op == "hypot2")
errors = []
for bad in ({"name": "add"}, {"name": "Bad"}, {"arity": 3}, {"dtypes": ["int32"]}, {"expression": ""},
            {"tolerances": {"float32": (-1, 0)}}):
    kw = {"name": "zz", "summary": "s", "reference": lambda v: v, "expression": "x", **bad}
    try:
        hks.define_op(**kw)
    except ValueError as exc:
        errors.append(str(exc))
out["errors"] = errors
print(json.dumps(out))
"""


def test_define_op_generic_host_dedicated_and_accuracy(python_json: Callable[..., object]) -> None:
    out = python_json(["-c", SCRIPT])
    assert isinstance(out, dict)
    assert out["values"] == [0.0, 2.0, 8.0, 18.0, 32.0]
    assert out["routes"] == ["generic"] and out["plan"] in ("generic", "host")
    acc = out["accuracy"]
    assert acc["hypot2/float32"] == [True, "set by hal.kernels.spi.define_op('hypot2')"]
    assert acc["hypot2/float64"][0] is True
    assert (
        acc["badsq/float32"][0] is False
    )  # the accuracy table catches a generic kernel that is wrong
    assert out["dedicated"] == [0.0] * 5 and out["dedicated_route"] == "dedicated"
    assert len(out["errors"]) == 6
    assert "already exists" in out["errors"][0] and "tolerances" in out["errors"][5]


def test_documented_example_runs(
    python_run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "kernels.md").read_text()
    code = (
        doc.split("### Outside hal: `hal.kernels.spi.define_op`", 1)[1]
        .split("```python\n", 1)[1]
        .split("```", 1)[0]
    )
    proc = python_run(["-c", code], check=False)
    assert proc.returncode == 0, proc.stderr
    assert "[ 0.  2.  8. 18.]" in proc.stdout
