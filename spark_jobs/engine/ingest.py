"""Running Kafka -> bronze -> silver: long-lived and supervised, or once until caught up.

One streaming query does it all: each micro-batch of Kafka records is appended
to bronze, then settled into silver, the ledger and the quarantine
(`silver.process_batch`), every write under the batch's transaction id. Two
queries (Kafka -> bronze, then bronze -> silver) cost a second stream, a Delta
source over bronze and a bronze commit's wait for silver's next trigger; one
query reads each record once and commits both layers in the same batch.

A query that dies (the broker went away, a transient file-system error) is
restarted with backoff from its checkpoint, which makes the restart exact. The
one failure never retried is a gap in the log: Kafka no longer has records
bronze has not copied, and carrying on would make history silently incomplete.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from spark_jobs.engine import bronze, contract, faults, forgotten, lake, ledger_index, silver
from spark_jobs.engine import session as session_mod
from warehouse import sources
from warehouse.base import metrics, registry
from warehouse.base.jsonfile import replace_json
from warehouse.base.settings import Settings
from warehouse.base.text import first_line

log = logging.getLogger(__name__)

QUERY = registry.INGEST_QUERY  # the shop's query; source S's is `ingest.S`


def source_names() -> list[str]:
    """Every declared source (`warehouse.sources`): ingest runs one query for each."""
    return sorted(sources.discover())


def tables(source: str = registry.SHOP_SOURCE) -> tuple[registry.Table, ...]:
    """The tables ingest writes for `source` (its callers publish them to Trino)."""
    src = registry.source_tables(source)
    return (src.bronze, src.silver, src.quarantine, src.ledger)


TABLES = tables()  # the shop's
MAX_BACKOFF_S = 30.0


class DataLossError(RuntimeError):
    """The log has a gap bronze cannot fill: stop, say so, never skip."""


def is_data_loss(error: str) -> bool:
    text = error.lower()
    return "kafka_data_loss" in text or "data may have been lost" in text


def is_disk_full(error: str) -> bool:
    return "no space left on device" in error.lower()


def error_text(exc: BaseException | None) -> str:
    """An exception's message followed by its causes' messages.

    A gap found while planning a batch surfaces as the query's own error; one
    found inside a task arrives wrapped (TASK_WRITE_FAILED), and only a cause
    says data was lost. PySpark keeps the converted JVM cause in `_cause`.
    """
    parts: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(str(exc))
        exc = getattr(exc, "_cause", None) or exc.__cause__
    return "\n".join(parts)


DATA_LOSS_HELP = (
    "Kafka no longer holds records that bronze has not copied yet (retention expired, or "
    "the topic was deleted and recreated), so bronze would have a gap and ingest stopped. "
    "Bronze keeps everything it already has. Either restore the records to the topic, or, "
    "if the loss is accepted, run `regauge ingest-once --accept-data-loss` once: it "
    "copies what Kafka still has, skipping the gap, and logs it; then start ingest again."
)


# -- progress --------------------------------------------------------------------------
def kafka_offsets(source: dict[str, Any], field: str) -> dict[str, int]:
    """A Kafka source's offsets per partition from its progress (field: startOffset,
    endOffset or latestOffset); empty for any other source."""
    raw = source.get(field)
    if not raw:
        return {}
    parsed = json.loads(raw) if isinstance(raw, str) else raw
    if not all(isinstance(t, dict) for t in parsed.values()):
        return {}  # not a Kafka source (a Delta source's offset is one position)
    return {p: int(o) for topic in parsed.values() for p, o in topic.items()}


def kafka_lag(source: dict[str, Any]) -> dict[str, int]:
    """Records behind the newest offset, per partition, from a Kafka source's progress."""
    end, latest = kafka_offsets(source, "endOffset"), kafka_offsets(source, "latestOffset")
    return {p: max(0, latest[p] - end.get(p, 0)) for p in sorted(latest, key=int)}


