"""A stranger on another "host" (``ip netns exec NS python stranger.py MODE ...``), without the job's secret.

Modes:

- ``flood ADDR PORT N SECONDS``: keep N connections to ADDR:PORT open and silent for SECONDS,
  reopening those the server drops (prints ``FLOODING`` once the first N are open, then
  ``REOPENED k`` at the end);
- ``claim ADDR PORT RANK SIZE``: speak the rendezvous hello claiming RANK of SIZE with a guessed
  proof; prints ``ANSWER <json>`` (what the server said) or ``HUNG UP``.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time

from hal.comm._auth import Keys, new_nonce
from hal.comm._bootstrap import _PROTO


def say(line: str) -> None:
    """Print ``line`` at once."""
    print(line, flush=True)


def _connect(addr: str, port: int, until: float) -> socket.socket:
    while True:
        try:
            return socket.create_connection((addr, port), timeout=2)
        except OSError:
            if time.monotonic() > until:
                raise
            time.sleep(0.05)


def _framed(obj: object) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack("<I", len(data)) + data


def _read(s: socket.socket) -> object:
    head = s.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        raise ConnectionError("hung up")
    (n,) = struct.unpack("<I", head)
    return json.loads(s.recv(n, socket.MSG_WAITALL))


def flood(addr: str, port: int, n: int, seconds: float) -> None:
    """Hold ``n`` silent connections for ``seconds``, reopening dropped ones."""
    until = time.monotonic() + seconds
    conns = [_connect(addr, port, until) for _ in range(n)]
    say("FLOODING")
    reopened = 0
    while time.monotonic() < until:
        for i, s in enumerate(conns):
            try:  # a socket whose reopening failed (the server is gone) is closed: fileno() -1
                s.setblocking(False)
                dropped = s.recv(1) == b""
            except BlockingIOError:
                dropped = False
            except OSError:
                dropped = True
            if dropped:
                s.close()
                try:
                    conns[i] = socket.create_connection((addr, port), timeout=2)
                    reopened += 1
                except OSError:
                    pass  # keep trying while the flood lasts
        time.sleep(0.01)
    for s in conns:
        s.close()
    say(f"REOPENED {reopened}")


def claim(addr: str, port: int, rank: int, size: int) -> None:
    """Claim ``rank`` of ``size`` with a guessed proof; print the server's answer."""
    s = _connect(addr, port, time.monotonic() + 20)
    s.settimeout(10)
    nc = new_nonce()
    try:
        s.sendall(_framed({"hal": _PROTO, "gen": 0, "rank": rank, "size": size, "nonce": nc.hex()}))
        _read(s)  # the server's challenge (its proof, which a stranger cannot check)
        s.sendall(_framed({"mac": Keys(b"a guess").mac("rdzv-client", b"", nc).hex()}))
        say(f"ANSWER {json.dumps(_read(s))}")
        if s.recv(1) == b"":
            say("HUNG UP")
    except (ConnectionError, OSError):
        say("HUNG UP")
    finally:
        s.close()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "flood":
        flood(args[0], int(args[1]), int(args[2]), float(args[3]))
    elif mode == "claim":
        claim(args[0], int(args[1]), int(args[2]), int(args[3]))
    else:
        sys.exit(f"unknown mode {mode!r}")
