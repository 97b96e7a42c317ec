"""An optional extra that is not installed: say which one installs it, not just what is missing."""

from __future__ import annotations

import importlib.util


def require(module: str, missing: str) -> None:
    """Raise ImportError(``missing``) if ``module`` cannot be imported (without importing it)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or stubbed-out entry in sys.modules
        found = False
    if not found:
        raise ImportError(missing, name=module)
