"""The main loops of the processes regauge runs for a long time: ingest or a view
version in the foreground, and the view host that runs ingest and every live
version's stream in one Spark application (`regauge ingest run`,
`regauge views run`, `regauge streams host`).

Each builds one Spark application, runs its queries until SIGTERM or SIGINT,
and stops them between micro-batches. `streams` starts the host detached,
with pid and status files; `ingest start` and `streams start` say what the
host should run, and it runs it with the same code as the foreground commands.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from pyspark import InheritableThread
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_jobs import views as views_mod
from spark_jobs.engine import gold_writes, ingest, runner
from spark_jobs.engine.session import build_session
from spark_jobs.views.base import View
from warehouse import sources
from warehouse.base import metrics
from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.base.text import first_line
from warehouse.ops import exporter, ingest_ctl, pipeline, sessions, streams, writers

log = logging.getLogger(__name__)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _contracts_accepted(what: str) -> bool:
    """Ingest validates by the declared contracts: never by one that would read an
    accepted record differently, or that nobody accepted (`regauge sources check`)."""
    wrong, _ = sources.check()
    for line in wrong:
        log.error("%s will not start: %s", what, line)
    return not wrong


def run_ingest(settings: Settings, trigger: str | None) -> int:
    """Kafka -> bronze -> silver until stopped; exit 3 on a gap in the log, 2 if the
    sources' contracts fail their check."""
    if not _contracts_accepted("ingest"):
        return 2
    stop = _stop_on_signals()
    lock = writers.ingest(settings, "`regauge ingest run`").acquire()
    spark = build_session("regauge-ingest", settings)
    try:
        pipeline.run_ingest(
            spark, settings, stop, trigger=trigger, status_file=ingest_ctl.status_file(settings)
        )
    except ingest.DataLossError as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 3
    finally:
        spark.stop()
        lock.release()
    log.info("ingest stopped")
    return 0


def run_view(
    settings: Settings,
    view: View,
    *,
    mode: str,
    source: str,
    trigger: str | None = None,
    until_caught_up: bool = False,
) -> int:
    """One view version: recompute once (batch), or replay then stream, or stream on."""
    table = gold_writes.gold_table(view)
    lock = writers.view(settings, view.name, view.version, f"`regauge views run --mode {mode}`")
    lock.acquire()
    spark = build_session(f"regauge-view-{view.table_name}", settings)
    try:
        if mode == "batch":
            # A replay without the stream: a stream started later continues after
            # this version, not from an older checkpoint, whose batches a view that
            # folds its changes into gold (View.sums) would count a second time.
            version = pipeline.replay(spark, settings, view, source=source)
            print(
                f"{table.trino_name}: recomputed from {source} ({version.describe()}); "
                "a stream started later continues after it"
            )
            return 0
        if mode == "replay":
            after = pipeline.replay(spark, settings, view, source=source)
            print(
                f"{table.trino_name}: replayed {source} (up to {after.describe()}); continuing live"
            )
        elif not runner.can_stream(spark, settings, view):
            print(
                f"regauge: {table.trino_name} has no stream yet; start it with --mode replay",
                file=sys.stderr,
            )
            return 2
        query = pipeline.stream(
            spark, settings, view, trigger=trigger, available_now=until_caught_up
        )
        stop = _stop_on_signals()
        while query.isActive and not stop.is_set():
            stop.wait(1.0)
        runner.release(query)
        if query.exception() is not None:
            print(
                f"regauge: {table.trino_name} stream failed: {query.exception()}", file=sys.stderr
            )
            return 1
        print(f"{table.trino_name}: stream stopped")
        return 0
    finally:
        spark.stop()
        lock.release()


