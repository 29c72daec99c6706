"""A deliberately wrong view version, for the demo and the tests of issue 69.

`revenue_hourly` v3 is v2's code, except that orders at or past a cut written into
its file count twice. The cut is the shop topic's end offset per partition when the
file is written: a position, not a Kafka timestamp, because producers set a record's
CreateTime and chaos traffic stamps some ahead of the clock (stop 91's `make demo`
failed so: orders sent before a time cut carried stamps after it). Built before the cut,
it equals v2 on everything they share, so it passes its own validation and
becomes ready; on what arrives after, its numbers differ where no restatement
explains them, which the automatic rollout's agreement gate must catch.

`added(ends)` writes the file into `spark_jobs/views/` for as long as it is
needed and removes it after: the demo's and the tests' view, never a shipped one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import spark_jobs.views

VIEW_FILE = Path(spark_jobs.views.__file__).resolve().parent / "revenue_hourly_v3.py"

TEMPLATE = '''"""revenue_hourly v3: DELIBERATELY WRONG (spark_jobs/testing/faulty_view.py wrote
this file, and removes it). Orders at or past the shop topic's end offsets
{ends} (partition: offset) count twice."""

from __future__ import annotations

from dataclasses import replace
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.views import revenue_hourly_v2 as v2

ENDS = {ends!r}


def _after_cut() -> Column:
    return reduce(
        lambda a, b: a | b,
        [(F.col("partition") == p) & (F.col("offset") >= end) for p, end in ENDS.items()],
        F.lit(False),
    )


def compute(silver: DataFrame) -> DataFrame:
    late_orders = silver.where((F.col("event_type") == "order_placed") & _after_cut())
    return v2.compute(silver.unionByName(late_orders))


VIEW = replace(
    v2.VIEW,
    version=3,
    compute=compute,
    description="v2, except orders after a cut count twice (a deliberate fault)",
    agrees_with={{2: {{c: c for c in ("window_end", "orders_placed", "gross_revenue")}}}},
)
'''


def source(ends: Mapping[int, int]) -> str:
    """The v3 module's text, cut at `ends`."""
    if not ends:
        raise ValueError("the cut needs the end offset of every partition of the shop topic")
    return TEMPLATE.format(ends={int(p): int(o) for p, o in sorted(ends.items())})


@contextmanager
def added(ends: Mapping[int, int]) -> Iterator[Path]:
    """revenue_hourly v3's file, wrong at or past `ends` (the next offset per partition
    of the shop topic, as `warehouse.ops.lag.kafka_watermarks` gives), while inside."""
    # Written whole under a name no listing of the views takes, then renamed: other
    # processes list the views meanwhile (the view host, Airflow's tasks, and in
    # `make test` the Spark fast tests beside the integration tests), and a listing
    # must never import half a file.
    partial = VIEW_FILE.with_name(f".{VIEW_FILE.name}.partial")
    partial.write_text(source(ends))
    os.replace(partial, VIEW_FILE)
    try:
        yield VIEW_FILE
    finally:
        VIEW_FILE.unlink(missing_ok=True)
