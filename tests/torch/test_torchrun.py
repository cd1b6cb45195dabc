"""The real ``torchrun --standalone``: hal.comm.init() rendezvous through torchrun's store,
the "hal" torch.distributed backend compared with gloo call by call, and DDP on "hal" vs gloo.

One torchrun job per world size (2 and 3 ranks) runs job.py; the tests read what each rank
wrote and recompute every expected value with NumPy from the same seeded inputs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

_spec = importlib.util.spec_from_file_location(
    "hal_torch_support", Path(__file__).with_name("support.py")
)
assert _spec is not None and _spec.loader is not None
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def job(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """Run ``torchrun --standalone --nproc_per_node=N job.py`` once per world size; every rank's results."""
    support.need_torchrun()
    n = int(request.param)
    out = tmp_path_factory.mktemp(f"torchrun{n}")
    proc = support.torchrun(["--standalone", f"--nproc_per_node={n}", support.JOB, str(out)])
    assert proc.returncode == 0, (
        f"torchrun exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    )
    return list(support.load_results(out, n))


def test_hal_comm_init_under_torchrun(job: list[dict[str, Any]]) -> None:
    """hal.comm.init() unchanged: no MASTER_PORT clash; the ranks met on torchrun's own store."""
    support.check_init(job, "shm")


def test_torch_calls_on_hal_match_gloo(job: list[dict[str, Any]]) -> None:
    """Every torch.distributed call on backend "hal" gives what gloo gives (and what NumPy computes)."""
    support.check_calls(job, "shm")


def test_ddp_on_hal_matches_gloo(job: list[dict[str, Any]]) -> None:
    """A small MLP trained 50 steps with DDP: the parameters on "hal" equal those on gloo (1e-6 relative)."""
    support.check_ddp(job)
