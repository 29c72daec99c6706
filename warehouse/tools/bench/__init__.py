"""`make bench`: each figure next to a baseline measured in the same run, on the same machine.

Machine noise cancels out of a ratio, so every figure is printed beside what
the simplest tool for the same job does here and now:

| figure                                   | baseline                                  |
|------------------------------------------|-------------------------------------------|
| producer events/s (regauge's producer)   | a bare confluent-kafka loop, same records |
| ingest Kafka -> bronze -> silver events/s | a bare confluent-kafka consumer            |
| replay of all views from silver events/s | DuckDB over delta-rs, revenue_hourly v1   |
| produce -> visible in serving, p50/p95   | the trigger interval                      |
| serving query through Trino, p50/p95     | `SELECT 1` through the same client        |
| peak resident memory of the whole stack  | (the 12 GiB target)                       |

The phases run one after another, so none competes with another for the two
cores. Ingest and the view streams are stopped for the first three phases and
left as they were found at the end. What the bench sends stays in the lake as
ordinary traffic (clean generator records, and one probe order per freshness
sample in an hour of 2001 no other data uses); `make clean` starts over.
A missed target is reported, never a failure: the exit code says only
whether every phase ran.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.tools.bench.sizes import Sizes

log = logging.getLogger(__name__)

# Issue 9's targets on 2 cores: (figure, comparison, bound).
TARGETS: list[tuple[str, str, float]] = [
    ("producer_events_per_s", ">=", 100_000),
    ("producer_vs_baseline", ">=", 0.5),
    ("ingest_events_per_s", ">=", 30_000),
    ("replay_events_per_s", ">=", 500_000),
    ("replay_vs_duckdb_time", "<=", 3.0),
    ("freshness_p95_s", "<=", 10.0),
    ("serving_query_p50_ms", "<=", 500.0),
    ("stack_peak_gib", "<=", 12.0),
]
PROBE_VIEW = "revenue_hourly"
# Each run's probe orders fall in hours of 2001, a year no generated traffic uses, so
# a window appearing there can only be a probe arriving.
PROBE_YEAR = datetime(2001, 1, 1, tzinfo=UTC)
PROBE_CUSTOMER = "bench-probe"
BENCH_TOPIC = "regauge.bench.baseline"
QUIET_DAGS = ("regauge_watchdog", "regauge_audit")
# How often freshness asks Trino; each ask is a real query, so not too often.
POLL_S = 0.5
DEFAULT_OUT = REPO_ROOT / "docs" / "bench"
DOC = REPO_ROOT / "docs" / "BENCHMARKS.md"


@dataclass
class Report:
    figures: dict[str, float] = field(default_factory=dict)
    baselines: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdicts"] = [
            {"figure": n, "value": v, "target": f"{op} {b:g}", "met": m}
            for n, v, op, b, m in verdicts(self.figures)
        ]
        return out


# -- pure parts ---------------------------------------------------------------------------
def verdicts(figures: dict[str, float]) -> list[tuple[str, float | None, str, float, bool | None]]:
    """Each target with the measured figure and whether it was met (None: not measured)."""
    out: list[tuple[str, float | None, str, float, bool | None]] = []
    for name, op, bound in TARGETS:
        value = figures.get(name)
        met = None if value is None else (value >= bound if op == ">=" else value <= bound)
        out.append((name, value, op, bound, met))
    return out


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; the bench's one definition."""
    if not samples:
        raise ValueError("no samples")
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[int(q) - 1]


@dataclass(frozen=True)
class Batch:
    """One streaming micro-batch, from its progress event."""

    query: str
    started: float  # epoch seconds
    seconds: float
    rows: int


def sustained(batches: list[Batch], events: int) -> tuple[float, float, float]:
    """(events/s from the first bronze batch's start to the last silver batch's end,
    p95 bronze batch seconds, p95 silver batch seconds), counting batches that had rows."""
    bronze = [b for b in batches if b.query == "bronze" and b.rows]
    silver = [b for b in batches if b.query == "silver" and b.rows]
    if not bronze or not silver:
        raise ValueError("ingest ran no batch with rows in both bronze and silver")
    start = min(b.started for b in bronze)
    end = max(b.started + b.seconds for b in silver)
    return (
        events / (end - start),
        percentile([b.seconds for b in bronze], 95),
        percentile([b.seconds for b in silver], 95),
    )