class _Supervised:
    """Something the host runs while it is wanted, retried after a growing backoff if it fails."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failures = 0
        self.retry_at = 0.0
        self.error: str | None = None
        self.since: datetime | None = None
        # Held while it is wanted here, running or waiting to retry.
        self.writer: writers.Writer | None = None

    def failed(self, error: str) -> None:
        """Record why it is not running; retry after a backoff that grows with each failure."""
        self.error = first_line(error)
        self.failures += 1
        delay = ingest.backoff_s(self.failures)
        self.retry_at = time.monotonic() + delay
        log.warning("%s: not running (%s); trying again in %.0f s", self.name, self.error, delay)

    def started(self) -> None:
        self.error, self.since = None, datetime.now(UTC)
        log.info("%s: started", self.name)

    def release_writer(self) -> None:
        if self.writer is not None:
            self.writer.release()
            self.writer = None

    def failed_state(self) -> dict[str, Any]:
        if self.error is not None:
            # None: it waits for an operator, not for a backoff.
            retry_in = (
                round(max(0.0, self.retry_at - time.monotonic()), 1)
                if self.retry_at != math.inf
                else None
            )
            return {"state": "failed", "error": self.error, "retry_in_s": retry_in}
        return {"state": "starting"}


class _Hosted(_Supervised):
    """One wanted view stream in the host: its query, or why it is not running."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.query: StreamingQuery | None = None
        # Its session's listener, which records each batch into the metrics.
        self.listening: tuple[SparkSession, ingest.BatchMetrics] | None = None

    def listen(self, session: SparkSession) -> None:
        self.unlisten()
        listener = ingest.BatchMetrics()
        session.streams.addListener(listener)
        self.listening = (session, listener)

    def unlisten(self) -> None:
        """Each start makes a session: without this, each restart would leave one
        listener (a Python callback the JVM holds) behind."""
        if self.listening is not None:
            session, listener = self.listening
            session.streams.removeListener(listener)
            self.listening = None

    def release(self) -> None:
        """Stop its query (between micro-batches) and let another writer have its table."""
        if self.query is not None:
            was_active = self.query.isActive
            if was_active:
                log.info("%s: stopping its stream", self.name)
            runner.release(self.query)
            if was_active:
                log.info("%s: stream stopped", self.name)
        self.query = None
        self.unlisten()
        self.release_writer()

    @property
    def active(self) -> bool:
        return self.query is not None and self.query.isActive

    def state(self) -> dict[str, Any]:
        if self.query is not None and self.query.isActive:
            progress: dict[str, Any] = self.query.lastProgress or {}
            return {
                "state": "running",
                "since": self.since,
                "batch": progress.get("batchId"),
                "batch_at": progress.get("timestamp"),
                "read_through": read_through(progress),
            }
        return self.failed_state()


# Delta's offset index for "every file of this version read" (DeltaSourceOffset's
# END_INDEX is Long.MaxValue - 100); -1 (BASE_INDEX) means "none of it yet".
_END_INDEX = 2**63 - 101


def read_through(progress: Any) -> dict[str, int]:
    """The newest version of each Delta table a query has read all of, by the table's
    path, from its last progress: what an automatic rollout's freshness gate compares
    with the table's newest version (issue 69)."""
    found: dict[str, int] = {}
    for source in progress.get("sources") or []:
        description = str(source.get("description") or "")
        end = source.get("endOffset")
        if isinstance(end, str):
            try:
                end = json.loads(end)
            except ValueError:
                continue
        if not description.startswith("DeltaSource[") or not isinstance(end, dict):
            continue
        if "reservoirVersion" not in end:
            continue
        path = description[len("DeltaSource[") :].rstrip("]").removeprefix("file:")
        version = int(end["reservoirVersion"])
        found[path] = version if int(end.get("index", -1)) >= _END_INDEX else version - 1
    return found


# Ingest's scheduler pool (infra/spark/fairscheduler.xml): every view waits for
# what ingest writes, so when the two cores are short its tasks go first.
INGEST_POOL = "ingest"
FAIR_SCHEDULER_FILE = REPO_ROOT / "infra" / "spark" / "fairscheduler.xml"


