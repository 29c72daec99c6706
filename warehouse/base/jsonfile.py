"""A JSON file that readers never see half-written: the status files regauge's
processes leave for others (ingest's progress, the view host's state, the last
audit's verdict)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def replace_json(path: Path, data: Any) -> None:
    """Write `data` beside `path`, then rename it over `path` (atomic on one file system)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)