def probe_event(run: str, k: int, hour: datetime) -> dict[str, Any]:
    """A valid order_placed whose event time opens hour `hour` in the probe year."""
    return {
        "event_id": f"bench-{run}-{k}",
        "event_type": "order_placed",
        "event_time": hour.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "customer_id": PROBE_CUSTOMER,
        "schema_version": 1,
        "payload": {
            "order_id": f"bench-{run}-{k}",
            "currency": "GBP",
            "items": [{"product_id": "bench-probe", "quantity": 1, "unit_price": 1.0}],
            "total": 1.0,
        },
    }


def probe_base(now: datetime) -> datetime:
    """The first probe hour of a run: one of 87 stretches of 100 hours in 2001, a
    different one each minute, so runs rarely meet (`Bench._free_probe_base` checks anyway)."""
    slot = int(now.timestamp() // 60) % 87
    return PROBE_YEAR + timedelta(hours=slot * 100)


def table(report: Report) -> str:
    """The figures beside their baselines and targets, as markdown (also printed)."""
    rows = [
        ("producer", "producer_events_per_s", "producer_baseline_events_per_s", "events/s"),
        ("ingest", "ingest_events_per_s", "ingest_baseline_events_per_s", "events/s"),
        ("replay (3 views)", "replay_events_per_s", "replay_duckdb_events_per_s", "events/s"),
        ("freshness p50", "freshness_p50_s", "trigger_interval_s", "s"),
        ("freshness p95", "freshness_p95_s", "trigger_interval_s", "s"),
        ("serving query p50", "serving_query_p50_ms", "select1_p50_ms", "ms"),
        ("serving query p95", "serving_query_p95_ms", "select1_p95_ms", "ms"),
        ("stack peak memory", "stack_peak_gib", "", "GiB"),
    ]
    met = {n: (op, b, m) for n, _, op, b, m in verdicts(report.figures)}
    lines = [
        "| figure | regauge | baseline | unit | target | met |",
        "|---|---:|---:|---|---|---|",
    ]
    for label, name, base, unit in rows:
        value = report.figures.get(name)
        baseline = report.baselines.get(base) if base else None
        op, bound, ok = met.get(name, ("", 0.0, None))
        lines.append(
            f"| {label} | {_num(value)} | {_num(baseline)} | {unit} | "
            f"{f'{op} {bound:,g}' if op else ''} | {_met(ok) if op else ''} |"
        )
    for name, label in (
        ("producer_vs_baseline", "producer / baseline"),
        ("ingest_vs_baseline", "ingest / baseline"),
        ("replay_vs_duckdb_time", "replay time / DuckDB time"),
    ):
        op, bound, ok = met.get(name, ("", 0.0, None))
        value = report.figures.get(name)
        target = f"{op} {bound:,g}" if op else ""
        verdict = _met(ok) if op else ""
        lines.append(f"| {label} | {_num(value, 2)} | | ratio | {target} | {verdict} |")
    return "\n".join(lines)


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if digits == 0 and abs(value) < 100:
        return f"{value:,.2f}"
    return f"{value:,.{digits}f}"


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "**missed**")


# -- measurements (need the stack) --------------------------------------------------------
def query_latency(settings: Settings, sql: str, runs: int, warmup: int = 3) -> list[float]:
    """Wall-clock milliseconds of `runs` executions of sql through the trino client."""
    from warehouse.sql import trino_client

    out = []
    for i in range(warmup + runs):
        started = time.perf_counter()
        trino_client.query(settings, sql)
        if i >= warmup:
            out.append((time.perf_counter() - started) * 1000)
    return out


