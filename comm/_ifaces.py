"""Network interface selection for the TCP transport (``HAL_COMM_IFNAME``, NCCL_SOCKET_IFNAME style).

``HAL_COMM_IFNAME`` is a comma-separated list of interface name prefixes (``eth,ens``); a leading
``^`` excludes the listed prefixes instead (``^lo,docker``); a leading ``=`` (after an optional
``^``) matches whole names only (``=eth0``). The first matching interface with an address, in
the kernel's interface order, carries the rank's sockets: its IPv4 address, or its first global
IPv6 address when it has no IPv4 one or when the rendezvous itself runs over IPv6. Link-local
IPv6 addresses (``fe80::/10``) are not used.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping

__all__ = ["interfaces", "interfaces6", "parse_ifname", "select_interface"]

_SIOCGIFADDR = 0x8915


def interfaces() -> dict[str, str]:
    """Return ``{name: IPv4 address}`` of this host's interfaces that have one, in kernel order."""
    out: dict[str, str] = {}
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _index, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)
            except OSError:
                continue  # no IPv4 address (or down without one)
            out[name] = socket.inet_ntoa(res[20:24])
    finally:
        s.close()
    return out


def interfaces6() -> dict[str, str]:
    """Return ``{name: first global IPv6 address}`` of this host's interfaces (``/proc/net/if_inet6``)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/net/if_inet6") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or len(fields[0]) != 32:
            continue
        try:
            addr = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(fields[0]))
        except (ValueError, OSError):
            continue
        if ipaddress.IPv6Address(addr).is_link_local:
            continue  # link-local: needs a scope id, not for a multi-host mesh
        out.setdefault(fields[5], addr)
    order = {name: i for i, name in socket.if_nameindex()[::-1]}
    return dict(sorted(out.items(), key=lambda kv: order.get(kv[0], 1 << 30)))


def parse_ifname(spec: str) -> tuple[bool, bool, list[str]]:
    """Parse ``HAL_COMM_IFNAME`` into ``(exclude, exact, names)``.

    Raises:
        ValueError: an empty list of names.
    """
    text = spec.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(
            f"HAL_COMM_IFNAME={spec!r} names no interface (e.g. eth0, ^lo,docker, =ens5)"
        )
    return exclude, exact, names


def select_interface(
    spec: str, available: Mapping[str, str] | None = None, *, family: int | None = None
) -> tuple[str, str]:
    """Return ``(name, address)`` of the first interface of ``available`` matching ``spec``.

    ``available`` defaults to this host's interfaces: their IPv4 addresses, and the IPv6 one of
    those without IPv4; ``family=socket.AF_INET6`` prefers IPv6 addresses instead.

    Raises:
        ValueError: a malformed ``spec``, or no interface matches (the message lists them).
    """
    exclude, exact, names = parse_ifname(spec)
    if available is None:
        v4, v6 = interfaces(), interfaces6()
        first, second = (v6, v4) if family == socket.AF_INET6 else (v4, v6)
        have = dict(first)
        for name, addr in second.items():
            have.setdefault(name, addr)
    else:
        have = dict(available)
    for name, addr in have.items():
        hit = any((name == n) if exact else name.startswith(n) for n in names)
        if hit != exclude:
            return name, addr
    listing = ", ".join(f"{n} ({a})" for n, a in have.items()) or "none"
    raise ValueError(
        f"HAL_COMM_IFNAME={spec!r} matches no interface with an IPv4 or IPv6 address; this host has: {listing}"
    )
