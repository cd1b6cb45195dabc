"""Job authentication: keys derived from the job's secret, challenge-response MACs, nonces.

Every hello of hal.comm (the rendezvous, the TCP transport) is a challenge-response with a
fresh random nonce from each side: the side that accepts proves it knows the secret first
(an HMAC over both nonces and what the hello claims), then the side that connects does, with
another key. Keys are derived per purpose and direction from the job's secret, so a MAC
seen in one place is worth nothing in another; comparisons are constant-time. Heartbeats
carry a truncated HMAC over the session and a strictly increasing sequence number.

Without a secret the same exchange runs with an empty key: it then only checks that the other
side speaks the protocol (no security). See docs/security.md.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import stat
import tempfile
import threading
import warnings

import hal

__all__ = [
    "AUTH_FAILED",
    "Keys",
    "is_loopback",
    "local_secret",
    "local_secret_dir",
    "local_secret_path",
    "mismatch_hint",
    "new_nonce",
    "warn_unauthenticated",
]

NONCE_BYTES = 16
MAC_BYTES = 32

_warned: set[str] = set()
_warned_lock = threading.Lock()


#: What a rank answers in place of its proof when the other side's proof does not match its
#: secret, so the side it refuses records "refused: secrets differ" rather than a closed connection.
AUTH_FAILED = b"hal-auth-failed:secrets-differ\0\0"


def mismatch_hint(authenticated: bool) -> str:
    """Say which side of a secret mismatch this rank is on (never the secret itself)."""
    if authenticated:
        return "this rank has a secret; the other side has another or none"
    return "this rank has none: HAL_COMM_SECRET / HAL_COMM_SECRET_FILE unset here"


def new_nonce() -> bytes:
    """Return a fresh random nonce (16 bytes from :mod:`secrets`)."""
    return secrets.token_bytes(NONCE_BYTES)


class Keys:
    """Per-purpose keys derived from a job secret (``None``: unauthenticated, an empty key)."""

    __slots__ = ("_keys", "authenticated")

    _PURPOSES = (
        "rdzv-server",
        "rdzv-client",
        "rdzv-store",  # values of the rendezvous in torchrun's store (comm/_torchstore.py)
        "tcp-acceptor",
        "tcp-connector",
        "heartbeat",
    )

    def __init__(self, secret: bytes | None) -> None:
        if secret is not None and not isinstance(secret, (bytes, bytearray)):
            raise TypeError(f"secret={secret!r} must be bytes or None")
        self.authenticated = bool(secret)
        master = hashlib.sha256(b"hal-comm job secret v1\0" + bytes(secret or b"")).digest()
        self._keys = {
            p: hmac.new(master, p.encode(), hashlib.sha256).digest() for p in self._PURPOSES
        }

    def mac(self, purpose: str, *parts: bytes) -> bytes:
        """Return the HMAC-SHA256 of ``parts`` (each length-prefixed) under the key of ``purpose``."""
        h = hmac.new(self._keys[purpose], purpose.encode(), hashlib.sha256)
        for p in parts:
            h.update(len(p).to_bytes(4, "little"))
            h.update(p)
        return h.digest()

    def verify(self, purpose: str, mac: bytes, *parts: bytes) -> bool:
        """Return True if ``mac`` is the MAC of ``parts`` for ``purpose`` (constant-time compare)."""
        want = self.mac(purpose, *parts)
        return hmac.compare_digest(want[: len(mac)], mac) if len(mac) >= 16 else False


def is_loopback(host: str) -> bool:
    """True when ``host`` (a name or an address) resolves only to loopback addresses."""
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    addrs = {str(i[4][0]) for i in infos}
    try:
        return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)
    except ValueError:
        return False


def local_secret_path(port: int) -> str | None:
    """Return where a same-host job without a secret keeps one (``$TMPDIR/hal-comm-UID/rendezvous-NETNS-PORT.key``).

    None when that directory cannot be made this user's alone (another user owns it, or it is
    open to others): the job then runs unauthenticated.
    """
    if not hasattr(os, "geteuid"):
        return None
    d = local_secret_dir()
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return os.path.join(d, f"rendezvous-{_netns()}-{port}.key")


def local_secret_dir() -> str:
    """Return the directory of this user's same-host key files, ``$TMPDIR/hal-comm-UID``."""
    return os.path.join(tempfile.gettempdir(), f"hal-comm-{os.geteuid()}")


def _netns() -> str:
    """This process's network namespace (loopback ports are per namespace), e.g. ``4026531992``."""
    try:
        return os.readlink("/proc/self/ns/net").removeprefix("net:[").removesuffix("]")
    except OSError:
        return "0"


def _listening(port: int) -> bool:
    """True when some socket of this host (network namespace) listens on TCP ``port`` (Linux ``/proc``)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            return True  # cannot tell: keep the file
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 3
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                return True
    return False


def _sweep(directory: str, keep: str) -> None:
    """Remove the key files of rendezvous that no longer listen (their rank 0 was killed)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    mine = f"rendezvous-{_netns()}-"
    for name in names:  # only this network namespace's: another one's ports are not visible here
        stem = name.removeprefix(mine).removesuffix(".key")
        if (
            name == keep
            or not name.startswith(mine)
            or not name.endswith(".key")
            or not stem.isdigit()
        ):
            continue
        if not _listening(int(stem)):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _forget(path: str, data: bytes) -> None:
    try:
        with open(path, "rb") as f:
            if f.read() != data:
                return  # a later job on this port wrote its own
        os.unlink(path)
    except OSError:
        pass


def local_secret(port: int, *, create: bool) -> bytes | None:
    """The secret of a same-host job at rendezvous ``port`` that was given none, in a file only this user can read.

    Rank 0 creates it (``create=True``) before its server listens; the other ranks read it once
    connected. It is removed when rank 0's process exits (files of rank 0s that were killed are
    removed by the next rank 0 of this user, once nothing listens on their port). None: no such
    file could be used.
    """
    path = local_secret_path(port)
    if path is None:
        return None
    if create:
        data = secrets.token_hex(32).encode()
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600
            )
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:
            return None
        atexit.register(_forget, path, data)
        _sweep(os.path.dirname(path), os.path.basename(path))
        return data
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        return os.read(fd, 256) or None
    finally:
        os.close(fd)


def warn_unauthenticated(where: str) -> None:
    """Warn once per process that a multi-host job runs without a secret."""
    with _warned_lock:
        if _warned:
            return
        _warned.add(where)
    warnings.warn(
        f"hal.comm: {where} runs without a job secret, so anyone who can reach its ports can join it or "
        "feed it data; set HAL_COMM_SECRET or HAL_COMM_SECRET_FILE on every rank (hal run sets one) "
        "- see docs/security.md",
        hal.HalWarning,
        stacklevel=3,
    )