def describe_progress(progress: dict[str, Any]) -> str:
    """One log line per micro-batch: rows in, rates, duration and what is still behind."""
    sources = progress.get("sources") or [{}]
    line = (
        f"{progress.get('name')} batch {progress.get('batchId')}: "
        f"{progress.get('numInputRows', 0):,} rows in, "
        f"{progress.get('processedRowsPerSecond') or 0:,.0f} rows/s processed, "
        f"{(progress.get('durationMs') or {}).get('triggerExecution', 0) / 1000:.1f} s"
    )
    lag = kafka_lag(sources[0])
    if lag:
        line += "; lag " + " ".join(f"p{p}={n:,}" for p, n in lag.items())
    return line


def record_progress(progress: dict[str, Any]) -> None:
    """A finished micro-batch into the metrics: its duration and rows, and for a
    Kafka source how far each partition is behind (`warehouse.base.metrics`)."""
    name = progress.get("name") or "?"
    seconds = (progress.get("durationMs") or {}).get("triggerExecution", 0) / 1000
    metrics.MICROBATCH.labels(name).observe(seconds)
    metrics.MICROBATCH_ROWS.labels(name).inc(progress.get("numInputRows") or 0)
    source = registry.ingested_source(name)
    if source is None:
        return  # a view's query: its source is silver, not Kafka
    for partition, behind in kafka_lag((progress.get("sources") or [{}])[0]).items():
        metrics.INGEST_BEHIND.labels(source, partition).set(behind)


class BatchMetrics(StreamingQueryListener):
    """Records every micro-batch of its session's queries into the metrics."""

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        record_progress(json.loads(event.progress.json))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