class _HostedIngest(_Supervised):
    """Ingest (Kafka -> bronze -> silver) as a thread of the host, in its own session
    and scheduler pool. Its own supervisor (`ingest.run`) restarts a query that
    dies; the host restarts the thread if the supervisor itself gives up."""

    def __init__(self) -> None:
        super().__init__("ingest")
        self.thread: InheritableThread | None = None
        self.trigger: str | None = None
        # The `wanted` marker's mtime when last looked at: a new `ingest start`.
        self.asked: int | None = None
        self._stop = threading.Event()
        self._outcome: str | None = None
        # A gap in the log: never retried on its own (see check).
        self._data_loss = False

    @property
    def active(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, spark: SparkSession, settings: Settings, trigger: str | None) -> None:
        try:
            if self.writer is None:
                self.writer = writers.ingest(settings, "the view host").acquire()
        except writers.WriterBusy as exc:
            self.failed(str(exc))
            return
        self._stop, self._outcome, self.trigger = threading.Event(), None, trigger
        self._data_loss = False
        session = spark.newSession()
        # PySpark's thread: its JVM thread is released with it.
        self.thread = InheritableThread(
            self._run, args=(session, settings), name="regauge-ingest", daemon=True
        )
        self.thread.start()
        self.started()

    def _run(self, spark: SparkSession, settings: Settings) -> None:
        # The queries' threads inherit the pool from the thread that starts them.
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", INGEST_POOL)
        try:
            pipeline.run_ingest(
                spark,
                settings,
                self._stop,
                trigger=self.trigger,
                status_file=ingest_ctl.status_file(settings),
            )
        except ingest.DataLossError as exc:
            self._data_loss, self._outcome = True, str(exc)
        except Exception as exc:
            log.error("ingest stopped: %s", exc)
            self._outcome = f"{type(exc).__name__}: {exc}"
        else:
            self._outcome = "stopped"

    def check(self) -> None:
        """If the thread ended without being asked to, record why and back off; after
        a gap in the log, stop for good and let go of the lake, so the operator's
        `ingest-once --accept-data-loss` can run, until the next `ingest start`."""
        if self.thread is None or self.thread.is_alive():
            return
        self.thread = None
        if not self._data_loss:
            self.failed(self._outcome or "stopped")
            return
        log.error("ingest stopped: %s", self._outcome)
        # Whole, not cut to a line's length: its last sentence says what to do.
        self.error, self.retry_at = self._outcome or "a gap in the log", math.inf
        self.release_writer()

    def asked_again(self, asked: int | None) -> None:
        """A new `ingest start` (the marker rewritten): try at once, whatever failed before."""
        if asked != self.asked:
            self.asked, self.retry_at, self.failures = asked, 0.0, 0

    def release(self) -> None:
        if self.thread is not None:
            log.info("ingest: stopping its queries")
            self._stop.set()
            self.thread.join()
            self.thread = None
            log.info("ingest: stopped")
        self.release_writer()

    def state(self) -> dict[str, Any]:
        # `asked`: which `ingest start` this answers (a failure before it is old news).
        if self.active:
            return {
                "state": "running",
                "since": self.since,
                "trigger": self.trigger,
                "asked": self.asked,
            }
        return {**self.failed_state(), "asked": self.asked}


def run_view_host(settings: Settings) -> int:
    """Run ingest and every wanted view stream in one Spark application until stopped.

    `ingest start|stop` and `streams start|stop` say what is wanted. A query
    that dies is restarted after a backoff (its error in the status file
    meanwhile); the others run on.
    """
    if not _contracts_accepted("the view host"):
        return 2
    stop = _stop_on_signals()
    daemon = streams.host(settings)
    # Fair scheduling between pools: ingest's weighs most, and each view query
    # has one of its own (see _start_hosted), so one version's long batch
    # shares the cores with the others' short ones.
    # Airflow's replay and validate tasks run their Spark work in this application
    # too, through Spark Connect (warehouse.ops.sessions), in the default pool.
    connect_conf, connect_status = sessions.serve(settings)
    spark = build_session(
        "regauge-host",
        settings,
        extra_conf={
            "spark.driver.memory": settings.view_host_memory,
            "spark.scheduler.mode": "FAIR",
            "spark.scheduler.allocation.file": FAIR_SCHEDULER_FILE.as_uri(),
            # PySpark's DataFrame debugging wraps every Column call to record its
            # Python call site for errors: several Py4J round trips each, in the
            # live streams' few hundred a batch (a quarter of their Python CPU in
            # stop 103's spike). Static: read when the host's session starts.
            "spark.python.sql.dataFrameDebugging.enabled": "false",
            **connect_conf,
        },
    )
    hosted: dict[str, _Hosted] = {}
    ingesting = _HostedIngest()
    since = datetime.now(UTC)
    endpoint: dict[str, str | None] = {"spark_ui": spark.sparkContext.uiWebUrl, **connect_status}
    try:
        endpoint["metrics"] = exporter.serve(settings, stop)
        log.info("metrics at %s", endpoint["metrics"])
    except OSError as exc:
        # The pipeline matters more than its figures: run on, and say why there are none.
        endpoint["metrics_error"] = str(exc)
        log.error("no metrics endpoint: %s", exc)

    def save(state: str) -> None:
        daemon.write_status(
            state=state,
            pid=os.getpid(),
            since=since,
            ingest=ingesting.state() if ingesting.active or ingesting.error else None,
            queries={name: h.state() for name, h in sorted(hosted.items())},
            **endpoint,
        )
        if ingesting.active or ingesting.error:
            metrics.QUERY_RUNNING.labels("ingest").set(int(ingesting.active))
        else:  # not wanted: no figure, rather than a last "running"
            metrics.QUERY_RUNNING.remove("ingest")
        for name, h in hosted.items():
            metrics.QUERY_RUNNING.labels(name).set(int(h.active))

    log.info("view host running (pid %d); wanted streams in %s", os.getpid(), daemon.base)
    try:
        save("running")
        while not stop.is_set():
            _supervise_ingest(spark, settings, ingesting)
            wanted = {streams.query_name(v, n): (v, n) for v, n in streams.wanted(settings)}
            for name in [n for n in hosted if n not in wanted]:
                hosted.pop(name).release()
                _forget_figures(name)
            for name, (view_name, version) in wanted.items():
                h = hosted.setdefault(name, _Hosted(name))
                if h.active:
                    # A query that has made progress since its start resets its backoff.
                    if h.query.lastProgress is not None:  # type: ignore[union-attr]
                        h.failures = 0
                    continue
                if h.query is not None:
                    error = str(h.query.exception() or "stopped")
                    runner.release(h.query)
                    h.query = None
                    h.failed(error)
                if time.monotonic() >= h.retry_at:
                    _start_hosted(spark, settings, h, view_name, version)
            save("running")
            stop.wait(streams.POLL_S)
    finally:
        # All at once: each stop waits for its query's running batch, and together
        # they must end within the SIGTERM budget (daemon.STOP_WAIT_S).
        stopping: list[_Hosted | _HostedIngest] = [ingesting, *hosted.values()]
        with ThreadPoolExecutor(len(stopping), thread_name_prefix="stop") as pool:
            list(pool.map(lambda part: part.release(), stopping))
        hosted.clear()
        save("stopped")
        spark.stop()
    log.info("view host stopped")
    return 0


