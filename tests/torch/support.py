"""Helpers of the torchrun tests (tests/torch, tests/launchers, tests/multihost): running the real
``torchrun`` (from the torch CPU wheel of the ``test`` extra) and checking what job.py wrote.

Test modules load this file by path (``load_support()``); every test that needs torch skips,
with the reason, only when torch is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
JOB = str(HERE / "job.py")

_spec = importlib.util.spec_from_file_location("hal_torch_job", JOB)
assert _spec is not None and _spec.loader is not None
job_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(job_module)
inputs, N, BIG = job_module.inputs, job_module.N, job_module.BIG


def torchrun_binary() -> str | None:
    """The ``torchrun`` next to this Python (the venv's), else the one on PATH; None without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    here = Path(sys.executable).parent / "torchrun"
    return str(here) if here.exists() else shutil.which("torchrun")


def need_torchrun() -> str:
    """Return the torchrun binary or skip the test (torch absent)."""
    exe = torchrun_binary()
    if exe is None:
        pytest.skip(
            "torch is not installed (pip install 'hal-sdk[torch]'; the test extra pins torch==2.13.0)"
        )
    return exe


def child_env(**extra: str) -> dict[str, str]:
    """A clean environment for ranks: no HAL_* (CPU emulator, one device), one OpenMP thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAL_", "TORCHELASTIC_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    # a stuck collective fails within a minute naming the ranks, well inside pytest's timeout
    env.update(
        {
            "HAL_BACKENDS": "cpu",
            "HAL_CPU_DEVICES": "1",
            "PYTHONUNBUFFERED": "1",
            "HAL_COMM_TIMEOUT_MS": "60000",
        }
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def torchrun(
    args: list[str], *, timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``torchrun ARGS`` (from a scratch directory) and return the finished process."""
    return subprocess.run(
        [need_torchrun(), *args],
        env=env or child_env(),
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def load_results(out: Path, n: int) -> list[dict[str, Any]]:
    """Every rank's ``rank<R>.json``."""
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(n)]


def close(got: Any, want: Any, what: str) -> None:
    """``got`` equals ``want`` to 1e-6 (relative, and absolute near zero)."""
    np.testing.assert_allclose(
        np.asarray(got, dtype=np.float64),
        np.asarray(want, dtype=np.float64),
        rtol=1e-6,
        atol=1e-6,
        err_msg=what,
    )


def check_init(job: list[dict[str, Any]], transport: str) -> None:
    """hal.comm.init() under torchrun: the ranks met on torchrun's store and computed right."""
    n = len(job)
    secrets = set()
    for r, res in enumerate(job):
        init = res["init"]
        assert res["env"]["TORCHELASTIC_RUN_ID"], "not started by torchrun"
        assert (init["rank"], init["size"], init["launcher"], init["store"]) == (
            r,
            n,
            "torchrun",
            "torch",
        )
        assert init["bootstrap"] == "TorchStoreBootstrap"
        assert init["transport"] == transport
        secrets.add(init["secret"])
        close(init["all_reduce"], sum(inputs(i) for i in range(n)), f"rank {r} all_reduce")
        assert init["all_gather"] == [10 * i for i in range(n)]
        assert init["broadcast"] == [float(n - 1)] * 4
        # shrink(exclude=[last]) met again on torchrun's store (which outlives any rank)
        if r == n - 1:
            assert init["shrink"] is None
        else:
            want = float(sum(range(1, n)))
            assert init["shrink"] == {
                "rank": r,
                "size": n - 1,
                "sum": [want] * 3,
                "bootstrap": "TorchStoreBootstrap",
            }
    assert len(secrets) == 1 and None not in secrets, (
        f"ranks disagree on the shared secret: {secrets}"
    )


def expected(call: str, r: int, n: int) -> Any:
    """What rank ``r`` of ``n`` must hold after ``call`` (NumPy, from the seeded inputs)."""
    xs = [inputs(i) for i in range(n)]
    c = N // n
    total = np.sum(xs, axis=0, dtype=np.float64)
    if call == "all_reduce":
        return total
    if call == "all_reduce_max":
        return np.max(xs, axis=0)
    if call == "all_reduce_f64":
        return np.sum([inputs(i, dtype=np.float64) for i in range(n)], axis=0)
    if call == "all_reduce_i64":
        return np.sum([np.arange(N) * (i + 1) for i in range(n)], axis=0)
    if call == "subgroup_all_reduce":  # new_group([0, 1], backend="hal"); rank 2 is not in it
        return xs[0] + xs[1] if r < 2 else xs[r]
    if call == "all_reduce_avg":
        return total / n
    if call == "all_gather":
        return xs
    if call == "all_gather_into_tensor":
        return np.concatenate(xs)
    if call in ("reduce_scatter", "reduce_scatter_tensor"):
        return total[r * c : (r + 1) * c]
    if call == "broadcast":
        return xs[n - 1]
    if call == "reduce":
        return total if r == 0 else xs[r]
    if call == "all_to_all_single":
        return np.concatenate([x[r * c : (r + 1) * c] for x in xs])
    if call == "all_to_all":
        return [x[r * c : (r + 1) * c] for x in xs]
    if call == "all_to_all_uneven":  # rank i sends i + j + 1 elements to rank j
        parts = []
        for i in range(n):
            src = inputs(i, sum(i + j + 1 for j in range(n)))
            start = sum(i + j + 1 for j in range(r))
            parts.append(src[start : start + i + r + 1])
        return np.concatenate(parts)
    if call == "gather":
        return xs if r == 0 else None
    if call == "scatter":
        return inputs(100)[r * c : (r + 1) * c]
    if call == "barrier":
        return True
    if call in ("send_recv", "batch_isend_irecv"):
        return xs[(r - 1) % n]
    if call == "isend_irecv":
        big = inputs((r - 1) % n, BIG)
        return [*big[:N].tolist(), float(np.sum(big, dtype=np.float64))]
    raise AssertionError(call)


CALLS = [
    "all_reduce",
    "all_reduce_max",
    "all_reduce_f64",
    "all_reduce_i64",
    "all_reduce_avg",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all_single",
    "all_to_all_uneven",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
    "send_recv",
    "isend_irecv",
    "batch_isend_irecv",
    "subgroup_all_reduce",
]


def check_calls(job: list[dict[str, Any]], transport: str) -> None:
    """Every torch.distributed call on "hal" gives what gloo gives and what NumPy computes;
    bad calls raise TypeError/ValueError naming the bad value, and the group keeps working."""
    n = len(job)
    for r, res in enumerate(job):
        errs = res["calls"].pop("errors")
        assert errs["bool"][0] == "TypeError" and "torch.bool" in errs["bool"][1], errs["bool"]
        assert (
            errs["strided"][0] in ("ValueError", "RuntimeError")
            and "contiguous" in errs["strided"][1]
        ), errs["strided"]
        assert errs["bxor"][0] == "ValueError" and "reduce op BXOR" in errs["bxor"][1], errs["bxor"]
        assert (
            errs["gather_list"][0] == "ValueError"
            and f"list of {n} output tensors" in errs["gather_list"][1]
        ), errs
        calls = res["calls"]
        assert sorted(calls) == sorted(CALLS)
        for call in CALLS:
            want = expected(call, r, n)
            got = calls[call]
            for backend in ("hal", "gloo"):
                if backend not in got:
                    continue  # gloo has no AVG
                if call == "reduce" and backend == "gloo" and r != 0:
                    continue  # gloo leaves scratch in non-root buffers; hal leaves them unchanged
                if want is None or isinstance(want, bool):
                    assert got[backend] == want, (call, backend, r)
                else:
                    close(got[backend], want, f"{call} on {backend}, rank {r} of {n}")
            if (
                "gloo" in got
                and not (call == "reduce" and r != 0)
                and want is not None
                and not isinstance(want, bool)
            ):
                close(got["hal"], got["gloo"], f"{call}: hal vs gloo, rank {r} of {n}")
        assert res["communicator"]["transport"] == transport
        # torch registered the default group under its name; the backend reports itself as "hal"
        assert res["communicator"]["group_name"] == job[0]["communicator"]["group_name"] != ""
        assert res["communicator"]["name"] == "hal"


def check_ddp(job: list[dict[str, Any]]) -> None:
    """DDP 50 steps on "hal" ends with the parameters of the same run on gloo (1e-6 relative).

    float64: element by element, rtol 1e-6. float32: hal's ring and gloo sum three ranks'
    gradients in different orders (float addition is not associative), so a parameter near
    zero may differ by a few ulps of the largest; the check is rtol 1e-6 plus 1e-6 of the
    largest parameter, and the norm of the difference is below 1e-6 of the parameters' norm.
    """
    n = len(job)
    first = job[0]["ddp"]
    for r, res in enumerate(job):
        ddp = res["ddp"]
        for name in ("hal", "gloo", "hal_f64", "gloo_f64"):
            assert ddp[name]["params"] == first[name]["params"], (
                f"rank {r}: {name} parameters differ from rank 0's"
            )
    hal64, gloo64 = np.array(first["hal_f64"]["params"]), np.array(first["gloo_f64"]["params"])
    np.testing.assert_allclose(hal64, gloo64, rtol=1e-6, atol=0, err_msg=f"float64 DDP, {n} ranks")
    hal32, gloo32 = np.array(first["hal"]["params"]), np.array(first["gloo"]["params"])
    scale = float(np.abs(gloo32).max())
    np.testing.assert_allclose(
        hal32, gloo32, rtol=1e-6, atol=1e-6 * scale, err_msg=f"float32 DDP, {n} ranks"
    )
    assert np.linalg.norm(hal32 - gloo32) <= 1e-6 * np.linalg.norm(gloo32)
    moved = np.abs(hal32 - np.array(first["initial"])).max()
    assert moved > 1e-3, f"the parameters barely moved in 50 steps ({moved})"


def load_support() -> Any:
    """This module (for test files that load it by path)."""
    return sys.modules[__name__]
