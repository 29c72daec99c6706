"""Fault injection for the chaos suite: crash a process at a named point, on purpose.

`REGAUGE_FAULT=<point>:<batch>` makes the process exit abruptly (as kill -9
would, with no cleanup) when it reaches `point` in micro-batch `batch`. The
points sit where a real crash hurts most: after a micro-batch's Delta commits
and before Spark records the batch in its checkpoint, so the batch runs again
on restart and must change nothing the second time. Unset, it does nothing.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

ENV = "REGAUGE_FAULT"
POINTS = (
    "silver_after_commit",
    "silver_after_ledger",
    "view_after_commit",
    # Re-admission (batch 0) after its quarantine MERGE, before silver has its records.
    "readmit_after_quarantine",
)


def maybe_crash(point: str, batch_id: int) -> None:
    wanted = os.environ.get(ENV, "")
    if not wanted:
        return
    name, _, batch = wanted.partition(":")
    if name not in POINTS:
        raise ValueError(f"{ENV}={wanted!r}: the point must be one of {', '.join(POINTS)}")
    if name == point and batch.isdigit() and int(batch) == batch_id:
        log.warning("fault injection: crashing at %s in batch %d", point, batch_id)
        logging.shutdown()
        # No cleanup, no finally blocks, no checkpoint commit: a crash.
        os._exit(137)