class PeakMemory:
    """Samples the whole stack's resident memory every second; `peak` in bytes.

    The stack is every service's process group, the ingest and view-stream
    daemons, and this process's own Spark JVM (where the bench runs ingest and
    the replay). The bench's Python process itself is left out: it only holds
    the records it is about to send.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.peak = 0
        self.at_peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-memory")

    def sample(self) -> dict[str, int]:
        """Resident bytes now, per part of the stack."""
        from warehouse.ops import ingest_ctl, streams
        from warehouse.ops.stack import process, services

        parts: dict[str, int] = {}
        for svc in services.services(self.settings):
            pids = [pid for pid in svc.live_pids().values() if pid is not None]
            parts[svc.name] = sum(process.group_rss_bytes(pid) for pid in pids)
        ingest_pid = ingest_ctl.daemon(self.settings).pid()
        parts["ingest"] = process.group_rss_bytes(ingest_pid) if ingest_pid else 0
        parts["view streams"] = sum(
            process.group_rss_bytes(s.pid) for s in streams.known(self.settings) if s.pid
        )
        parts["bench spark"] = process.descendants_rss_bytes(os.getpid())
        return parts

    def _run(self) -> None:
        while not self._stop.is_set():
            parts = self.sample()
            if sum(parts.values()) > self.peak:
                self.peak, self.at_peak = sum(parts.values()), parts
            self._stop.wait(1.0)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class Bench:
    settings: Settings
    sizes: Sizes
    report: Report
    say: Callable[[str], None] = print
    run_id: str = field(default_factory=lambda: f"{int(time.time())}")

    # -- producer --------------------------------------------------------------------------
    def producer(self) -> tuple[dict[int, int], dict[int, int], int]:
        """regauge's producer and a bare loop over the same records, chunk by chunk.

        Returns the topic's end offsets before and after, and how many records
        the contract accepts (all of them: clean generator traffic).
        """
        from confluent_kafka import Producer

        from spark_jobs import generator, producer
        from warehouse.ops.stack import services

        # The baseline's own topic, shaped like the real one, so the lake never sees it.
        services.ensure_topic(self.settings, BENCH_TOPIC)
        before = _end_offsets(self.settings)
        ours = bare = 0.0
        sent = valid = 0
        seed = int(self.run_id) % 10**9
        for n, size in enumerate(_chunks(self.sizes.events, self.sizes.chunk)):
            # Generating is not producing: only the sends are timed.
            records = generator.records(seed + n, size)
            valid += sum(1 for r in records if r.expect == generator.VALID)
            run = producer.produce_run(self.settings, seed + n, records)
            if not run.summary.ok:
                raise RuntimeError(f"the producer failed: {run.summary.errors[:3]}")
            ours += run.summary.seconds
            sent += run.summary.produced
            # A producer per chunk, as produce_run makes one per call: both pay the
            # same connection and idempotence handshake.
            started = time.monotonic()
            baseline = Producer(producer.producer_config(self.settings))
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
            self.say(f"  producer: {sent:,} of {self.sizes.events:,} sent")
        after = _end_offsets(self.settings)
        f, b = self.report.figures, self.report.baselines
        f["producer_events_per_s"] = sent / ours
        b["producer_baseline_events_per_s"] = sent / bare
        f["producer_vs_baseline"] = f["producer_events_per_s"] / b["producer_baseline_events_per_s"]
        self.say(
            f"producer: {f['producer_events_per_s']:,.0f} events/s; bare confluent-kafka loop "
            f"{b['producer_baseline_events_per_s']:,.0f} events/s"
        )
        return before, after, valid

    # -- ingest ----------------------------------------------------------------------------
    def bare_consumer(self, before: dict[int, int], after: dict[int, int]) -> None:
        """A confluent-kafka consumer reading the same records and doing nothing with them."""
        from confluent_kafka import Consumer, TopicPartition

        from warehouse.base import registry

        consumer = Consumer(
            {
                "bootstrap.servers": self.settings.kafka_bootstrap,
                "group.id": f"regauge-bench-{self.run_id}",
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
        self.report.baselines["ingest_baseline_events_per_s"] = want / seconds

    def ingest(self, spark: Any, before: dict[int, int], after: dict[int, int], valid: int) -> None:
        """Ingest as in production (both queries, processing-time trigger) through the backlog."""
        from pyspark.sql import functions as F

        from warehouse.base import registry
        from warehouse.ops import ingest_ctl, pipeline

        batches: list[Batch] = []
        listener = _batch_listener(batches)
        spark.streams.addListener(listener)
        stop = threading.Event()
        failure: list[BaseException] = []

        def work() -> None:
            try:
                pipeline.run_ingest(
                    spark,
                    self.settings,
                    stop,
                    status_file=ingest_ctl.daemon(self.settings).status_file,
                )
            except BaseException as exc:
                failure.append(exc)
                stop.set()

        worker = threading.Thread(target=work, name="bench-ingest")
        worker.start()
        want = sum(after[p] - before[p] for p in after)
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
        # The figures count only if every record landed exactly where the contract says.
        ranges = F.lit(False)
        for p in after:
            ranges = ranges | (
                (F.col("partition") == p)
                & (F.col("offset") >= before[p])
                & (F.col("offset") < after[p])
            )
        read = spark.read.format("delta").load
        in_bronze = read(registry.BRONZE_EVENTS.path(self.settings)).where(ranges).count()
        in_silver = read(registry.SILVER_EVENTS.path(self.settings)).where(ranges).count()
        if (in_bronze, in_silver) != (want, valid):
            raise RuntimeError(
                f"ingest landed {in_bronze:,} in bronze and {in_silver:,} in silver; "
                f"expected {want:,} and {valid:,}"
            )
        rate, p95_bronze, p95_silver = sustained(batches, want)
        f = self.report.figures
        f["ingest_events_per_s"] = rate
        f["ingest_batch_p95_s_bronze"] = p95_bronze
        f["ingest_batch_p95_s_silver"] = p95_silver
        f["ingest_vs_baseline"] = rate / self.report.baselines["ingest_baseline_events_per_s"]
        self.report.notes["ingest"] = (
            f"{want:,} records, {sum(1 for b in batches if b.rows)} micro-batches with rows, "
            f"at most {self.settings.ingest_max_records_per_batch:,} records per bronze batch"
        )
        self.say(
            f"ingest: {rate:,.0f} events/s (p95 batch: bronze {p95_bronze:.1f} s, silver "
            f"{p95_silver:.1f} s); bare consumer "
            f"{self.report.baselines['ingest_baseline_events_per_s']:,.0f} events/s"
        )

    # -- replay ----------------------------------------------------------------------------
    def replay(self, spark: Any) -> None:
        """Every view's code over all of silver into scratch tables; DuckDB does v1 alone."""
        from spark_jobs import views
        from spark_jobs.views import runner

        scratch = self.settings.state_dir / "bench" / "replay"
        shutil.rmtree(scratch, ignore_errors=True)
        version = runner.silver_version(spark, self.settings)
        events = runner.read_silver(spark, self.settings, version).count()
        seconds: dict[str, float] = {}
        for (name, v), view in sorted(views.discover().items()):
            started = time.monotonic()
            (
                runner.gold_rows(view, runner.read_silver(spark, self.settings, version))
                .write.format("delta")
                .mode("overwrite")
                .save(str(scratch / f"{name}_v{v}"))
            )
            seconds[f"{name}_v{v}"] = time.monotonic() - started
            self.say(f"  replay {name}_v{v}: {events:,} events in {seconds[f'{name}_v{v}']:.1f} s")
        duck = self._duckdb(scratch, version)
        total = sum(seconds.values())
        f, b = self.report.figures, self.report.baselines
        f["replay_events"] = events
        f["replay_events_per_s"] = events / total
        for name, s in seconds.items():
            f[f"replay_s_{name}"] = s
        b["replay_duckdb_s"] = duck
        b["replay_duckdb_events_per_s"] = events / duck
        f["replay_vs_duckdb_time"] = seconds["revenue_hourly_v1"] / duck
        self.say(
            f"replay: {events:,} events through {len(seconds)} views in {total:.1f} s "
            f"({f['replay_events_per_s']:,.0f} events/s); revenue_hourly v1 alone "
            f"{seconds['revenue_hourly_v1']:.1f} s, DuckDB {duck:.2f} s"
        )

    def _duckdb(self, scratch: Path, version: int) -> float:
        """DuckDB's revenue_hourly v1 over the same silver snapshot, written as Delta too;
        its answer must equal Spark's, or the comparison means nothing."""
        import duckdb
        from deltalake import DeltaTable, write_deltalake

        from warehouse.base import registry

        started = time.monotonic()
        silver = DeltaTable(registry.SILVER_EVENTS.path(self.settings), version=version)
        con = duckdb.connect()
        con.register("dataset", silver.to_pyarrow_dataset())
        answer = con.sql(
            "SELECT date_trunc('hour', event_time AT TIME ZONE 'UTC') AS window_start, "
            "date_trunc('hour', event_time AT TIME ZONE 'UTC') + INTERVAL 1 HOUR AS window_end, "
            "currency, count(*) AS orders, CAST(sum(total) AS DECIMAL(18, 2)) AS revenue "
            "FROM dataset WHERE event_type = 'order_placed' GROUP BY ALL"
        ).to_arrow_table()
        write_deltalake(str(scratch / "duckdb_revenue_hourly_v1"), answer, mode="overwrite")
        seconds = time.monotonic() - started
        con.register("answer", answer)
        con.register(
            "spark_answer", DeltaTable(str(scratch / "revenue_hourly_v1")).to_pyarrow_dataset()
        )
        differ = con.execute(
            "SELECT count(*) FROM ("
            "(SELECT window_start, currency, orders, revenue FROM answer "
            " EXCEPT ALL SELECT timezone('UTC', window_start), currency, orders, revenue "
            " FROM spark_answer) UNION ALL "
            "(SELECT timezone('UTC', window_start), currency, orders, revenue FROM spark_answer "
            " EXCEPT ALL SELECT window_start, currency, orders, revenue FROM answer))"
        ).fetchone()
        if differ is None or differ[0] != 0:
            raise RuntimeError(
                f"DuckDB and Spark disagree on revenue_hourly v1 in {differ} rows: the replay "
                "comparison would compare different answers"
            )
        return seconds

    # -- freshness -------------------------------------------------------------------------
    def ensure_serving(self) -> None:
        """A live revenue_hourly version with its stream, and ingest running, as in production."""
        from warehouse.ops import airflow_client, ingest_ctl, streams
        from warehouse.sql import versions

        if not any(v.live for v in versions.versions(self.settings, PROBE_VIEW)):
            self.say(f"  no live {PROBE_VIEW} version: building v1 through regauge_reprocess")
            airflow_client.Client(self.settings).run(
                "regauge_reprocess", {"view": PROBE_VIEW, "version": 1}
            )
        ingest_ctl.start(self.settings, None)
        for line in streams.ensure(self.settings):
            self.say(f"  {line}")

    def freshness(self) -> None:
        """Probe orders sent every few seconds under steady load; each one's time until
        Trino shows its window through lakehouse.serving.revenue_hourly."""
        from spark_jobs import generator, producer
        from warehouse.ops.stack import process
        from warehouse.sql import serving, trino_client

        base = self._free_probe_base()
        sql = (
            f"SELECT DISTINCT window_start FROM {serving.trino_name(PROBE_VIEW)} "
            "WHERE window_start >= ? AND window_start < ?"
        )
        span = [base, base + timedelta(hours=100)]

        def visible() -> set[int]:
            rows = trino_client.query(self.settings, sql, span).rows
            return {int((_utc(r[0]) - base).total_seconds() // 3600) for r in rows}

        # The streams may still be catching up with the ingest phase; the first
        # probe, unmeasured, waits for that.
        self._probe(base, 0)
        if not process.wait_until(lambda: 0 in visible(), 900):
            raise RuntimeError("the warm-up probe never became visible in 15 min")
        load = generator.records(
            int(self.run_id) % 10**9 + 500,
            int(self.sizes.load_rate * (self.sizes.freshness_s + 15)),
        )
        loader = threading.Thread(
            target=lambda: producer.produce_run(self.settings, 0, load, rate=self.sizes.load_rate),
            name="bench-load",
            daemon=True,
        )
        loader.start()
        sent: dict[int, float] = {}
        seen: dict[int, float] = {}
        k = 1
        end = time.monotonic() + self.sizes.freshness_s
        next_probe = time.monotonic()
        while time.monotonic() < end or (set(sent) - set(seen) and time.monotonic() < end + 120):
            now = time.monotonic()
            if now >= next_probe and now < end and k < 100:
                sent[k] = self._probe(base, k)
                k += 1
                next_probe = now + self.sizes.probe_every_s
            found = visible()
            at = time.monotonic()
            for j in found:
                if j in sent and j not in seen:
                    seen[j] = at
            time.sleep(POLL_S)
        loader.join(self.sizes.freshness_s + 120)
        lags = [seen[j] - sent[j] for j in sorted(seen)]
        if not lags:
            raise RuntimeError("no probe became visible through Trino within 2 minutes")
        f = self.report.figures
        f["freshness_p50_s"] = percentile(lags, 50)
        f["freshness_p95_s"] = percentile(lags, 95)
        f["freshness_probes"] = len(sent)
        f["freshness_never_seen"] = len(set(sent) - set(seen))
        self.report.baselines["trigger_interval_s"] = _seconds(self.settings.trigger_interval)
        self.report.notes["freshness"] = (
            f"{len(sent)} probes, one every {self.sizes.probe_every_s:g} s, under "
            f"{self.sizes.load_rate:,.0f} events/s of load; Trino polled every {POLL_S:g} s"
        )
        self.say(
            f"freshness: p50 {f['freshness_p50_s']:.1f} s, p95 {f['freshness_p95_s']:.1f} s "
            f"({len(lags)} of {len(sent)} probes seen); trigger interval "
            f"{self.settings.trigger_interval}"
        )

    def _probe(self, base: datetime, k: int) -> float:
        from confluent_kafka import Producer

        from spark_jobs import producer
        from warehouse.base import registry

        send = Producer({**producer.producer_config(self.settings), "linger.ms": 0})
        event = probe_event(self.run_id, k, base + timedelta(hours=k))
        at = time.monotonic()
        send.produce(registry.TOPIC, key=PROBE_CUSTOMER, value=json.dumps(event))
        if send.flush(30):
            raise RuntimeError("a freshness probe was not acknowledged within 30 s")
        return at

    def _free_probe_base(self) -> datetime:
        """A stretch of 100 probe hours no earlier run used."""
        from warehouse.base import registry
        from warehouse.sql import trino_client

        used = {
            _utc(r[0])
            for r in trino_client.query(
                self.settings,
                "SELECT DISTINCT date_trunc('hour', event_time) FROM "
                f"{registry.SILVER_EVENTS.trino_name} WHERE customer_id = ?",
                [PROBE_CUSTOMER],
            ).rows
        }
        base = probe_base(datetime.now(UTC))
        for _ in range(87):
            hours = {base + timedelta(hours=h) for h in range(100)}
            if not hours & used:
                return base
            base = PROBE_YEAR + timedelta(hours=(base - PROBE_YEAR).total_seconds() // 3600 + 100)
            if base.year > PROBE_YEAR.year:
                base = PROBE_YEAR
        raise RuntimeError(f"every stretch of {PROBE_YEAR.year} has probes; run `make clean`")

    # -- serving queries -------------------------------------------------------------------
    def queries(self) -> None:
        from warehouse.sql import serving

        runs = self.sizes.queries
        one = query_latency(self.settings, "SELECT 1", runs)
        view = query_latency(
            self.settings,
            f"SELECT * FROM {serving.trino_name(PROBE_VIEW)} WHERE currency = 'EUR' "
            "ORDER BY window_start DESC LIMIT 24",
            runs,
        )
        f, b = self.report.figures, self.report.baselines
        f["serving_query_p50_ms"] = percentile(view, 50)
        f["serving_query_p95_ms"] = percentile(view, 95)
        b["select1_p50_ms"] = percentile(one, 50)
        b["select1_p95_ms"] = percentile(one, 95)
        self.say(
            f"serving query: p50 {f['serving_query_p50_ms']:.0f} ms, p95 "
            f"{f['serving_query_p95_ms']:.0f} ms; SELECT 1 p50 {b['select1_p50_ms']:.0f} ms"
        )


def _batch_listener(batches: list[Batch]) -> Any:
    """A StreamingQueryListener that collects every ingest micro-batch and knows when
    bronze has read up to given offsets and silver has found nothing new since.

    Made inside a function so this module imports without PySpark (its pure
    parts are tested without a JVM).
    """
    from pyspark.sql.streaming import StreamingQueryListener

    from spark_jobs import ingest

    class Listener(StreamingQueryListener):
        def __init__(self) -> None:
            self.names: dict[str, str] = {}
            self.bronze_end: dict[int, int] = {}
            self.bronze_done_at = 0.0
            self.silver_idle_at = 0.0

        def onQueryStarted(self, event: Any) -> None:
            self.names[str(event.id)] = event.name

        def onQueryProgress(self, event: Any) -> None:
            p = json.loads(event.progress.json)
            started = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            seconds = (p.get("durationMs") or {}).get("triggerExecution", 0) / 1000
            rows = int(p.get("numInputRows") or 0)
            batches.append(Batch(p.get("name") or "?", started, seconds, rows))
            if p.get("name") == "bronze":
                source = (p.get("sources") or [{}])[0]
                end = ingest.kafka_offsets(source, "endOffset")
                self.bronze_end = {int(part): o for part, o in end.items()} or self.bronze_end
                if rows:
                    self.bronze_done_at = started + seconds
            elif p.get("name") == "silver" and not rows:
                self.silver_idle_at = started

        def onQueryIdle(self, event: Any) -> None:
            if self.names.get(str(event.id)) == "silver":
                self.silver_idle_at = time.time()

        def onQueryTerminated(self, event: Any) -> None:
            pass

        def caught_up(self, after: dict[int, int]) -> bool:
            reached = all(self.bronze_end.get(p, -1) >= o for p, o in after.items())
            return reached and self.silver_idle_at > self.bronze_done_at + 2.0

    return Listener()


def _end_offsets(settings: Settings) -> dict[int, int]:
    """The event topic's next offset per partition."""
    from warehouse.ops import audit

    return {p: high for p, (_, high) in audit.kafka_watermarks(settings).items()}


def _utc(moment: datetime) -> datetime:
    """Trino's timestamps come back with or without a zone; the bench compares in UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _chunks(total: int, size: int) -> list[int]:
    return [min(size, total - start) for start in range(0, total, size)]


def _seconds(interval: str) -> float:
    """'1 second', '500 milliseconds', '2 minutes' -> seconds."""
    number, unit = interval.split()
    scale = {"milli": 0.001, "second": 1.0, "minute": 60.0}
    return float(number) * next(v for k, v in scale.items() if unit.startswith(k))


def _stop_jvm(spark: Any) -> None:
    """Stop Spark and its JVM: `spark.stop()` alone leaves the JVM's heap resident,
    which the later phases would count as the stack's memory."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:
        proc.terminate()
        proc.wait(60)
    SparkContext._gateway = None
    SparkContext._jvm = None


# -- the whole run ------------------------------------------------------------------------
def machine(spark: Any | None) -> dict[str, Any]:
    """Cores, memory and the versions a reader needs to compare runs."""
    from importlib import metadata

    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    found: dict[str, Any] = {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
    }
    for pkg in ("pyspark", "delta-spark", "confluent-kafka", "trino", "duckdb", "deltalake"):
        try:
            found[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            found[pkg] = None
    if spark is not None:
        found["java"] = spark.sparkContext._jvm.java.lang.System.getProperty("java.version")
    return found


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def run(settings: Settings, sizes: Sizes, out_dir: Path, doc: Path | None = DOC) -> Report:
    """Every phase, then the JSON, the chart and (unless doc is None) BENCHMARKS.md."""
    from spark_jobs.session import build_session
    from warehouse.ops import airflow_client, ingest_ctl, pipeline, streams
    from warehouse.sql import trino_client

    report = Report(sizes=asdict(sizes), started_at=datetime.now(UTC).isoformat(timespec="seconds"))
    began = time.monotonic()
    ingest_was_running = ingest_ctl.daemon(settings).pid() is not None
    running_streams = [(s.view, s.version) for s in streams.known(settings) if s.pid]
    airflow = airflow_client.Client(settings)
    # The watchdog restarts live versions' streams every minute, and the hourly audit
    # reads every layer: either would take cores from the phase being measured.
    was_paused: dict[str, bool] = {}
    for dag in QUIET_DAGS:
        airflow.wait_for_dag(dag)
        was_paused[dag] = airflow.is_paused(dag)
        airflow.pause(dag, True)
    bench = Bench(settings, sizes, report)
    try:
        with PeakMemory(settings) as memory:
            ingest_ctl.stop(settings)
            for view, version in running_streams:
                streams.stop(settings, view, version)
            # The event log is what to profile a slow phase with (Spark's history UI reads it).
            events_dir = settings.state_dir / "bench" / "spark-events"
            events_dir.mkdir(parents=True, exist_ok=True)
            spark = build_session(
                "regauge-bench",
                settings,
                extra_conf={
                    "spark.eventLog.enabled": "true",
                    "spark.eventLog.dir": str(events_dir),
                    # Plain JSON lines, so jq or a few lines of Python can read them.
                    "spark.eventLog.compress": "false",
                },
            )
            spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "1000")
            report.machine = machine(spark)
            report.machine["trino"] = trino_client.scalar(
                settings, "SELECT node_version FROM system.runtime.nodes LIMIT 1"
            )
            print(
                "bench: settling what ingest had not copied yet, so the phases measure only "
                "the bench's records"
            )
            pipeline.ingest_once(spark, settings)
            print(f"bench: producer ({sizes.events:,} records)")
            before, after, valid = bench.producer()
            print("bench: ingest (a bare consumer first, then Kafka -> bronze -> silver)")
            bench.bare_consumer(before, after)
            bench.ingest(spark, before, after, valid)
            print("bench: replay of every view from silver, and DuckDB")
            bench.replay(spark)
            _stop_jvm(spark)
            print("bench: freshness through Trino under steady load")
            bench.ensure_serving()
            bench.freshness()
            print(f"bench: serving query latency ({sizes.queries} runs)")
            bench.queries()
        report.figures["stack_peak_gib"] = memory.peak / 2**30
        parts = ", ".join(
            f"{name} {n / 2**30:.1f}" for name, n in sorted(memory.at_peak.items()) if n
        )
        report.notes["memory"] = f"at the peak, GiB: {parts}"
        print(f"bench: stack peak resident memory {memory.peak / 2**30:.1f} GiB ({parts})")
    finally:
        for dag, paused in was_paused.items():
            airflow.pause(dag, paused)
        if not ingest_was_running:
            ingest_ctl.stop(settings)
        for s in streams.known(settings):
            if s.pid and (s.view, s.version) not in running_streams:
                streams.stop(settings, s.view, s.version)
        for view, version in running_streams:
            streams.start(settings, view, version)
    report.seconds = time.monotonic() - began
    save(report, out_dir, doc)
    return report


def save(report: Report, out_dir: Path, doc: Path | None) -> tuple[Path, Path]:
    """The run's JSON and chart in out_dir; its table appended to doc."""
    from warehouse.tools.bench import chart as bench_chart

    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = report.started_at.replace(":", "").replace("-", "")[:15]
    data = out_dir / f"bench-{stamp}.json"
    data.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    chart = out_dir / f"bench-{stamp}.png"
    bench_chart.draw(report, chart)
    if doc is not None:
        with doc.open("a") as out:
            out.write("\n" + section(report, data, chart, doc.parent) + "\n")
    print(f"bench: wrote {data} and {chart}" + (f"; appended to {doc}" if doc else ""))
    return data, chart


def section(report: Report, data: Path, chart: Path, relative_to: Path) -> str:
    """One run's part of docs/BENCHMARKS.md."""
    m = report.machine
    versions = ", ".join(
        f"{k} {m[k]}"
        for k in (
            "pyspark",
            "delta-spark",
            "java",
            "trino",
            "confluent-kafka",
            "duckdb",
            "deltalake",
            "python",
        )
        if m.get(k)
    )
    missed = [n for n, _, _, _, ok in verdicts(report.figures) if ok is False]

    def rel(p: Path) -> str:
        try:
            return str(p.resolve().relative_to(relative_to.resolve()))
        except ValueError:
            return str(p)

    notes = "".join(f"- {k}: {v}\n" for k, v in sorted(report.notes.items()))
    return (
        f"## Run of {report.started_at}\n\n"
        f"{m.get('cores')} cores ({m.get('cpu')}), {m.get('memory_gib')} GiB; {versions}. "
        f"{report.sizes.get('events', 0):,} events; the run took {report.seconds / 60:.1f} min. "
        f"Data: [{rel(data)}]({rel(data)}); chart: ![bench]({rel(chart)})\n\n"
        f"{table(report)}\n\n"
        + notes
        + (f"\nMissed: {', '.join(missed)}.\n" if missed else "\nEvery target met.\n")
    )