class ProgressLog(StreamingQueryListener):
    """Logs every micro-batch, keeps the latest progress of each query in a file,
    and records it into the metrics."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.latest: dict[str, Any] = {}
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        log.info("%s query started (id %s)", event.name, event.id)
        self._save(event.name, {"id": str(event.id), "state": "running", "started_at": _now()})

    def onQueryProgress(self, event: Any) -> None:
        progress = json.loads(event.progress.json)
        record_progress(progress)
        if progress.get("numInputRows", 0):
            log.info("%s", describe_progress(progress))
        sources = progress.get("sources") or [{}]
        self._save(
            progress.get("name") or "?",
            {
                "state": "running",
                "batch": progress.get("batchId"),
                "rows_in": progress.get("numInputRows", 0),
                "rows_per_s": progress.get("processedRowsPerSecond") or 0,
                "lag": kafka_lag(sources[0]),
                # The next offset to read, per partition (a Kafka source only).
                "copied": kafka_offsets(sources[0], "endOffset"),
                "at": progress.get("timestamp"),
            },
        )

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        name = next((n for n, s in self.latest.items() if s.get("id") == str(event.id)), None)
        if event.exception and lake.StreamStopping.__name__ in event.exception:
            # A batch that began during a stop: it wrote nothing (lake.BatchGuard).
            log.info("query %s stopped before its next batch", event.id)
        elif event.exception:
            log.error("query %s stopped with an error: %s", event.id, event.exception)
        if name:
            self._save(name, {"state": "stopped", "error": event.exception})

    def _save(self, name: str, fields: dict[str, Any]) -> None:
        with self._lock:
            self.latest[name] = {**self.latest.get(name, {}), **fields}
            replace_json(self.path, self.latest)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- the query ------------------------------------------------------------------------
def prepare(spark: SparkSession, settings: Settings, source: str = registry.SHOP_SOURCE) -> None:
    """Create the tables ingest writes for `source`, and the list of forgotten
    positions it reads."""
    src = registry.source_tables(source)
    path = src.bronze.path(settings)
    lake.ensure_table(spark, path, bronze.BRONZE_SCHEMA, bronze.BRONZE_PROPERTIES)
    lake.ensure_properties(spark, path, bronze.BRONZE_PROPERTIES)
    silver.ensure_tables(spark, settings, source)
    forgotten.ensure_table(spark, settings, src)


START_FILE = "regauge_start_offsets.json"


def kafka_positions(text: str, topic: str = registry.TOPIC) -> dict[int, int] | None:
    """The event topic's offset per partition in a checkpoint's offsets file (a
    version line, the batch's metadata, then one line per source), or in the
    startingOffsets a query began with ("earliest": none before the first)."""
    if text.strip() == "earliest":
        return {}
    for line in text.splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict) and isinstance(parsed.get(topic), dict):
            return {int(p): max(int(o), 0) for p, o in parsed[topic].items()}
    return None


def batch_range(
    spark: SparkSession, checkpoint: str, batch_id: int, topic: str = registry.TOPIC
) -> tuple[dict[int, int], dict[int, int]] | None:
    """The offsets [start, end) per partition that batch `batch_id` read, from the
    checkpoint: its own offsets file and the one before it (batch 0: where the
    query began). None if the checkpoint does not say."""
    end = kafka_positions(lake.read_text(spark, f"{checkpoint}/offsets/{batch_id}") or "", topic)
    before = (
        f"{checkpoint}/offsets/{batch_id - 1}" if batch_id > 0 else f"{checkpoint}/{START_FILE}"
    )
    start = kafka_positions(lake.read_text(spark, before) or "", topic)
    return None if end is None or start is None else (start, end)


def finished_at(
    spark: SparkSession, settings: Settings, source: str = registry.SHOP_SOURCE
) -> dict[int, int] | None:
    """The next offset per partition after the last batch `source`'s ingest query
    finished (Spark wrote both its offsets and its commit file: bronze, the ledger
    and silver hold it), or None when the checkpoint has finished none."""
    src = registry.source_tables(source)
    checkpoint = src.ingest_checkpoint(settings)
    batches = [int(n) for n in lake.list_names(spark, f"{checkpoint}/offsets") if n.isdigit()]
    if not batches or lake.read_text(spark, f"{checkpoint}/commits/{max(batches)}") is None:
        return None
    text = lake.read_text(spark, f"{checkpoint}/offsets/{max(batches)}") or ""
    return kafka_positions(text, src.topic)


def span_size(start: dict[int, int], end: dict[int, int]) -> int | None:
    """How many offsets [start, end) spans; None when a partition of `end` is not in
    `start` (a query's first batch from "earliest", a partition added to the topic):
    where it began is not written down."""
    if not end.keys() <= start.keys():
        return None
    return sum(stop - start[p] for p, stop in end.items())


# Fewer records than this in a batch: planned without generated code. Profiled in
# the bench's freshness phase (200 events/s, batches of about 1,000 to 6,000
# records), the JIT compiler took as much of the view host's CPU as Spark's
# tasks, compiling each batch's classes.
INTERPRETED_BELOW = 50_000


def process_batch(
    spark: SparkSession,
    settings: Settings,
    records: DataFrame,
    batch_id: int,
    txn_app: str,
    forgotten: DataFrame | None,
    checkpoint: str,
    index: ledger_index.LedgerIndex | None = None,
    plan: contract.Plan = contract.PLAN,
    silver_writer: lake.Committer | None = None,
    bronze_writer: lake.Committer | None = None,
    quarantine_writer: lake.Committer | None = None,
) -> silver.BatchResult:
    """One micro-batch of Kafka records into bronze, then into silver, the ledger and
    the quarantine. Retried after a crash, it skips what it committed (txn ids).
    `index`: the query's ledger index; `plan`: the contract the lake runs
    (`silver.process_batch`); `silver_writer`: see `silver.process_checked`;
    `bronze_writer`: bronze's, kept open as silver's, to append a live batch
    with delta-rs (`lake.append_live`), as the ledger's is (`index.writer`);
    `quarantine_writer`: the quarantine's, the same (`silver.process_checked`)."""
    src = plan.tables
    result = silver.BatchResult(batch_id)
    span = batch_range(spark, checkpoint, batch_id, src.topic)
    if span is not None and bronze.holds_batch(
        spark, settings, txn_app, batch_id, src, bronze_writer
    ):
        # A retry after bronze's append: settle what bronze holds of the batch,
        # not what Kafka still holds (its retention may have passed meanwhile).
        rows = bronze.between(spark, settings, *span, src)
        log.info("batch %d is in bronze already: settling it from there", batch_id)
    else:
        rows = bronze.ignoring_forgotten(bronze.to_bronze_rows(records), forgotten)
    # A live batch's plans are evaluated without generated code, as the view
    # queries' are (session.INTERPRETED_CONF); a catch-up's keep it. Both the
    # query's session and the batch's (Spark's clone of it) plan this batch.
    # The size is taken from the batch's offset range, which costs no Spark job;
    # counting the rows costs two and a read, so only where the range cannot say.
    size = None if span is None else span_size(*span)
    if size is None:
        size = rows.count()
    small = {} if size >= INTERPRETED_BELOW else session_mod.INTERPRETED_CONF
    with lake.session_conf(spark, small), lake.session_conf(rows.sparkSession, small):
        # Validated and materialised once: bronze's append takes its own columns of
        # the same rows, so Kafka is read once and the batch is held once (one job
        # and a copy fewer than bronze's rows and silver's validation apart).
        with result.step("validate"):  # with Kafka's read
            checked = contract.validate(rows, plan).localCheckpoint(eager=True)
        try:
            names = bronze.BRONZE_SCHEMA.names
            landed = checked.select(*names)
            # By delta-rs if the batch is small, as the ledger's append and silver's
            # are (`silver.process_checked`): the batch comes to the driver once for
            # bronze's rows, the tally and the ledger's.
            live = bronze_writer if size <= silver.MAX_APPENDED_BY_DELTA_RS else None
            collected = None
            with result.step("bronze"):  # skipped on a retry
                if live is not None:
                    collected = silver.collect_live(checked, *names)
                arrow = None if collected is None else collected.select(names)
                bronze.append(landed, settings, txn_app, batch_id, src, live, arrow)
            return silver.process_checked(
                spark,
                settings,
                checked,
                batch_id,
                txn_app,
                index,
                plan,
                silver_writer,
                result,
                collected,
                quarantine_writer,
            )
        finally:
            checked.unpersist()


def _retire_two_query_checkpoints(spark: SparkSession, settings: Settings) -> None:
    """Bronze's and silver's checkpoints from before ingest was one query: once the
    new checkpoint exists, `silver.recover` has settled what they had written."""
    for table in (registry.BRONZE_EVENTS, registry.SILVER_EVENTS):
        old = table.checkpoint(settings)
        if lake.exists(spark, old):
            log.warning(
                "removing %s: ingest is one query now, checkpointed at %s",
                old,
                registry.ingest_checkpoint(settings),
            )
            lake.delete_tree(spark, old)


def start(
    spark: SparkSession,
    settings: Settings,
    *,
    available_now: bool = False,
    trigger: str | None = None,
    accept_data_loss: bool = False,
    source: str = registry.SHOP_SOURCE,
) -> StreamingQuery:
    """Start `source`'s ingest query: continuous, or until caught up (`available_now`).

    Without a checkpoint, it first settles whatever bronze holds (`silver.recover`)
    and reads Kafka from after bronze's last copied offsets: nothing twice.
    """
    src = registry.source_tables(source)
    checkpoint = src.ingest_checkpoint(settings)
    txn_app = silver.app_id(spark, settings, source)
    # Read once: `regauge sources deploy` stops ingest to change it.
    plan = silver.deployed_plan(spark, settings, source)
    log.info("ingest validates by %s contract version %d", plan.source.name, plan.contract_version)
    silver.recover(spark, settings, txn_app, plan)
    if source == registry.SHOP_SOURCE:
        _retire_two_query_checkpoints(spark, settings)
    forgotten = bronze.forgotten_positions(spark, settings, src)
    starting = bronze.starting_offsets(spark, settings, src)
    # Built now, so the first batch does not wait for it; it follows the ledger from here.
    # Kept open between batches, as the view streams keep gold's: on a local lake a
    # live batch appends to bronze, the ledger and the quarantine, and appends and
    # merges its winners into silver, with delta-rs (`lake.Committer` says why not
    # on S3).
    local = settings.lake_is_local
    silver_writer, bronze_writer, ledger_writer, quarantine_writer = (
        lake.Committer(*settings.delta_rs(table.path(settings))) if local else None
        for table in (src.silver, src.bronze, src.ledger, src.quarantine)
    )
    index = ledger_index.LedgerIndex(src.ledger.path(settings), ledger_writer)
    index.rebuild(spark, "ingest starting")
    if not lake.checkpoint_has_progress(spark, checkpoint):
        # Where batch 0 begins, for its retry (`batch_range`); Spark keeps it in a
        # form of its own.
        lake.write_text(spark, f"{checkpoint}/{START_FILE}", starting + "\n")

    def each_batch(records: DataFrame, batch_id: int) -> None:
        result = process_batch(
            spark,
            settings,
            records,
            batch_id,
            txn_app,
            forgotten,
            checkpoint,
            index,
            plan,
            silver_writer,
            bronze_writer,
            quarantine_writer,
        )
        log.info("%s", result.record().describe())
        faults.maybe_crash("silver_after_commit", batch_id)

    guard = lake.BatchGuard()
    writer = (
        bronze.read_kafka(
            spark, settings, accept_data_loss=accept_data_loss, starting=starting, src=src
        )
        .writeStream.queryName(src.ingest_query)
        .foreachBatch(guard.wrap(each_batch))
        .option("checkpointLocation", checkpoint)
    )
    return lake.start_stream(writer, available_now, trigger or settings.trigger_interval, guard)


def run_once(
    spark: SparkSession,
    settings: Settings,
    *,
    accept_data_loss: bool = False,
    source: str | None = None,
) -> None:
    """Copy everything new from Kafka to bronze and settle it into silver: `source`'s,
    or every declared source's, one after another.

    With `accept_data_loss`, a gap in the log is skipped (and Spark logs it)
    instead of stopping: the operator's decision after a DataLossError.
    """
    for name in [source] if source else source_names():
        _run_once(spark, settings, name, accept_data_loss)


def _run_once(spark: SparkSession, settings: Settings, source: str, accept_data_loss: bool) -> None:
    prepare(spark, settings, source)
    if accept_data_loss:
        log.warning("accepting data loss: records Kafka no longer has will be skipped")
    query = start(
        spark, settings, available_now=True, accept_data_loss=accept_data_loss, source=source
    )
    try:
        query.awaitTermination()
        error = error_text(query.exception())
    except StreamingQueryException as exc:
        error = error_text(exc)
    finally:
        lake.stop_stream(query)  # it has ended: drops its guard
    if error:
        if is_data_loss(error):
            raise DataLossError(DATA_LOSS_HELP)
        raise RuntimeError(f"ingest of {source} failed: {error}")


def counts(
    spark: SparkSession, settings: Settings, source: str = registry.SHOP_SOURCE
) -> dict[str, int]:
    """Rows in each table ingest writes for `source`, by the table's key."""
    read = spark.read.format("delta").load
    return {t.key: read(t.path(settings)).count() for t in tables(source)}


def run(
    spark: SparkSession,
    settings: Settings,
    stop: threading.Event,
    *,
    trigger: str | None = None,
    status_file: Path,
) -> None:
    """Run one ingest query per declared source until `stop` is set, restarting each
    that dies (except on data loss, which stops them all).

    Their progress goes to `status_file`, which `regauge ingest status` reads.
    """
    trigger = trigger or settings.trigger_interval
    listener = ProgressLog(status_file)
    names = source_names()
    queries: dict[str, StreamingQuery | None] = dict.fromkeys(names)
    query_of = {n: registry.source_tables(n).ingest_query for n in names}
    failures = dict.fromkeys(query_of.values(), 0)
    retry_at = dict.fromkeys(names, 0.0)
    # Inside the try: the view host runs this again after a failed start, in the
    # same application, and must not gather one listener per try.
    spark.streams.addListener(listener)
    try:
        log.info(
            "ingest running: %s -> bronze -> silver, every %s",
            ", ".join(registry.source_tables(n).topic for n in names),
            trigger,
        )
        while not stop.is_set():
            for name in names:
                queries[name], retry_at[name] = _tend(
                    spark,
                    settings,
                    name,
                    query_of[name],
                    queries[name],
                    retry_at[name],
                    failures,
                    trigger,
                )
            stop.wait(1.0)
    finally:
        for query in queries.values():
            if query is not None and query.isActive:
                stop_after_batch(query)
        spark.streams.removeListener(listener)


def _tend(
    spark: SparkSession,
    settings: Settings,
    source: str,
    name: str,
    query: StreamingQuery | None,
    retry_at: float,
    failures: dict[str, int],
    trigger: str,
) -> tuple[StreamingQuery | None, float]:
    """One look at `source`'s query (named `name`): start it when due, note it died."""
    if query is not None and not query.isActive:
        error = error_text(query.exception()) or "stopped"
        lake.stop_stream(query)  # drops its guard
        query = None
        retry_at = _retry_at(settings, name, "stopped", error, failures)
    if query is None and time.monotonic() >= retry_at:
        try:
            # Its tables first, here: a full disk or a lost mount while they are made
            # is retried like any start that failed, and ends no other source's query.
            prepare(spark, settings, source)
            query = start(spark, settings, trigger=trigger, source=source)
        except Exception as exc:
            # Starting reads Kafka's partitions and may settle a recovery: a
            # broker or a disk that is away now must not end the daemon.
            retry_at = _retry_at(settings, name, "could not start", error_text(exc), failures)
    # A query that has run a while without dying resets its backoff.
    if query is not None and query.isActive and query.lastProgress is not None:
        failures[name] = 0
    return query, retry_at


def stop_after_batch(query: StreamingQuery) -> None:
    """Stop ingest's query once its running batch has settled into silver, so that no
    stop leaves bronze ahead of silver (the audit would find records silver lacks
    until the next start); after `lake.STOP_WAIT_S`, whatever it is doing."""
    name = query.name or QUERY
    log.info("stopping %s after its running batch (waiting up to %.0f s)", name, lake.STOP_WAIT_S)
    if lake.stop_stream(query):
        log.info("%s stopped between batches", name)


def _retry_at(
    settings: Settings, name: str, what: str, error: str, failures: dict[str, int]
) -> float:
    """When to try a query again that stopped or could not start; a gap in the log stops all."""
    if is_data_loss(error):
        raise DataLossError(DATA_LOSS_HELP)
    failures[name] += 1
    delay = backoff_s(failures[name])
    if is_disk_full(error):
        # Nothing is lost: the retry reads the batch again from the checkpoint,
        # and its commits that did land are skipped (txn ids).
        log.error(
            "%s %s: the lake's disk is full (%s). Nothing is lost; it retries in %.0f s "
            "and resumes once space is freed",
            name,
            what,
            settings.lake_root,
            delay,
        )
    else:
        log.warning("%s %s (%s); retrying in %.0f s", name, what, first_line(error), delay)
    return time.monotonic() + delay


def backoff_s(failures: int) -> float:
    """How long to wait before restarting a query that died `failures` times running."""
    return min(MAX_BACKOFF_S, 2.0**failures)
