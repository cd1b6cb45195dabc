"""Built-in backends (``hal.backends.cpu``, ``hal.backends.opencl``, ``hal.backends.cuda``).

Each is a plugin registered under the ``hal.backends`` entry-point group, exactly as a
vendor's would be; nothing in hal core imports them.

``hal.backends`` is also the discovery function :func:`hal.backends` (a backend listing).
Importing a built-in backend makes Python bind this package to the ``hal.backends``
attribute, so the package itself is made callable and forwards to that function.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from hal._discovery import backends as _backends


class _CallablePackage(types.ModuleType):
    """Module type whose call lists backends, so ``hal.backends()`` works after a submodule import."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _backends(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
