"""The Spark driver's class-data archive: made by `make setup`, mapped by every session,
and dropped the moment the JVM or PySpark's jars change under it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spark_jobs.engine import class_archive


def test_setup_made_an_archive_every_session_maps(spark):
    # `make setup` ran `regauge setup`, which made it; ensure() finds it current.
    archive = class_archive.ensure()
    assert archive == class_archive.archive_path() and archive.stat().st_size > 10 * 1024**2
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
    assert f"-XX:SharedArchiveFile={archive}" in options


def test_a_driver_that_requires_the_archive_starts_with_it_and_the_operators_options():
    # -Xshare:on makes a JVM that cannot map the archive (another JVM, other jars)
    # exit instead of quietly loading every class itself. The same driver shows
    # that REGAUGE_SPARK_DRIVER_JAVA_OPTIONS reaches the JVM, after regauge's own,
    # and a one-shot command's (the JIT's first tier) before it, so an operator's
    # option overrides it.
    script = textwrap.dedent(
        """
        from spark_jobs.engine import class_archive
        from spark_jobs.engine.session import build_session
        spark = build_session("archive-check", ui=False,
                              extra_java_options=class_archive.java_option() + " -Xshare:on",
                              one_shot=True)
        print("rows", spark.range(3).count())
        jvm = spark.sparkContext._jvm
        args = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
        print("options", " ".join(a for a in args if a.startswith("-XX:")))
        """
    )
    env = {**os.environ, "REGAUGE_SPARK_DRIVER_JAVA_OPTIONS": "-XX:NativeMemoryTracking=summary"}
    # A bound for a stuck start, not a speed: beside the integration tests at the
    # lowest priority (infra/run-tests.sh) a short Spark run can take minutes.
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows, options = proc.stdout.splitlines()[-2:]
    assert rows.split() == ["rows", "3"]
    given = options.split()
    assert "-XX:NativeMemoryTracking=summary" in given
    assert given.index("-XX:TieredStopAtLevel=1") < given.index("-XX:NativeMemoryTracking=summary")
    assert f"-XX:SharedArchiveFile={class_archive.archive_path()}" in options.split()


def test_a_changed_jar_makes_the_archive_stale_and_sessions_start_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    jars = tmp_path / "jars"
    jars.mkdir()
    jar = jars / "spark-core_2.13-4.2.0.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setattr(class_archive, "_pyspark_jars", lambda: jars)
    monkeypatch.setattr(class_archive, "archive_path", lambda: tmp_path / "driver.jsa")
    assert class_archive.java_option() == ""  # none made yet
    (tmp_path / "driver.jsa").write_bytes(b"archive")
    (tmp_path / "driver.token").write_text(class_archive.token() + "\n")
    assert class_archive.java_option() == f"-XX:SharedArchiveFile={tmp_path / 'driver.jsa'}"
    # A reinstall rewrites the jar: same name, new time.
    st = jar.stat()
    os.utime(jar, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert not class_archive.is_current()
    assert class_archive.java_option() == ""
