"""Quickstart: host -> device 0 -> device 1 (peer) -> host, with two streams and an event.

Runs on the CPU emulator, which always has two devices:

    python examples/quickstart.py

The same code runs on any backend with two devices, e.g. OpenCL on PoCL:

    POCL_DEVICES="pthread pthread" HAL_EXAMPLE_BACKEND=opencl python examples/quickstart.py
"""

from __future__ import annotations

import os

import numpy as np

import hal


def main() -> None:
    """Move 16 MiB around two devices, time it with events, and check the result."""
    backend = os.environ.get("HAL_EXAMPLE_BACKEND", "cpu")
    devices = hal.devices(backend)
    if len(devices) < 2:
        raise SystemExit(f"this example needs two {backend} devices; found {len(devices)}")
    d0, d1 = devices[:2]
    print(f"hal-sdk {hal.__version__}: {d0!r} and {d1!r}")

    host = np.arange(4 << 20, dtype=np.float32)  # 16 MiB of data on the host
    result = np.zeros_like(host)
    if d0.can_access_peer(d1):
        d0.enable_peer_access(d1)

    # Every resource is closed explicitly by its `with` block (a finalizer is only a safety net).
    with (
        d0.create_stream() as s0,
        d1.create_stream() as s1,
        d0.alloc(host.nbytes) as buf0,
        d1.alloc(host.nbytes) as buf1,
        d0.create_event(timing=True) as start,
        d0.create_event(timing=True) as copied,
    ):
        start.record(s0)
        hal.copy(buf0, host, stream=s0)  # host -> device 0 (asynchronous: `host` must stay alive)
        path = hal.copy(buf1, buf0, stream=s0)  # device 0 -> device 1
        copied.record(s0)

        s1.wait(copied)  # work on s1 starts only after both copies on s0 are done
        hal.copy(result, buf1, stream=s1)  # device 1 -> host
        s1.synchronize()

        ms = copied.elapsed_ms(start)
        print(
            f"device 0 -> device 1 travelled by {hal.copy_path(buf1, buf0)!r} (hal.copy returned {path!r})"
        )
        print(
            f"host -> {d0} -> {d1}: {2 * host.nbytes / ms / 1e6:.2f} GB/s over {ms:.2f} ms (timing events)"
        )

    assert np.array_equal(result, host), "the data came back changed"
    print(
        f"result: {result[:4]} ... {result[-2:]} — {result.nbytes} bytes back on the host, all correct"
    )


if __name__ == "__main__":
    main()
