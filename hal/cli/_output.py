"""Writing a subcommand's output file: one message and exit code when the path cannot be written."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def write_output(prefix: str, option: str, path: str, content: str | Callable[[], object]) -> bool:
    """Write ``content`` (text, UTF-8; or a function that writes ``path``) to ``path``, given by
    ``option``; return whether it succeeded.

    On ``OSError`` print ``<prefix>: <option> '<path>' cannot be written: <reason>`` to stderr
    (the command then exits 2) instead of a traceback.
    """
    try:
        if isinstance(content, str):
            Path(path).write_text(content, encoding="utf-8")
        else:
            content()
    except OSError as exc:
        print(
            f"{prefix}: {option} {path!r} cannot be written: {exc.strerror or exc}", file=sys.stderr
        )
        return False
    return True
