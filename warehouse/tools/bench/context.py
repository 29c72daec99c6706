"""What every phase shares: the run's settings, sizes, report, voice and id."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from warehouse.base.settings import Settings
from warehouse.tools.bench.report import Report
from warehouse.tools.bench.sizes import Sizes


@dataclass
class Bench:
    """One run: each phase reads its sizes and settings here and writes its figures,
    baselines and notes into the report."""

    settings: Settings
    sizes: Sizes
    report: Report
    say: Callable[[str], None] = print
    run_id: str = field(default_factory=lambda: f"{int(time.time())}")
    # Where the Spark applications the run starts write their event logs.
    events_dir: Path | None = None
