"""A deliberately wrong view version, for the demo and the tests of issue 69.

`revenue_hourly` v3 is v2's code, except that orders arriving (by Kafka
timestamp) after a cut written into its file count twice. Built before the cut,
it equals v2 on everything they share, so it passes its own validation and
becomes ready; on what arrives after, its numbers differ where no restatement
explains them, which the automatic rollout's agreement gate must catch.

`added(cut)` writes the file into `spark_jobs/views/` for as long as it is
needed and removes it after: the demo's and the tests' view, never a shipped one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import spark_jobs.views

VIEW_FILE = Path(spark_jobs.views.__file__).resolve().parent / "revenue_hourly_v3.py"

TEMPLATE = '''"""revenue_hourly v3: DELIBERATELY WRONG (spark_jobs/testing/faulty_view.py wrote
this file, and removes it). Orders that reached Kafka after {cut} count twice."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.views import revenue_hourly_v2 as v2

CUT = datetime.fromisoformat("{cut}")


def compute(silver: DataFrame) -> DataFrame:
    late_orders = silver.where(
        (F.col("event_type") == "order_placed") & (F.col("kafka_timestamp") > F.lit(CUT))
    )
    return v2.compute(silver.unionByName(late_orders))


VIEW = replace(
    v2.VIEW,
    version=3,
    compute=compute,
    description="v2, except orders after a cut count twice (a deliberate fault)",
    agrees_with={{2: {{c: c for c in ("window_end", "orders_placed", "gross_revenue")}}}},
)
'''


@contextmanager
def added(cut: datetime) -> Iterator[Path]:
    """revenue_hourly v3's file, wrong after `cut` (an aware datetime), while inside."""
    if cut.tzinfo is None:
        raise ValueError("the cut needs a time zone")
    VIEW_FILE.write_text(TEMPLATE.format(cut=cut.isoformat()))
    try:
        yield VIEW_FILE
    finally:
        VIEW_FILE.unlink(missing_ok=True)
