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

import hashlib
import hmac
import ipaddress
import secrets
import socket
import threading
import warnings

import hal

__all__ = ["Keys", "is_loopback", "new_nonce", "warn_unauthenticated"]

NONCE_BYTES = 16
MAC_BYTES = 32

_warned: set[str] = set()
_warned_lock = threading.Lock()


def new_nonce() -> bytes:
    """Return a fresh random nonce (16 bytes from :mod:`secrets`)."""
    return secrets.token_bytes(NONCE_BYTES)


class Keys:
    """Per-purpose keys derived from a job secret (``None``: unauthenticated, an empty key)."""

    __slots__ = ("_keys", "authenticated")

    _PURPOSES = ("rdzv-server", "rdzv-client", "tcp-acceptor", "tcp-connector", "heartbeat")

    def __init__(self, secret: bytes | None) -> None:
        if secret is not None and not isinstance(secret, (bytes, bytearray)):
            raise TypeError(f"secret={secret!r} must be bytes or None")
        self.authenticated = bool(secret)
        master = hashlib.sha256(b"hal-comm job secret v1\0" + bytes(secret or b"")).digest()
        self._keys = {p: hmac.new(master, p.encode(), hashlib.sha256).digest() for p in self._PURPOSES}

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
