"""The on-disk compile cache: one file per compiled program, LRU-evicted under a size cap.

- ``HAL_CACHE_DIR``: the cache root (default ``$XDG_CACHE_HOME/hal-sdk`` or
  ``~/.cache/hal-sdk``); programs live in ``<root>/kernels/``.
- ``HAL_CACHE_MAX_BYTES``: the cap (bytes or ``512M``/``1G``; default 512 MiB; ``0``
  disables the on-disk cache). After each store the least recently used entries are
  removed until the total fits. A hit touches the entry (its mtime is the LRU clock).

The key is a SHA-256 over the translated source, the options, the backend, the device,
the compiler/driver identity the backend reports and the hal-sdk version. Entries are
written to a temporary file in the same directory and renamed into place (atomic on
POSIX), so concurrent processes never read a partial entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hal._version import __version__

__all__ = [
    "CacheInfo",
    "cache_dir",
    "cache_info",
    "cache_key",
    "clear_cache",
    "load",
    "max_bytes",
    "store",
]

_MAGIC = b"HALK1\n"
_SUFFIX = ".halk"
_DEFAULT_MAX = 512 << 20
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_lock = threading.Lock()


def cache_dir() -> Path:
    """Return the cache root (``HAL_CACHE_DIR`` or the user cache directory)."""
    env = os.environ.get("HAL_CACHE_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "hal-sdk"


def _kernel_dir() -> Path:
    return cache_dir() / "kernels"


def max_bytes() -> int:
    """Return the cap from ``HAL_CACHE_MAX_BYTES`` (default 512 MiB; 0 disables the cache).

    Raises:
        ValueError: the variable is not a size.
    """
    raw = os.environ.get("HAL_CACHE_MAX_BYTES", "").strip()
    if not raw:
        return _DEFAULT_MAX
    text = raw.upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    try:
        value = float(text[: len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise ValueError(
            f"HAL_CACHE_MAX_BYTES={raw!r} is not a size (e.g. 1048576, 64M, 1G)"
        ) from None
    if value < 0:
        raise ValueError(f"HAL_CACHE_MAX_BYTES={raw!r} must be >= 0")
    return int(value)


def cache_key(
    *,
    source: str,
    options: Sequence[str],
    backend: str,
    device: str,
    compiler: Mapping[str, str],
) -> str:
    """Return the hex SHA-256 key of one compilation."""
    blob = json.dumps(
        {
            "source": source,
            "options": list(options),
            "backend": backend,
            "device": device,
            "compiler": dict(sorted(compiler.items())),
            "hal-sdk": __version__,
        },
        sort_keys=True,
    ).encode()
    return hashlib.sha256(blob).hexdigest()


def _path(key: str) -> Path:
    return _kernel_dir() / f"{key}{_SUFFIX}"


def load(key: str) -> bytes | None:
    """Return the cached binary for ``key`` (touching it), or None on a miss or a bad entry."""
    if max_bytes() == 0:
        return None
    path = _path(key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.startswith(_MAGIC):
        _unlink(path)
        return None
    nl = data.find(b"\n", len(_MAGIC))
    if nl < 0:
        _unlink(path)
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    return data[nl + 1 :]


def store(key: str, binary: bytes, meta: Mapping[str, Any]) -> bool:
    """Write ``binary`` under ``key`` atomically, then evict down to the cap. Return True if kept."""
    cap = max_bytes()
    if cap == 0:
        return False
    folder = _kernel_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        header = json.dumps(dict(meta), sort_keys=True, default=str).encode().replace(b"\n", b" ")
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=_SUFFIX, dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(_MAGIC + header + b"\n" + binary)
            os.replace(tmp, _path(key))
        except BaseException:
            _unlink(Path(tmp))
            raise
    except OSError:
        return False  # an unwritable cache is not an error: the program is still compiled
    evict(cap)
    return _path(key).exists()


def _entries() -> list[tuple[Path, os.stat_result]]:
    out = []
    try:
        it = list(_kernel_dir().iterdir())
    except OSError:
        return []
    for p in it:
        if p.suffix != _SUFFIX or p.name.startswith(".tmp-"):
            continue
        try:
            out.append((p, p.stat()))
        except OSError:
            continue
    return out


def evict(cap: int | None = None) -> list[str]:
    """Remove least recently used entries until the cache fits ``cap``; return removed keys."""
    limit = max_bytes() if cap is None else cap
    removed: list[str] = []
    with _lock:
        entries = sorted(_entries(), key=lambda e: (e[1].st_mtime_ns, e[0].name))
        total = sum(st.st_size for _, st in entries)
        for path, st in entries:
            if total <= limit:
                break
            if _unlink(path):
                removed.append(path.stem)
            total -= st.st_size
    return removed


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """What ``hal cache info`` reports.

    Attributes:
        path: the directory holding the entries.
        entries: number of cached programs; ``bytes`` their total size.
        max_bytes: the cap (``HAL_CACHE_MAX_BYTES``).
        items: per entry: key, bytes, last use (unix time), backend, device, kernels.
    """

    path: str
    entries: int
    bytes: int
    max_bytes: int
    items: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict."""
        return dataclasses.asdict(self)


def _meta(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_MAGIC))
            line = fh.readline(65536)
        if head != _MAGIC:
            return {}
        value = json.loads(line)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def cache_info() -> CacheInfo:
    """Describe the cache: location, entries, total bytes, cap, and each entry (most recent first)."""
    entries = sorted(_entries(), key=lambda e: -e[1].st_mtime_ns)
    items = []
    for path, st in entries:
        meta = _meta(path)
        items.append(
            {
                "key": path.stem,
                "bytes": st.st_size,
                "last_used": st.st_mtime,
                "backend": meta.get("backend"),
                "device": meta.get("device"),
                "kernels": meta.get("kernels", []),
            }
        )
    return CacheInfo(
        path=str(_kernel_dir()),
        entries=len(items),
        bytes=sum(i["bytes"] for i in items),
        max_bytes=max_bytes(),
        items=items,
    )


def clear_cache() -> int:
    """Remove every entry (and stale temporary files); return how many entries were removed."""
    n = 0
    with _lock:
        try:
            paths = list(_kernel_dir().iterdir())
        except OSError:
            return 0
        for p in paths:
            if p.suffix == _SUFFIX and _unlink(p) and not p.name.startswith(".tmp-"):
                n += 1
    return n
