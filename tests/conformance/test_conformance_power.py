"""The suite's power: backends that get data, ordering and time wrong fail everything that touches them.

``mut_do_nothing`` (copies, memsets, records, waits and host waits do nothing; events are
always done and no time passes) and ``mut_lying`` (the work runs late, but synchronize,
query and events say it is done at once; every interval took 1 ms) must fail every
requirement except the few in :data:`NO_DATA_ORDER_TIME`, which check declarations,
accounting and lifetimes only. A new requirement is expected to fail on both unless it is
added there, with the reason. (``COMM-*`` is left out: collectives over a backend that
moves no data time out one by one, which proves nothing more and costs minutes.)
"""

from __future__ import annotations

import pytest
from hal_mutants import CATCHES

from hal.conformance import Suite, catalogue

pytestmark = pytest.mark.usefixtures("mutants")

#: Requirements that touch no data, ordering or time, with why.
NO_DATA_ORDER_TIME = {
    "MEM-LIMITS": "declared sizes and accounting only",
    "MEM-CLOSE": "accounting and idempotent close only",
    "EVENT-CLOSE": "use-after-close errors only",
    "ERR-DISCOVERY": "device-string parsing only",
    "P2P-QUERY": "declarations of peer access only",
    "P2P-ENABLE": "enable_peer_access return values only",
    "DLPACK-CONSISTENT": "whether export is offered, not what it shows",
    "MEM-IPC-BAD-HANDLE": "import_handle's errors for bad handles only",
}


@pytest.mark.parametrize(
    "name", ["mut_do_nothing", pytest.param("mut_lying", marks=pytest.mark.slow)]
)
def test_broken_backend_fails_every_data_ordering_time_requirement(name: str) -> None:
    suite = Suite(name, timeout=15)
    passed, skipped = [], []
    for req in catalogue():
        if req.area == "COMM":
            continue
        entry, _ = suite.run_requirement(req)
        if entry["status"] == "skip":
            assert "declared absent" in entry["reason"], f"{req.id}: {entry['reason']}"
            skipped.append(req.id)
        elif entry["status"] == "pass" and req.id not in NO_DATA_ORDER_TIME:
            passed.append(req.id)
    CATCHES[name] = not passed
    assert not passed, f"{name} passes requirements that touch data, ordering or time: {passed}"
    assert all(s.startswith("KERN-") for s in skipped), (
        skipped
    )  # only what the fixture declares absent
