"""MEM-IPC-*: memory shared between processes (``Buffer.export_handle`` / ``Device.import_handle``).

Each check starts a real second Python process (the same interpreter, ``sys.path`` and
environment, so a plugin backend loads there too) that imports the handle on the same
device and answers commands on its stdin: read (a SHA-256 of the bytes), write a seeded
pattern, import again, close. Skipped on devices that declare ``ipc`` absent, with their reason.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from typing import Any

import numpy as np

import hal
from hal.conformance._checks import download, raises
from hal.conformance._registry import requirement
from hal.conformance._target import Target

#: The importing process: ``python -c CHILD BACKEND INDEX HANDLE_HEX``, then one command per line.
CHILD = r"""
import hashlib, sys
import numpy as np
import hal

backend, index, handle = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
dev = next(d for d in hal.devices(backend) if d.index == index)
s = dev.create_stream()
buf = dev.import_handle(handle)
print("READY", buf.nbytes, buf.device, flush=True)
for line in sys.stdin:
    cmd, *arg = line.split()
    try:
        if cmd == "READ":
            out = np.empty(buf.nbytes, np.uint8)
            hal.copy(out, buf, stream=s)
            s.synchronize()
            print("READ", hashlib.sha256(out.tobytes()).hexdigest(), flush=True)
        elif cmd == "WRITE":
            data = np.random.default_rng(int(arg[0])).integers(0, 256, buf.nbytes, dtype=np.uint8)
            hal.copy(buf, data, stream=s)
            s.synchronize()
            print("WROTE", flush=True)
        elif cmd == "IMPORT":
            try:
                dev.import_handle(handle).close()
                print("IMPORTED", flush=True)
            except hal.HalError as exc:
                print("HALERROR", type(exc).__name__, str(exc).replace("\n", " "), flush=True)
        elif cmd == "CLOSE":
            buf.close()
            print("CLOSED", flush=True)
        else:
            break
    except Exception as exc:
        print("EXC", type(exc).__name__, str(exc).replace("\n", " "), flush=True)
"""

_TIMEOUT_S = 120.0


class _Importer:
    """The second process, holding an import of ``handle``."""

    def __init__(self, t: Target, dev: hal.Device, handle: bytes) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.t = t
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, dev.backend, str(dev.index), handle.hex()],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        t._stack.callback(self.stop)
        self.line("READY")

    def line(self, want: str) -> list[str]:
        assert self.proc.stdout is not None
        got = self.proc.stdout.readline().split()
        if not got or got[0] != want:
            err = ""
            if self.proc.poll() is not None and self.proc.stderr is not None:
                err = self.proc.stderr.read()[-2000:]
            raise self.t.fail(
                f"the importing process answered {' '.join(got)!r}, not {want} {err}".strip()
            )
        return got

    def ask(self, cmd: str, want: str) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.line(want)

    def stop(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def _seeded(seed: int, n: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _sha(data: np.ndarray[Any, Any]) -> str:
    return hashlib.sha256(data.tobytes()).hexdigest()


def _write(buf: hal.Buffer, data: np.ndarray[Any, Any], s: hal.Stream) -> None:
    hal.copy(buf, data, stream=s)
    s.synchronize()


@requirement(
    "MEM-IPC-SHARE",
    "A buffer exported with export_handle and imported in a second process with import_handle is the "
    "same memory both ways: the importer reads what the exporter wrote after the export, and the exporter "
    "reads what the importer wrote.",
    needs="ipc",
)
def _share(t: Target) -> None:
    dev, s = t.device, t.stream()
    n = 65_537 + int(t.rng.integers(0, 4096))
    buf = t.alloc(n)
    _write(buf, _seeded(1, n), s)
    handle = buf.export_handle()
    t.expect(
        isinstance(handle, bytes) and handle,
        f"export_handle() returned {handle!r}, not non-empty bytes",
    )
    _write(buf, _seeded(2, n), s)  # written after the export: the importer must see these bytes
    child = _Importer(t, dev, handle)
    got = child.ask("READ", "READ")[1]
    t.expect(
        got == _sha(_seeded(2, n)), "the importing process does not read what the exporter wrote"
    )
    child.ask("WRITE 3", "WROTE")
    t.expect(
        _sha(download(buf, s)) == _sha(_seeded(3, n)),
        "the exporter does not read what the importing process wrote into the imported buffer",
    )
    _write(buf, _seeded(4, n), s)
    t.expect(
        child.ask("READ", "READ")[1] == _sha(_seeded(4, n)),
        "a second write is not seen by the importer",
    )
    t.attach("bytes", n)


@requirement(
    "MEM-IPC-CLOSE",
    "When the exporter closes its buffer while a second process holds an import, that import stays "
    "readable and writable with the last bytes, and importing the handle again fails with hal.HalError.",
    needs="ipc",
)
def _close(t: Target) -> None:
    dev, s = t.device, t.stream()
    n = 4099
    buf = dev.alloc(n)
    try:
        _write(buf, _seeded(5, n), s)
        handle = buf.export_handle()
        child = _Importer(t, dev, handle)
    finally:
        buf.close()  # the exporter lets go while the importer holds it
    t.expect(
        child.ask("READ", "READ")[1] == _sha(_seeded(5, n)),
        "the import lost its bytes when the exporter closed",
    )
    child.ask("WRITE 6", "WROTE")
    t.expect(
        child.ask("READ", "READ")[1] == _sha(_seeded(6, n)),
        "the import is not writable after the close",
    )
    got = child.ask("IMPORT", "HALERROR")
    t.attach("import_after_close", " ".join(got[1:])[:200])
    child.ask("CLOSE", "CLOSED")
    raises(hal.InvalidBufferError, "export_handle() of a closed buffer", buf.export_handle)


@requirement(
    "MEM-IPC-BAD-HANDLE",
    "import_handle rejects what export_handle did not make with a clear error and no side effect: TypeError "
    "for non-bytes, ValueError for foreign or malformed bytes, hal.DeviceMismatchError for another device's "
    "handle, hal.HalError (or ValueError) for a payload naming no live memory.",
    needs="ipc",
)
def _bad(t: Target) -> None:
    dev = t.device
    raises(TypeError, "import_handle('text')", dev.import_handle, "HALIPC1:{}")
    raises(ValueError, "import_handle(b'garbage')", dev.import_handle, b"garbage")
    raises(ValueError, "import_handle of malformed JSON", dev.import_handle, b"HALIPC1:{not json")
    raises(
        ValueError,
        "import_handle without the payload",
        dev.import_handle,
        b'HALIPC1:{"backend":"x"}',
    )
    other = (
        f'HALIPC1:{{"backend":"{dev.backend}","index":{dev.index + 1000},"nbytes":8,"payload":"1"}}'
    )
    raises(
        hal.DeviceMismatchError,
        "import_handle of another device's handle",
        dev.import_handle,
        other.encode(),
    )
    buf = t.alloc(64)
    good = buf.export_handle()
    head = good.split(b'"payload":', 1)[0]
    for payload in (b'"0:0:0:0"', b'"not a payload"'):
        try:
            imp = dev.import_handle(head + b'"payload":' + payload + b"}")
        except (hal.HalError, ValueError):
            continue
        imp.close()
        raise t.fail(f"import_handle of a payload naming no live memory ({payload!r}) succeeded")
