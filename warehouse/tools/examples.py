"""The analysts' guide's example queries, read from `docs/analysts.md` itself.

The demo prints their answers and the tests check them, so the examples in the
guide are always ones that run as written.
"""

from __future__ import annotations

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "analysts.md"


def analyst_examples() -> dict[str, str]:
    """Title (the bold line above each block) -> SQL, from the guide."""
    found = re.findall(
        r"\*\*(?P<title>[^*]+)\*\*[^`]*```sql\n(?P<sql>.*?)```", GUIDE.read_text(), re.S
    )
    return {title.strip(): sql.strip() for title, sql in found}
