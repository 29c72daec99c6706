"""The README's example queries for analysts, read from the README itself.

The demo prints their answers and the tests check them, so the examples in the
README are always ones that run as written.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def analyst_examples() -> dict[str, str]:
    """Title (the bold line above each block) -> SQL, from the "For analysts" section."""
    text = README.read_text()
    section = text.split("## For analysts", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"\*\*(?P<title>[^*]+)\*\*[^`]*```sql\n(?P<sql>.*?)```", section, re.S)
    return {title.strip(): sql.strip() for title, sql in found}
