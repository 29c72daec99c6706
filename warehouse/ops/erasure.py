"""`regauge forget customer ID`: one customer out of every place regauge keeps data
(docs/contract.md §8), with the steps logged in `control.erasures`.

The pipeline stands still meanwhile: ingest and every view stream are stopped
and their writer locks held (the watchdog waits for the erasure lock), because
removing history under a running stream would leave it reading versions that
no longer exist. In order:

1. ingest catches up once, so every record Kafka holds is in bronze;
2. the positions to forget are found and kept (`silver.shop_events_forgotten`),
   and the final windows they touched are recorded as `erasure` restatements;
3. the rows go from silver, the ledger, the quarantine, bronze and the
   restatements; the customer from `reference.customers`;
4. the lake's tables lose their history (VACUUM with no retention, a
   checkpoint, the log before it deleted); ingest's checkpoint (Kafka offsets)
   stays, and its transaction ids live on in each table's Delta checkpoint;
5. every view table in the lake (each version's, and archived ones) is
   replayed from silver's final version and compacted with its tag on top;
   dbt's staging tables are deleted, then every dbt model is rebuilt with a
   full refresh, and the marts compacted; each live
   version's change topic starts over, so no compacted record of the
   customer outlives the erasure;
6. the streams and ingest that ran before start again (the streams from the
   replays' positions); Trino's metadata caches are flushed.

Each step completed is recorded as the erasure's `phase` in `control.erasures`
(`erasures.PHASES`). What ran is kept in `.state/erasure-paused.json` until it
runs again. An erasure that fails before step 3 starts it again at once. One
that fails later leaves it stopped, and is resumed after its last completed
step: by a rerun under the same request id (the DAG's retry: its run id), or
by `regauge forget resume ERASURE_ID`, which needs no customer id, since every
step after the deletion works on the whole lake. Resumed, it starts again what
ran before its first attempt. An erasure that ends also closes the failed ones
that had changed the lake: it did what was left of theirs.

Kafka's own copy of `shop.events` stays until its retention deletes it; ingest
and replays from Kafka skip the forgotten positions until then.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from warehouse import sources
from warehouse.base import registry, sqlnames
from warehouse.base.settings import Settings
from warehouse.ops import airflow_client, dbt_runner, ingest_ctl, pipeline, streams, writers
from warehouse.ops.stack import kafka
from warehouse.ops.stack.airflow import Airflow
from warehouse.sql import catalog, erasures, trino_client, versions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.views.base import View

log = logging.getLogger(__name__)

ERASED = "<erased>"
FORGET_DAG = "regauge_forget"
# Airflow's tables that held a forget run's id: its conf, its rendered task
# environment, and the audit log's record of the trigger request.
AIRFLOW_TABLES = ("dag_run", "task_instance", "rendered_task_instance_fields", "log")
# A run is kept this long after it succeeded, so whoever waits on it (the demo, a
# person in the UI) sees it end before it is deleted.
SCRUB_AFTER_S = 120.0


@dataclass
class Report:
    erasure_id: str
    positions: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    rebuilt: list[str] = field(default_factory=list)
    compacted: list[str] = field(default_factory=list)
    # The last step completed (erasures.PHASES), as recorded.
    phase: str = "registered"
    # The step an earlier attempt had completed, when this one resumed after it.
    resumed_after: str | None = None
    # Other failed erasures this one finished (`erasures.supersede`).
    superseded: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        if self.resumed_after == "done":
            return [f"erasure {self.erasure_id}: done already; nothing to resume"]
        if self.resumed_after in (None, "registered"):
            out = [f"erasure {self.erasure_id}: {self.positions} Kafka records forgotten"]
        else:  # counted by the attempt that found them, kept in control.erasures
            out = [f"erasure {self.erasure_id}: resumed after its step {self.resumed_after!r}"]
        out += [f"  {table}: {n} rows removed" for table, n in sorted(self.removed.items())]
        out += [f"  rebuilt from silver: {', '.join(self.rebuilt) or 'no view tables'}"]
        out += [f"  history removed from {len(self.compacted)} tables"]
        out += [f"  also finished failed erasure {e}" for e in self.superseded]
        return out


@dataclass
class Paused:
    """What ran before the erasure stopped it, to start again when it ends.

    Kept in `.state/erasure-paused.json` until then: a retry after a failure
    would otherwise find everything stopped and start nothing again (no personal
    data in it, only what ran).
    """

    ingest: bool = False
    trigger: str | None = None
    streams: list[tuple[str, int]] = field(default_factory=list)
    # The lake has begun to change: a failure from here leaves the pipeline stopped
    # (streams would fail on a half-erased, compacted silver) until a rerun ends it.
    touched: bool = False


def paused_file(settings: Settings) -> Path:
    return settings.state_dir / "erasure-paused.json"


def left_stopped(settings: Settings) -> Paused | None:
    """What an erasure that failed part way left stopped (None: nothing)."""
    try:
        kept = json.loads(paused_file(settings).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return Paused(
        bool(kept.get("ingest")),
        kept.get("trigger"),
        [(str(v), int(n)) for v, n in kept.get("streams", [])],
    )


def _keep(settings: Settings, paused: Paused) -> None:
    kept = {"ingest": paused.ingest, "trigger": paused.trigger, "streams": paused.streams}
    draft = paused_file(settings).with_suffix(".new")
    draft.write_text(json.dumps(kept) + "\n")
    draft.replace(paused_file(settings))


def _start_again(settings: Settings, paused: Paused) -> None:
    for view, version in paused.streams:
        log.info(streams.start(settings, view, version))
    if paused.ingest:
        ingest_ctl.start(settings, paused.trigger)
    paused_file(settings).unlink(missing_ok=True)


@contextlib.contextmanager
def quiesced(settings: Settings, holder: str) -> Iterator[Paused]:
    """Stop ingest and every stream, hold their writer locks, and start again what ran:
    when the erasure ends, or when it fails before the lake changed (`touched`).

    What ran is kept (`paused_file`), so that an erasure run again after a failure
    part way (the DAG's retry, or the same command again) starts again what ran
    before the first one, not the nothing it finds.
    """
    # A dbt run, maintenance or a reprocess already running could bring the customer
    # back if it went on beside the erasure: it finishes first.
    lock = writers.erasure(settings, holder).acquire(wait_s=writers.ERASURE_WAITS_S)
    paused = left_stopped(settings) or Paused()
    if paused.ingest or paused.streams:
        log.info(
            "an earlier erasure left ingest%s and %d streams stopped; this one starts them "
            "again when it ends",
            "" if paused.ingest else " (not wanted)",
            len(paused.streams),
        )
    held: list[writers.Writer] = []
    ok = False
    try:
        wanted, trigger = ingest_ctl.wanted(settings)
        if wanted:
            paused.ingest, paused.trigger = True, trigger
        for s in streams.known(settings):
            if s.state in ("running", "starting") and (s.view, s.version) not in paused.streams:
                paused.streams.append((s.view, s.version))
        # Before anything stops: a failure from here on must find it.
        _keep(settings, paused)
        if ingest_ctl.stop(settings):
            log.info("ingest stopped for the erasure")
        for s in streams.known(settings):
            log.info(streams.stop(settings, s.view, s.version))
        held.append(writers.ingest(settings, holder).acquire())
        for v in versions.versions(settings):
            held.append(writers.view(settings, v.view_name, v.version, holder).acquire())
        yield paused
        ok = True
    finally:
        for w in held:
            w.release()
        lock.release()
        if ok or not paused.touched:
            try:
                _start_again(settings, paused)
            except Exception:
                if ok:
                    raise
                # The erasure's own error is the one to see; this one is logged.
                log.exception("could not start again what the failed erasure stopped")
        else:
            log.error(
                "the erasure failed after the lake began to change: ingest%s and %d "
                "streams stay stopped (kept in %s). Resume it (`regauge forget resume "
                "ERASURE_ID`, or the DAG's retry): it finishes the work and starts them again",
                "" if paused.ingest else " (not wanted before)",
                len(paused.streams),
                paused_file(settings),
            )


def forget_customer(
    settings: Settings,
    customer_id: str,
    reason: str,
    request_id: str | None = None,
    spark: SparkSession | None = None,
) -> Report:
    """Forget `customer_id`. Under a `request_id` seen before, the erasure of that
    request resumes after its last completed step (or reports that it is done).

    `spark`: a session to run in, left running (a caller that holds one, such as
    the tests, saves a JVM's start: about 20 CPU-s on 2 cores); else it starts
    its own and stops it."""
    sqlnames.check_customer_id(customer_id)
    reason = sqlnames.check_reason(reason, customer_id)
    if request_id is not None:
        sqlnames.check_request_id(request_id)
    started = erasures.start(settings, reason, getpass.getuser(), request_id)
    return _run(settings, started, customer_id, spark)


def resume(settings: Settings, erasure_id: str) -> Report:
    """`regauge forget resume ERASURE_ID`: finish an erasure that failed after the lake
    began to change, with no customer id (what is left works on the whole lake).
    ValueError for an erasure that failed before: what it stopped runs again, and it
    is run again whole, with the id."""
    try:
        started = erasures.resume(settings, erasure_id)
    except KeyError:
        raise ValueError(f"no erasure {erasure_id} in control.erasures") from None
    if started.status != "done" and _index(started.phase) < _index(erasures.LAKE_CHANGED):
        erasures.fail(settings, erasure_id, "not resumed: it had not changed the lake")
        raise ValueError(
            f"erasure {erasure_id} failed at its start (after {started.phase!r}), before "
            "the lake changed, and what it stopped runs again: nothing to resume. Run the "
            "erasure again with the customer's id: regauge forget customer -"
        )
    return _run(settings, started, None)


def _index(phase: str) -> int:
    return erasures.PHASES.index(phase)


def _run(
    settings: Settings,
    started: erasures.Started,
    customer_id: str | None,
    given: SparkSession | None = None,
) -> Report:
    erasure_id = started.erasure_id
    report = Report(erasure_id, removed=dict(started.removed), phase=started.phase)
    if started.resumed:
        report.resumed_after = started.phase
        log.info("erasure %s: resuming after its step %r", erasure_id, started.phase)
    else:
        log.info("erasure %s: registered", erasure_id)
    if started.status == "done":
        return report
    try:
        with quiesced(settings, f"`regauge forget` (erasure {erasure_id})") as paused:
            # A failure from a step after the deletion leaves the pipeline stopped.
            paused.touched = _index(report.phase) >= _index(erasures.LAKE_CHANGED)
            if _index(report.phase) < _index("recomputed"):
                with _session(settings, f"regauge-forget-{erasure_id[:8]}", given) as spark:
                    if not paused.touched:
                        assert customer_id is not None, "resume() refuses this erasure"
                        _erase(settings, spark, customer_id, report, paused)
                    dbt: bool | None = _recompute(settings, spark, report)
                _done(settings, report, "recomputed" if dbt else "rebuilt")
            else:
                dbt = None  # resumed: the marts' compaction finds out
            if _index(report.phase) < _index("rebuilt"):
                _rebuild_marts(settings, report)
                _done(settings, report, "rebuilt")
            if _index(report.phase) < _index("compacted"):
                if dbt is not False:
                    _compact_marts(settings, report, given)
                _recreate_view_topics(settings)
                _done(settings, report, "compacted")
        trino_client.flush_lake_cache(settings)
    except BaseException as exc:
        # The error is kept, with the id taken out of it.
        error = str(exc)
        if customer_id is not None:
            error = error.replace(customer_id, ERASED)
        erasures.fail(settings, erasure_id, error)
        if _index(report.phase) >= _index(erasures.LAKE_CHANGED):
            log.error(
                "erasure %s failed after its step %r; resume it: regauge forget resume %s",
                erasure_id,
                report.phase,
                erasure_id,
            )
        raise
    erasures.finish(settings, erasure_id, report.removed)
    report.superseded = erasures.supersede(settings, erasure_id)
    for other in report.superseded:
        log.info("erasure %s: failed erasure %s finished by this one", erasure_id, other)
    return report


def _done(settings: Settings, report: Report, phase: str) -> None:
    """Record `phase` as completed; a test's fault (REGAUGE_ERASURE_FAULT) fails the
    erasure right after it, to show what a rerun resumes and what stays stopped."""
    erasures.advance(settings, report.erasure_id, phase, report.removed)
    report.phase = phase
    if settings.erasure_fault == phase:
        raise RuntimeError(f"fault injected after the erasure's step {phase!r}")


@contextlib.contextmanager
def _session(settings: Settings, name: str, given: SparkSession | None) -> Iterator[SparkSession]:
    """The caller's session, left running, or one of the erasure's own, stopped after."""
    if given is not None:
        yield given
        return
    from spark_jobs.engine.session import build_session

    spark = build_session(name, settings, ui=False, one_shot=True)
    try:
        yield spark
    finally:
        spark.stop()


def _view_tables(spark: SparkSession, root: str) -> list[tuple[View, str]]:
    """(view code, path) of every view version's table under `root`, named
    `<view>_v<N>`, or `<view>_v<N>@<stamp>` once archived."""
    from spark_jobs import views
    from spark_jobs.engine import lake

    codes = views.discover()
    found = []
    for name in lake.list_names(spark, root) if lake.exists(spark, root) else []:
        parsed = streams.parse_name(name.split("@", 1)[0])
        code = codes.get(parsed) if parsed else None
        if code is not None and lake.exists(spark, f"{root}/{name}/_delta_log"):
            found.append((code, f"{root}/{name}"))
    return found


def _erase(
    settings: Settings, spark: SparkSession, customer_id: str, report: Report, paused: Paused
) -> None:
    """Steps 1-3: the customer's rows found, their windows restated, and deleted."""
    from spark_jobs.engine import erasure, inputs

    log.info("erasure %s: catching ingest up with Kafka", report.erasure_id)
    pipeline.ingest_once(spark, settings)
    # Every declared source, by its own subject field (docs/contract.md §8, §10).
    # The shop's positions also drive the views' restatements (they read its silver).
    by_source = {
        registry.source_tables(name): erasure.find(
            spark, settings, customer_id, registry.source_tables(name), source.subject_field
        )
        for name, source in sorted(sources.discover().items())
    }
    found = by_source.pop(registry.SHOP)
    # Both idempotent: a rerun of this erasure before its deletion (a resumed
    # request) finds the same rows, adds no position twice, and restates nothing twice.
    report.positions = erasure.record(spark, settings, found, report.erasure_id)
    for src, theirs in by_source.items():
        report.positions += erasure.record(spark, settings, theirs, report.erasure_id, src)
    for src in (registry.SHOP, *by_source):
        catalog.publish(src.forgotten, settings)
    log.info("erasure %s: %d Kafka records to forget", report.erasure_id, report.positions)

    # Every view table in the lake, registered or not: live or not, a rollback or
    # a new registration can route to it. Archived ones are recomputed too.
    tables = _every_view_table(spark, settings)
    # Each source's silver as it is, and its rows that go; a view reads those of
    # its own sources.
    founds = {registry.SHOP: found, **by_source}
    silvers = {
        src.source: spark.read.format("delta")
        .load(src.silver.path(settings))
        .localCheckpoint(eager=True)
        for src in founds
    }
    goners = {
        src.source: erasure.silver_rows_at(spark, settings, f, src).localCheckpoint(eager=True)
        for src, f in founds.items()
    }
    rows = [
        erasure.erasure_restatements(
            code,
            inputs.union([goners[s] for s in code.sources]),
            inputs.union([silvers[s] for s in code.sources]),
            spark.read.format("delta").load(path),
            customer_id,
        )
        for code, path in tables
    ]
    restated = (
        erasure.record_restatements(spark, settings, inputs.union(rows), report.erasure_id)
        if rows
        else 0
    )
    report.removed["erasure restatements recorded"] = restated
    pipeline.ensure_restatements(spark, settings)
    log.info(
        "erasure %s: %d restatements recorded for %d view tables",
        report.erasure_id,
        restated,
        len(tables),
    )
    _done(settings, report, "found")

    # From here the lake changes: a failure leaves the pipeline stopped (`quiesced`).
    paused.touched = True
    removed = erasure.delete_everywhere(spark, settings, found, customer_id, by_source)
    removed["ops.reference.customers"] = erasures.delete_reference(settings, customer_id)
    report.removed.update(removed)
    log.info(
        "erasure %s: rows deleted: %s; removing the lake's history",
        report.erasure_id,
        ", ".join(f"{table} {n}" for table, n in removed.items()),
    )
    _done(settings, report, "deleted")


def _every_view_table(spark: SparkSession, settings: Settings) -> list[tuple[View, str]]:
    """Every view table in the lake, live ones then archived ones."""
    root = settings.lake_root.rstrip("/")
    return [
        *_view_tables(spark, f"{root}/gold"),
        *_view_tables(spark, f"{root}/_archive/table/gold"),
    ]


def _recompute(settings: Settings, spark: SparkSession, report: Report) -> bool:
    """Steps 4-5 but dbt's, whose staging tables it deletes: the history removed and
    every view table recomputed. Whether the lake holds dbt models to rebuild.
    Needs no customer id: it works on the whole lake (`resume`)."""
    from spark_jobs.engine import erasure, gold_writes, lake, marks, runner

    root = settings.lake_root.rstrip("/")
    live = _view_tables(spark, f"{root}/gold")
    archived = _view_tables(spark, f"{root}/_archive/table/gold")
    # Ingest's checkpoint holds Kafka offsets, which the compaction leaves
    # valid, and its transaction ids live on in each table's Delta checkpoint:
    # so it resumes where it stopped, and skips the forgotten positions (read
    # when it starts again).
    # The lake's tables first: a view is then replayed from silver's final
    # version, the one its tag and its stream's starting point name.
    every_source = [
        t for name in sorted(sources.discover()) for t in registry.source_tables(name).tables
    ]
    lake_tables = {t.key: t for t in (*registry.TABLES.values(), *every_source)}
    report.compacted += erasure.compact_all(spark, [t.path(settings) for t in lake_tables.values()])
    for code, path in live:
        through = pipeline.replay(spark, settings, code)
        with erasure.removing_history(spark, marks.tag(through, "bronze")):
            erasure.compact(spark, path)
        report.compacted.append(path)
        report.rebuilt.append(gold_writes.gold_table(code).trino_name)
    for code, path in archived:
        fresh = runner.read_input(spark, settings, code)
        gold_writes.gold_rows(code, fresh).write.format("delta").mode("overwrite").save(path)
        report.rebuilt.append(path.rsplit("/", 1)[-1] + " (archived)")
    report.compacted += erasure.compact_all(spark, [path for _, path in archived])
    dbt_models = [
        t for t in dbt_runner.lake_tables(spark, settings) if t.schema in registry.DBT_SCHEMAS
    ]
    # dbt's staging tables are not published and only dbt reads them, so they
    # are deleted whole: `dbt run` makes each again with no history, where a
    # compaction would rewrite them first (about 2 s a table on 2 cores).
    staging = [t for t in dbt_models if t.schema == registry.DBT_STAGING_SCHEMA]
    for t in staging:
        lake.delete_tree(spark, t.path(settings))
    if staging:
        log.info(
            "erasure %s: deleted dbt's staging tables (%s); dbt makes them again",
            report.erasure_id,
            ", ".join(t.name for t in staging),
        )
    return bool(dbt_models)


def _rebuild_marts(settings: Settings, report: Report) -> None:
    """dbt's models, rebuilt whole from silver (an incremental model never deletes).

    `run`, not `build`: a data test that failed would skip every model after it,
    which would then keep the customer. The tests run in `regauge_dbt`; here they
    were 20-30 s of the erasure's time on 2 cores."""
    code = dbt_runner.run(settings, ["run", "--full-refresh"])
    if code != 0:
        raise RuntimeError(
            f"dbt run --full-refresh exited {code}: the marts may still hold the customer, "
            "and dbt's staging tables were deleted (a selective dbt run fails until a whole "
            "one makes them); see the dbt log, fix it, and run the erasure again"
        )
    report.rebuilt.append("dbt models (full refresh)")


def _compact_marts(settings: Settings, report: Report, given: SparkSession | None) -> None:
    from spark_jobs.engine import erasure

    with _session(settings, "regauge-forget-compact", given) as spark:
        # Staging was made again from nothing (see _erase): no history to remove.
        models = [
            t.path(settings)
            for t in dbt_runner.lake_tables(spark, settings)
            if t.schema == registry.MARTS_SCHEMA
        ]
        report.compacted += erasure.compact_all(spark, models)


def _recreate_view_topics(settings: Settings) -> None:
    """A compacted topic keeps a key's last record until it is compacted away: start
    every version's topic over, live or not (a rollback or a new stream would serve
    it again, issue 68, B), and a stream publishes its whole table again."""
    every = {(v.view_name, v.version) for v in versions.versions(settings)}
    for view, version in sorted(every | set(kafka.view_topics(settings))):
        for line in kafka.drop_view_topic(settings, view, version):
            log.info(line)


def scrub_airflow_runs(settings: Settings, ended_before_s: float = SCRUB_AFTER_S) -> int:
    """Delete every `regauge_forget` run that succeeded at least `ended_before_s` ago
    from Airflow, since its params hold the id the run erased: the run and its
    task instances (through the REST API), its task logs, and the audit log's
    rows of it; then rewrite those tables (VACUUM FULL), so the deleted rows
    leave PostgreSQL's data files too. Failed runs stay, for their retry.
    Returns how many runs were deleted."""
    import psycopg

    client = airflow_client.Client(settings)
    cutoff = datetime.now(UTC) - timedelta(seconds=ended_before_s)
    done = [
        r
        for r in client.runs(FORGET_DAG)
        if r["state"] == "success"
        and r.get("end_date")
        and datetime.fromisoformat(r["end_date"]) <= cutoff
    ]
    if not done:
        return 0
    logs = Airflow(settings).home / "logs" / f"dag_id={FORGET_DAG}"
    with psycopg.connect(settings.postgres_dsn(settings.airflow_db)) as conn:
        for run in done:
            run_id = str(run["dag_run_id"])
            customer = str((run.get("conf") or {}).get("customer_id") or run_id)
            client.delete_run(FORGET_DAG, run_id)
            shutil.rmtree(logs / f"run_id={run_id}", ignore_errors=True)
            # The trigger request's row has no run id, only the conf in its extra.
            conn.execute(
                "DELETE FROM log WHERE dag_id = %s AND (run_id = %s OR strpos(extra, %s) > 0)",
                [FORGET_DAG, run_id, customer],
            )
            log.info("deleted %s run %s from Airflow", FORGET_DAG, run_id)
    with psycopg.connect(settings.postgres_dsn(settings.airflow_db), autocommit=True) as conn:
        for table in AIRFLOW_TABLES:
            conn.execute(f"VACUUM FULL {table}")
    return len(done)
