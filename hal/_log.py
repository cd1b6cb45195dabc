"""Logging set-up: the ``hal`` logger obeys ``HAL_LOG_LEVEL``."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("hal")


def configure_from_env() -> None:
    """Apply ``HAL_LOG_LEVEL`` (debug, info, warning, error) to the ``hal`` logger."""
    level = os.environ.get("HAL_LOG_LEVEL")
    if not level:
        return
    value = logging.getLevelName(level.upper())
    if not isinstance(value, int):
        raise ValueError(f"HAL_LOG_LEVEL={level!r} is not a logging level (debug, info, warning, error)")
    logger.setLevel(value)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("hal %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
