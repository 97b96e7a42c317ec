"""The runnable snippets of a docs page.

A snippet is a fenced block opened with ```` ```python moderato id=<name> ````:
GitHub highlights it as Python and ignores the rest of the line. The test of
each page runs its snippets and checks that every one is run.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
SNIPPET = re.compile(r"^```python moderato id=(?P<id>[\w-]+)\n(?P<code>.*?)^```$", re.M | re.S)


def snippets(page: str) -> dict[str, str]:
    """The page's snippets by id, in the order they appear (an id used twice fails)."""
    text = (DOCS / page).read_text(encoding="utf-8")
    found: dict[str, str] = {}
    for match in SNIPPET.finditer(text):
        assert match["id"] not in found, f"{page}: two snippets named {match['id']}"
        found[match["id"]] = match["code"]
    return found
