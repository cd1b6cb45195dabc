"""Port clashes: who already listens on a TCP port (Linux ``/proc``), for error messages."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import hal

__all__ = ["clash_error", "listener_of"]


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if (
                len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port
            ):  # 0A: LISTEN
                inodes.add(f[9])
    return inodes


def listener_of(port: int) -> str | None:
    """Describe the process listening on TCP ``port`` on this host (``pid 123 (torchrun ...)``).

    Returns ``"a process this user cannot see"`` when a listening socket exists but its owner
    is hidden, and None when nothing listens (or ``/proc`` is unreadable).
    """
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                    cmd = " ".join(
                        " ".join(a.decode(errors="replace").split()) for a in raw.split(b"\0") if a
                    )
                    return f"pid {pid} ({cmd[:160]})"
            except OSError:
                continue
    return "a process this user cannot see"


def clash_error(exc: OSError, addr: str, port: int, what: str) -> hal.CommError | None:
    """A ``hal.CommError`` for an ``EADDRINUSE`` bind of ``addr:port`` by ``what``; None for other errors."""
    if exc.errno != errno.EADDRINUSE:
        return None
    who = listener_of(port)
    hint = ""
    if who is not None and "torch" in who:
        hint = " (torchrun's own TCPStore listens on MASTER_PORT: hal.comm.init uses it when TORCHELASTIC_* is set)"
    return hal.CommError(
        f"{what} cannot listen on {addr or '*'}:{port}: the address is in use"
        + (f" by {who}" if who else "")
        + hint,
        op="init",
    )
