"""Where the browser tests find headless Chromium (Debian's ``chromium`` package, which
``make test`` installs through tools/ensure-chromium.sh, or MODERATO_CHROMIUM)."""

from __future__ import annotations

import os
import shutil
from typing import Optional

INSTALL_HINT = (
    "headless Chromium is needed for the demo page test and was not found. Install it with "
    "`sudo apt-get install -y --no-install-recommends chromium fonts-liberation` (Debian/Ubuntu), "
    "run `make test` (tools/ensure-chromium.sh installs it), or set MODERATO_CHROMIUM to a "
    "chromium or chrome binary."
)


def find_chromium() -> Optional[str]:
    return os.environ.get("MODERATO_CHROMIUM") or shutil.which("chromium")
