"""`make demo`: the pipeline on the local stack, ending with a Trino query a person can read."""

from __future__ import annotations

import logging
import uuid

from warehouse import trino_client
from warehouse.registry import BRONZE_EVENTS
from warehouse.settings import Settings
from warehouse.stack import services

log = logging.getLogger(__name__)


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(settings: Settings, events: int) -> int:
    from spark_jobs import bronze, producer
    from spark_jobs.session import build_session

    _step("starting the local stack (PostgreSQL, Kafka, Trino, Airflow)")
    services.up(settings)

    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    _step(f"producing {events} events to Kafka, tagged {run_id}")
    summary = producer.produce_sample(settings, events, run_id)
    print(summary.describe())

    _step("landing everything new in Kafka in the bronze Delta table (Spark)")
    spark = build_session("regauge-demo", settings, ui=False)
    try:
        total = bronze.run_once(spark, settings)
    finally:
        spark.stop()
    print(f"bronze holds {total} records")

    _step(f"asking Trino: {BRONZE_EVENTS.trino_name}, per Kafka partition")
    table = BRONZE_EVENTS.trino_name
    result = trino_client.query(
        settings,
        f"SELECT partition, count(*) AS records, "
        f"count_if(strpos(from_utf8(value), ?) > 0) AS from_this_demo, "
        f"max(kafka_timestamp) AS newest_record "
        f"FROM {table} GROUP BY partition ORDER BY partition",
        [f'"{run_id}-'],
    )
    print(trino_client.format_table(result))
    landed = sum(int(row[2]) for row in result.rows)
    print(f"\nthis demo produced {summary.produced} events; Trino sees {landed} of them in bronze")
    print("the stack keeps running: `make status` to look, `make down` to stop it")
    return 0 if landed == summary.produced else 1
