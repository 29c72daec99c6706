"""A view version's life: reprocess, validate, go live, roll out, retire.

Each function is one step that Airflow's DAGs run as a task (through the
CLI), and each can be re-run without harm: it looks at the registry first and
does only what is left. The registry (`warehouse.sql.versions`) says who may do
what; this module also moves the lake, the streams and Trino along with it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from warehouse.base import registry
from warehouse.base.settings import Settings
from warehouse.ops import streams, writers
from warehouse.ops.stack import kafka
from warehouse.sql import catalog, serving, versions
from warehouse.sql.versions import VersionError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.views.base import View

log = logging.getLogger(__name__)

# How long a gate may wait out a mismatch while the live stream moves on. A
# replay from Kafka can be ahead of silver until ingest has caught up.
KAFKA_SETTLE_S = 600.0


def view_code(view: str, version: int) -> View:
    """The version's code; an unknown one is refused before anything is registered."""
    from spark_jobs import views

    try:
        return views.get(view, version)
    except KeyError as exc:
        raise VersionError(exc.args[0]) from None


def register(settings: Settings, view: str, version: int, source: str) -> str:
    from spark_jobs.engine import runner

    try:
        runner.check_replay_source(view_code(view, version), source)
    except ValueError as e:
        raise VersionError(str(e)) from None
    how = versions.register(settings, view, version, source)
    return f"{view} v{version}: {how}, building from {source}"


def build(settings: Settings, view: str, version: int, source: str) -> str:
    """Replay all history through the version's code into its table (from scratch,
    so a build killed halfway is simply run again)."""
    from spark_jobs.engine import gold_writes
    from warehouse.ops import pipeline, sessions

    code = view_code(view, version)
    row = versions.get(settings, view, version)
    if row.status != "building":
        raise VersionError(f"{row.label} is {row.status}; register it for a reprocess first")
    # A stream left from an earlier attempt would write into the table being rebuilt.
    log.info(streams.stop(settings, view, version))
    name = f"regauge-build-{code.table_name}"
    with writers.view(settings, view, version, "the reprocess's replay (`versions build`)"):
        # From Kafka, records are validated on the way by the contract's checks,
        # which have not run over Spark Connect.
        own = "a replay from Kafka" if source == "kafka" else None
        with sessions.task_session(settings, name, own_driver=own) as spark:
            through = pipeline.replay(spark, settings, code, source=source)
    # `silver@123`; over several sources `silver shop@123,web@45`.
    at = f"silver@{through}" if through.single is not None else f"silver {through}"
    position = at if source != "kafka" else f"kafka, live from {at}"
    versions.record_position(settings, view, version, position)
    return f"{view} v{version}: replayed all history ({position}) into " + (
        gold_writes.gold_table(code).trino_name
    )


def go_live(settings: Settings, view: str, version: int) -> str:
    """Start the version's stream, which continues right where the replay ended."""
    row = versions.get(settings, view, version)
    if row.status not in ("building", "ready", "serving"):
        raise VersionError(f"{row.label} is {row.status}; its stream is not wanted")
    if row.status == "building" and not row.source_position:
        raise VersionError(f"{row.label} has not been replayed yet")
    return streams.start(settings, view, version)


def validate(settings: Settings, view: str, version: int) -> dict[str, Any]:
    """The gate. A failed gate marks the version failed and stops its stream; the
    current version keeps serving, untouched."""
    from spark_jobs.engine import validate as gate
    from warehouse.ops import sessions

    code = view_code(view, version)
    row = versions.get(settings, view, version)
    if row.status in versions.LIVE:
        return row.validation or {}
    if row.status != "building":
        raise VersionError(f"{row.label} is {row.status}; nothing to validate")
    current = next((v for v in versions.versions(settings, view) if v.status == "serving"), None)
    current_code = view_code(view, current.version) if current is not None else None
    settle = KAFKA_SETTLE_S if (row.source_position or "").startswith("kafka") else 0.0
    name = f"regauge-validate-{code.table_name}"
    try:
        with sessions.task_session(settings, name) as spark:
            report = gate.validate(spark, settings, code, current_code, settle_s=settle)
    except sessions.HostLost as lost:
        # The gate is read-only, and its task is not retried (a failure is a
        # verdict): a host restart is no verdict, so it runs once more.
        log.warning("%s; validating again", lost)
        with sessions.task_session(settings, name) as spark:
            report = gate.validate(spark, settings, code, current_code, settle_s=settle)
    versions.record_validation(settings, view, version, report)
    if not report["passed"]:
        log.error("%s failed validation: %s", row.label, report["summary"])
        log.info(streams.stop(settings, view, version))
    return report


