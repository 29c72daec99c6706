"""A class-data archive (AppCDS) for the Spark driver's JVM: fewer seconds per start.

Every `regauge` command, Airflow task and test run that touches the lake starts a
Spark driver, and most of such a JVM's first seconds go to loading and verifying
the same few thousand classes of Spark, Scala and Hadoop. Java 17 can dump the
classes one run loaded into an archive (`-XX:ArchiveClassesAtExit`) that later
JVMs map instead (`-XX:SharedArchiveFile`). Measured on 2 cores with two busy
loops beside it: session, first job and a Delta read took 22-27 s with the
archive `_exercise` makes against 36-40 s without.

The archive is only valid for the exact JVM and the exact jar files it was made
from (the JVM checks their paths, sizes and times, and otherwise ignores it with
a warning), so it lives in the virtualenv whose PySpark it serves, beside a token
of what it was made from; `regauge setup` makes it again when the token differs,
and a session uses it only while the token still holds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from spark_jobs.engine import local_fs
from warehouse.base import jvm

log = logging.getLogger(__name__)

# Making it runs one short Spark application: well under a minute.
MAKE_TIMEOUT_S = 300


def archive_path() -> Path:
    """Inside the virtualenv that runs the drivers (Airflow's tasks call its CLI)."""
    return Path(sys.prefix) / "share" / "regauge" / "spark-driver.jsa"


def _token_path() -> Path:
    return archive_path().with_suffix(".token")


def _pyspark_jars() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise jvm.SetupError("PySpark is not installed: run `make setup`")
    return Path(spec.origin).parent / "jars"


def token() -> str:
    """What the archive depends on: the Java binary, PySpark's jars and the local file
    system's jar ahead of them on the driver's class path (`local_fs`), by path, size
    and modification time (what the JVM itself checks)."""
    digest = hashlib.sha256()
    java = Path(os.path.realpath(jvm.java17()))
    ahead = [local_fs.jar_path()] if local_fs.is_current() else []
    for path in [java, *ahead, *sorted(_pyspark_jars().glob("*.jar"))]:
        st = path.stat()
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def is_current() -> bool:
    try:
        return archive_path().is_file() and _token_path().read_text().strip() == token()
    except (OSError, jvm.SetupError):
        return False


def java_option() -> str:
    """The driver's JVM option that maps the archive, or "" while there is none that
    fits this JVM and these jars (the JVM then loads every class itself, as before)."""
    return f"-XX:SharedArchiveFile={archive_path()}" if is_current() else ""


def ensure() -> Path | None:
    """Make the archive if it is missing or stale; return it, or None if it could not
    be made (a slower start, not an error: the sessions work without it)."""
    if is_current():
        return archive_path()
    target = archive_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    expected = token()
    log.info("making the Spark driver's class-data archive %s (one short Spark run)", target)
    with tempfile.TemporaryDirectory(prefix="regauge-cds-") as work:
        made = Path(work) / "driver.jsa"
        proc = subprocess.run(
            [sys.executable, "-m", "spark_jobs.engine.class_archive", str(made), work],
            capture_output=True,
            text=True,
            timeout=MAKE_TIMEOUT_S,
        )
        if proc.returncode != 0 or not made.is_file():
            log.warning(
                "no class-data archive (Spark drivers start a few seconds slower): exit %s\n%s",
                proc.returncode,
                proc.stderr.strip()[-2000:],
            )
            return None
        os.replace(made, target)
    _token_path().write_text(expected + "\n")
    return target


def _exercise(dump_to: str, work: Path) -> None:
    """A small run through what regauge's drivers do (Delta write, merge, read, a
    windowed aggregate, a streaming query with foreachBatch), so the classes they
    load are the ones archived. The archive is written as this JVM exits."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from spark_jobs.engine.session import build_session

    spark = build_session(
        "regauge-class-archive",
        ui=False,
        extra_java_options=f"-XX:ArchiveClassesAtExit={dump_to} -Xlog:cds=error",
    )
    table, copy = str(work / "table"), str(work / "copy")
    rows = spark.range(2000).selectExpr(
        "id",
        "cast(id % 7 as string) as key",
        "timestamp_seconds(1767225600 + id * 60) as event_time",
        "cast(id as decimal(12, 2)) as total",
    )
    rows.write.format("delta").save(table)
    (
        DeltaTable.forPath(spark, table)
        .alias("t")
        .merge(rows.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    read = spark.read.format("delta").load(table)
    read.groupBy(F.window("event_time", "1 hour"), "key").agg(F.sum("total")).collect()

    def apply(batch, batch_id: int) -> None:
        batch.write.format("delta").mode("append").save(copy)

    (
        spark.readStream.format("delta")
        .load(table)
        .writeStream.foreachBatch(apply)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    spark.read.format("delta").load(copy).count()
    spark.stop()


if __name__ == "__main__":
    _exercise(sys.argv[1], Path(sys.argv[2]))
