"""Logging set-up: the ``hal`` logger obeys ``HAL_LOG_LEVEL``."""

from __future__ import annotations

import logging
import warnings

from hal._errors import ConfigError, HalWarning
from hal._settings import setting

logger = logging.getLogger("hal")


def configure_from_env() -> None:
    """Apply ``HAL_LOG_LEVEL`` (debug, info, warning, error, critical) to the ``hal`` logger.

    A bad value never makes ``import hal`` fail: it is named in a :class:`hal.HalWarning`
    and the default level is kept.
    """
    try:
        level = setting("HAL_LOG_LEVEL")
    except ConfigError as exc:
        warnings.warn(f"{exc}; keeping the default log level", HalWarning, stacklevel=3)
        return
    if not level:
        return
    logger.setLevel(logging.getLevelName(level.upper()))
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("hal %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