def publish(settings: Settings, view: str, version: int) -> str:
    table = registry.gold_view_table(view, version)
    new = catalog.publish(table, settings)
    return f"{table.trino_name} {'published' if new else 'already published'}"


def ready(settings: Settings, view: str, version: int) -> str:
    """Mark a validated version ready (or serving, if it is the view's first) and
    let the serving view route to it."""
    with versions.exclusive(settings, view):
        serving.check_compatible(settings, view, version)
        row = versions.mark_ready(settings, view, version)
        routed = serving.regenerate(settings, view)
    return f"{row.label} is {row.status} at {row.rollout_percent} %; {routed}"


def rollout(
    settings: Settings,
    view: str,
    version: int,
    percent: int,
    pin: str | None = None,
    unpin: str | None = None,
) -> list[str]:
    # Names and numbers first: nothing reaches PostgreSQL or Trino unchecked.
    versions.check_rollout(view, percent, pin, unpin)
    with versions.exclusive(settings, view):
        serving.check_compatible(settings, view, version)
        done = versions.rollout(settings, view, version, percent, pin=pin, unpin=unpin)
        done.append(serving.regenerate(settings, view))
    return done


def retire(settings: Settings, view: str, version: int) -> list[str]:
    """Retire a version nobody is routed to: out of the serving view, stream
    stopped, table out of Trino and archived. Re-running finishes what is left."""
    done = []
    with versions.exclusive(settings, view):
        if versions.mark_retired(settings, view, version):
            done.append(f"{view} v{version} retired in the registry")
        done.append(serving.regenerate(settings, view))
    done.append(streams.stop(settings, view, version))
    table = registry.gold_view_table(view, version)
    if catalog.unpublish(table, settings):
        done.append(f"{table.trino_name} dropped from Trino")
    done.extend(archive(settings, table))
    done.extend(kafka.drop_view_topic(settings, view, version))
    return done


def archive(settings: Settings, table: registry.Table) -> list[str]:
    """Move a table and its stream checkpoint under <lake>/_archive/, stamped with the time.

    Through `lake.move`: a rename on a local lake, Hadoop's FileSystem (a copy and
    delete) on an object store.
    """
    from spark_jobs.engine import lake

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    root = f"{settings.lake_root.rstrip('/')}/_archive"
    done = []
    with _files_session(settings) as spark:
        for what, src in (
            ("table", table.path(settings)),
            ("checkpoint", table.checkpoint(settings)),
        ):
            if lake.exists(spark, src):
                dest = f"{root}/{what}/{table.schema}/{table.name}@{stamp}"
                lake.move(spark, src, dest)
                done.append(f"{what} archived to {dest}")
    return done


@contextlib.contextmanager
def _files_session(settings: Settings) -> Iterator[SparkSession]:
    """A session to move files with: the caller's own if it has one (left running);
    else the view host's over Spark Connect, which moves a local lake's files in
    this process (a driver of its own took about 7 s to start in Airflow's retire
    task; `task_session` starts one as the settings say if the host cannot be
    reached after all); else a driver with no executors of its own (a file move
    needs none: a cluster's are left to the streams)."""
    from pyspark.sql import SparkSession

    from spark_jobs.engine.session import build_session
    from warehouse.ops import sessions

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    if sessions.why_not_connect(settings) is None:
        with sessions.task_session(settings, "regauge-archive") as spark:
            yield spark
        return
    spark = build_session(
        "regauge-archive",
        settings,
        ui=False,
        extra_conf={"spark.master": "local[1]"},
        one_shot=True,
    )
    try:
        yield spark
    finally:
        spark.stop()


def forget(settings: Settings, view: str) -> list[str]:
    """Stop every stream of `view`, drop its serving view and forget its versions.
    Tables stay in the lake (a new reprocess overwrites them)."""
    done = [
        streams.stop(settings, s.view, s.version) for s in streams.known(settings) if s.view == view
    ]
    with versions.exclusive(settings, view):
        n = versions.forget(settings, view)
        done.append(serving.regenerate(settings, view, live=[]))
    done.append(f"{n} versions of {view} forgotten")
    return done