def _forget_figures(name: str) -> None:
    """A query no longer hosted leaves the metrics: a stale freshness would read as live."""
    metrics.QUERY_RUNNING.remove(name)
    parsed = streams.parse_name(name)
    if parsed is not None:
        labels = (parsed[0], str(parsed[1]))
        for gauge in (metrics.VIEW_FRESHNESS, metrics.VIEW_BATCH_AT, metrics.RESTATEMENTS):
            gauge.remove(*labels)
    metrics.MICROBATCH.remove(name)
    metrics.MICROBATCH_ROWS.remove(name)


# A thread that has run this long without its supervisor giving up resets its backoff.
_SETTLED_S = 60.0


def _supervise_ingest(spark: SparkSession, settings: Settings, ingesting: _HostedIngest) -> None:
    """Start, stop or restart ingest as its `wanted` marker says."""
    want, trigger = ingest_ctl.wanted(settings)
    if not want:
        if ingesting.active or ingesting.writer is not None:
            ingesting.release()
        ingesting.error = None
        return
    ingesting.check()
    ingesting.asked_again(ingest_ctl.asked_at(settings))
    if ingesting.active:
        if ingesting.since and (datetime.now(UTC) - ingesting.since).total_seconds() > _SETTLED_S:
            ingesting.failures = 0
    elif time.monotonic() >= ingesting.retry_at:
        ingesting.start(spark, settings, trigger)


def _start_hosted(
    spark: SparkSession, settings: Settings, h: _Hosted, view_name: str, version: int
) -> None:
    """Start one version's query in a session and a scheduler pool of its own."""
    try:
        view = views_mod.get(view_name, version)
        if h.writer is None:
            h.writer = writers.view(settings, view_name, version, "the view host").acquire()
        if not runner.can_stream(spark, settings, view):
            raise RuntimeError(f"{h.name} has never been replayed; build it first")
        # Each micro-batch tags its gold commits through a session setting, which
        # must not leak into another query's commits.
        session = runner.live_session(spark)
        # A session of its own, so one listener each: its batches into the metrics.
        h.listen(session)
        # The query's thread inherits the pool from the thread that starts it.
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", h.name)
        try:
            h.query = pipeline.stream(session, settings, view)
        finally:
            spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)  # type: ignore[arg-type]
    except Exception as exc:
        h.query = None
        h.failed(f"{type(exc).__name__}: {exc}")
        return
    h.started()
