"""A second process of the IPC test: import a buffer by its handle, read it, write into it.

Usage: ``python ipc_child.py HANDLE_HEX SLOT``. Prints ``SEEN first last``, writes ``1000 + SLOT``
into uint32 slot ``SLOT``, prints ``WROTE``, waits for a line on stdin (the exporter closed its
buffer), reads again (``AFTER first``), tries to import the handle again (``REIMPORT`` and the
error) and exits.
"""

from __future__ import annotations

import sys

import numpy as np

import hal


def main() -> int:
    """Run the importer's side."""
    handle, slot = bytes.fromhex(sys.argv[1]), int(sys.argv[2])
    dev = hal.device("cpu:0")
    buf = dev.import_handle(handle)
    print("IN_USE", dev.memory_in_use, flush=True)
    s = dev.create_stream()
    view = buf.view(np.uint32)
    seen = view.to_host(stream=s)
    print("SEEN", int(seen[0]), int(seen[-1]), flush=True)
    hal.copy(buf, np.array([1000 + slot], np.uint32), stream=s, dst_offset=4 * slot)
    s.synchronize()
    print("WROTE", flush=True)
    sys.stdin.readline()
    print("AFTER", int(view.to_host(stream=s)[0]), flush=True)
    try:
        dev.import_handle(handle)
        print("REIMPORT ok", flush=True)
    except hal.HalError as exc:
        print("REIMPORT", type(exc).__name__, exc, flush=True)
    buf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
