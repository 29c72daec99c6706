"""The throughput phases: regauge's producer beside a bare confluent-kafka loop, and
ingest Kafka -> bronze -> silver beside a bare consumer, over the same records."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from warehouse.base import kafka_conf
from warehouse.base.settings import Settings
from warehouse.tools.bench.context import Bench
from warehouse.tools.bench.report import Batch, last_recorded, sustained

BENCH_TOPIC = "regauge.bench.baseline"
# How long before the run the throughput phase's events happened.
RECENT = timedelta(hours=1)


def producer(bench: Bench) -> tuple[dict[int, int], dict[int, int], int]:
    """regauge's producer and a bare loop over the same records, chunk by chunk.

    Returns the topic's end offsets before and after, and how many records
    the contract accepts (clean generator traffic: all but the cancellations
    dated more than a day after their send time).
    """
    from confluent_kafka import Producer

    from spark_jobs import generator, producer
    from warehouse.ops.stack import services

    # The baseline's own topic, shaped like the real one, so the lake never sees it.
    services.ensure_topic(bench.settings, BENCH_TOPIC)
    before = _end_offsets(bench.settings)
    ours = bare = 0.0
    sent = valid = 0
    seed = int(bench.run_id) % 10**9
    # The records happened in the hour before the run: recent traffic arriving in a
    # burst (an outage's backlog), after all of history and within the views'
    # allowed lateness. In the generator's fixed week, with the freshness load's
    # present-day watermark, the live views restated them window by window before
    # the freshness phase could start (892,534 restatements in one cart batch).
    sent_at = datetime.now(UTC)
    for n, size in enumerate(_chunks(bench.sizes.events, bench.sizes.chunk)):
        # Generating is not producing: only the sends are timed.
        records = generator.recent(seed + n, size, sent_at=sent_at, span=RECENT)
        valid += sum(1 for r in records if r.expect == generator.VALID)
        run = producer.produce_run(bench.settings, seed + n, records)
        if not run.summary.ok:
            raise RuntimeError(f"the producer failed: {run.summary.errors[:3]}")
        ours += run.summary.seconds
        sent += run.summary.produced
        # A producer per chunk, as produce_run makes one per call: both pay the
        # same connection and idempotence handshake.
        started = time.monotonic()
        baseline = Producer(producer.producer_config(bench.settings))
        for r in records:
            while True:
                try:
                    baseline.produce(
                        BENCH_TOPIC, key=r.key, value=r.value, timestamp=r.timestamp_ms or 0
                    )
                    break
                except BufferError:
                    baseline.poll(0.05)
            baseline.poll(0)
        if baseline.flush(60):
            raise RuntimeError("the bare producer loop could not deliver within 60 s")
        bare += time.monotonic() - started
        bench.say(f"  producer: {sent:,} of {bench.sizes.events:,} sent")
    after = _end_offsets(bench.settings)
    f, b = bench.report.figures, bench.report.baselines
    f["producer_events_per_s"] = sent / ours
    b["producer_baseline_events_per_s"] = sent / bare
    f["producer_vs_baseline"] = f["producer_events_per_s"] / b["producer_baseline_events_per_s"]
    bench.say(
        f"producer: {f['producer_events_per_s']:,.0f} events/s; bare confluent-kafka loop "
        f"{b['producer_baseline_events_per_s']:,.0f} events/s"
    )
    return before, after, valid


def bare_consumer(bench: Bench, before: dict[int, int], after: dict[int, int]) -> None:
    """A confluent-kafka consumer reading the same records and doing nothing with them."""
    from confluent_kafka import Consumer, TopicPartition

    from warehouse.base import registry

    consumer = Consumer(
        {
            **kafka_conf.client_conf(bench.settings),
            "group.id": f"regauge-bench-{bench.run_id}",
            "enable.auto.commit": False,
        }
    )
    want = sum(after[p] - before[p] for p in after)
    consumer.assign([TopicPartition(registry.TOPIC, p, before[p]) for p in after])
    got = 0
    started = time.monotonic()
    deadline = started + 600
    while got < want and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=10_000, timeout=1.0):
            if msg.error() is None:
                got += 1
    seconds = time.monotonic() - started
    consumer.close()
    if got < want:
        raise RuntimeError(f"the bare consumer read {got:,} of {want:,} records in 600 s")
    bench.report.baselines["ingest_baseline_events_per_s"] = want / seconds


def ingest(
    bench: Bench, spark: Any, before: dict[int, int], after: dict[int, int], valid: int
) -> None:
    """Ingest as in production (its one query, processing-time trigger) through the backlog."""
    from spark_jobs.engine import bronze
    from warehouse.base import registry

    batches = _ingest_until(bench, spark, after)
    want = sum(after[p] - before[p] for p in after)
    # The figures count only if every record landed exactly where the contract says.
    ranges = bronze.in_offsets(before, after)
    read = spark.read.format("delta").load
    in_bronze = read(registry.BRONZE_EVENTS.path(bench.settings)).where(ranges).count()
    in_silver = read(registry.SILVER_EVENTS.path(bench.settings)).where(ranges).count()
    if (in_bronze, in_silver) != (want, valid):
        raise RuntimeError(
            f"ingest landed {in_bronze:,} in bronze and {in_silver:,} in silver; "
            f"expected {want:,} and {valid:,}"
        )
    rate, p95_batch = sustained(batches, want)
    f = bench.report.figures
    f["ingest_events_per_s"] = rate
    f["ingest_batch_p95_s"] = p95_batch
    f["ingest_vs_baseline"] = rate / bench.report.baselines["ingest_baseline_events_per_s"]
    # Read before this run is saved, so the newest recorded is the run before.
    before_now = last_recorded("ingest_events_per_s", bench.sizes.events)
    if before_now is not None:
        f["ingest_last_recorded_events_per_s"] = before_now
        f["ingest_vs_last_recorded"] = rate / before_now
    bench.report.notes["ingest"] = (
        f"{want:,} records, {sum(1 for b in batches if b.rows)} micro-batches with rows, "
        f"at most {bench.settings.ingest_max_records_per_batch:,} records per batch"
    )
    bench.say(
        f"ingest: {rate:,.0f} events/s (p95 batch {p95_batch:.1f} s); bare consumer "
        f"{bench.report.baselines['ingest_baseline_events_per_s']:,.0f} events/s"
    )


def web_ingest(bench: Bench, spark: Any) -> None:
    """The second source's ingest rate (issue 66): a quarter as many web records as the
    shop's, of the last hour, sent to `web.events` at once, then ingest as in
    production (every source's query) until the web's query has read them. The rate
    of that query's batches, against the shop's in the same run (`ingest_events_per_s`).

    After the shop's phase, so the shop's figure stays comparable with earlier runs';
    the shop's query then finds nothing new and costs a little of the web's time."""
    from spark_jobs import generator, producer
    from spark_jobs.engine import bronze
    from warehouse.base import registry
    from warehouse.ops.stack import services

    web = registry.source_tables("web")
    services.ensure_topic(bench.settings, web.topic)
    count = max(bench.sizes.events // 4, 1)
    seed = int(bench.run_id) % 10**9
    sent_at = datetime.now(UTC)
    records = generator.web_records(
        seed, count, start=sent_at - RECENT, days=RECENT / timedelta(days=1)
    )
    before = _end_offsets(bench.settings, web.topic)
    run = producer.produce_run(bench.settings, seed, records, topic=web.topic)
    if not run.summary.ok:
        raise RuntimeError(f"the producer failed on the web's records: {run.summary.errors[:3]}")
    after = _end_offsets(bench.settings, web.topic)
    want = sum(after[p] - before[p] for p in after)
    batches = _ingest_until(bench, spark, after, query=web.ingest_query)
    read = spark.read.format("delta").load
    ranges = bronze.in_offsets(before, after)
    in_silver = read(web.silver.path(bench.settings)).where(ranges).count()
    if in_silver != want:
        raise RuntimeError(f"web ingest landed {in_silver:,} in silver; expected {want:,}")
    rate, p95_batch = sustained(batches, want)
    f = bench.report.figures
    f["web_ingest_events_per_s"] = rate
    if "ingest_events_per_s" in f:
        f["web_ingest_vs_shop"] = rate / f["ingest_events_per_s"]
    bench.report.notes["web ingest"] = (
        f"{want:,} web records, {sum(1 for b in batches if b.rows)} micro-batches with rows"
    )
    bench.say(f"web ingest: {rate:,.0f} events/s (p95 batch {p95_batch:.1f} s)")


def _batch_listener(batches: list[Batch], query: str | None = None) -> Any:
    """A StreamingQueryListener that collects every ingest micro-batch and knows when
    ingest has finished a batch that read up to given offsets.

    Made inside a function so this module imports without PySpark (its pure
    parts are tested without a JVM).
    """
    from pyspark.sql.streaming import StreamingQueryListener

    from spark_jobs.engine import ingest

    name = query or ingest.QUERY

    class Listener(StreamingQueryListener):
        def __init__(self) -> None:
            self.done: dict[int, int] = {}

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = json.loads(event.progress.json)
            if p.get("name") != name:
                return
            started = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            seconds = (p.get("durationMs") or {}).get("triggerExecution", 0) / 1000
            rows = int(p.get("numInputRows") or 0)
            batches.append(Batch(name, started, seconds, rows))
            # A progress event comes once its batch has committed bronze and silver both.
            end = ingest.kafka_offsets((p.get("sources") or [{}])[0], "endOffset")
            self.done = {int(part): o for part, o in end.items()} or self.done

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

        def caught_up(self, after: dict[int, int]) -> bool:
            return all(self.done.get(p, -1) >= o for p, o in after.items())

    return Listener()


def _end_offsets(settings: Settings, topic: str | None = None) -> dict[int, int]:
    """The event topic's (the shop's by default) next offset per partition."""
    from warehouse.ops import lag

    return {p: high for p, (_, high) in lag.kafka_watermarks(settings, topic=topic).items()}


def _chunks(total: int, size: int) -> list[int]:
    return [min(size, total - start) for start in range(0, total, size)]


def _ingest_until(
    bench: Bench, spark: Any, after: dict[int, int], query: str | None = None
) -> list[Batch]:
    """Ingest as in production (every source's query, processing-time trigger) until
    `query` (the shop's by default) has read its topic up to `after`; its batches."""
    from warehouse.ops import ingest_ctl, pipeline

    batches: list[Batch] = []
    listener = _batch_listener(batches, query)
    spark.streams.addListener(listener)
    stop = threading.Event()
    failure: list[BaseException] = []

    def work() -> None:
        try:
            pipeline.run_ingest(
                spark,
                bench.settings,
                stop,
                status_file=ingest_ctl.status_file(bench.settings),
            )
        except BaseException as exc:
            failure.append(exc)
            stop.set()

    worker = threading.Thread(target=work, name="bench-ingest")
    worker.start()
    deadline = time.monotonic() + 1800
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            if listener.caught_up(after):
                break
            stop.wait(1.0)
    finally:
        stop.set()
        worker.join(120)
        spark.streams.removeListener(listener)
    if failure:
        raise RuntimeError(f"ingest failed during the bench: {failure[0]}")
    if not listener.caught_up(after):
        raise RuntimeError("ingest did not catch up with the bench's records in 30 min")
    return batches
