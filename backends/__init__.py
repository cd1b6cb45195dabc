"""Built-in backends (``hal.backends.cpu``, ``hal.backends.opencl``, ``hal.backends.cuda``).

Each is a plugin registered under the ``hal.backends`` entry-point group, exactly as a
vendor's would be; nothing in hal core imports them.

``hal.backends()`` was the discovery function, now :func:`hal.list_backends`. Importing a
built-in backend makes Python bind this package to the ``hal.backends`` attribute, so for
hal-sdk 1.x the package stays callable: calling it warns (``DeprecationWarning``) and
forwards to :func:`hal.list_backends`. Both go in 2.0.
"""

from __future__ import annotations

import sys
import types
import warnings
from typing import Any

from hal._discovery import list_backends as _list_backends


class _CallablePackage(types.ModuleType):
    """Module type whose call lists backends, so ``hal.backends()`` works after a submodule import."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        warnings.warn(
            "hal.backends() is deprecated; use hal.list_backends() (hal.backends is the package of the "
            "built-in backends)",
            DeprecationWarning,
            stacklevel=2,
        )
        return _list_backends(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
