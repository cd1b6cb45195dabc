"""Collectives on the timeline: algorithm and bytes, well nested beside the stream slices."""

from __future__ import annotations

import numpy as np

import hal
import hal.comm
from hal.cli._trace import check, summarize


def test_all_reduce_appears_with_algorithm_and_bytes(requires_cpu: None) -> None:
    devices = hal.devices("cpu")[:2]
    comm = hal.comm.create(devices)
    streams = [d.create_stream() for d in devices]
    arrays = [
        hal.asarray(np.full(1024, i + 1, np.float32), device=d) for i, d in enumerate(devices)
    ]
    try:
        with hal.trace() as tr:
            comm.all_reduce(arrays, op="sum", streams=streams).wait()
    finally:
        comm.close()
    for a in arrays:
        np.testing.assert_array_equal(a.to_host(), 3.0)
    data = tr.to_json()
    assert check(data) == []
    coll = [e for e in data["traceEvents"] if e.get("cat") == "collective"]
    assert len(coll) == len(devices)
    for e in coll:
        assert e["name"] == "all_reduce" and e["args"]["bytes"] == 4096 and e["args"]["algorithm"]
    assert summarize(data)["categories_ms"]["collective"] > 0
