"""Hadoop's local file system without a process per file (`spark_jobs.engine.local_fs`):
every local session uses it, it answers as Hadoop's own does, and Delta's commits
and streaming checkpoints start no process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from spark_jobs.engine import local_fs


def _jvm(spark):
    return spark.sparkContext._jvm


def _hadoop_conf(spark):
    return spark.sparkContext._jsc.hadoopConfiguration()


def test_setup_made_the_jar_and_a_local_session_uses_it_on_both_hadoop_apis(spark, settings):
    assert local_fs.is_current(), "`make setup` compiles it (a JDK's javac)"
    assert str(local_fs.jar_path()) in spark.sparkContext.getConf().get(
        "spark.driver.extraClassPath"
    )
    jvm, conf = _jvm(spark), _hadoop_conf(spark)
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    assert fs.getClass().getName() == local_fs.FILE_SYSTEM
    assert (
        fs.getRawFileSystem().getClass().getName() == "dev.regauge.hadoop.NoForkRawLocalFileSystem"
    )
    context = jvm.org.apache.hadoop.fs.FileContext.getLocalFSFileContext(conf)
    assert context.getDefaultFileSystem().getClass().getName() == local_fs.ABSTRACT_FILE_SYSTEM
    # A session whose executors are other JVMs would need the jar on their class path.
    assert local_fs.session_conf("spark://127.0.0.1:7077") == {}


def test_it_answers_as_hadoops_own_raw_local_file_system(spark, tmp_path: Path):
    jvm, conf = _jvm(spark), _hadoop_conf(spark)
    fs_pkg = jvm.org.apache.hadoop.fs
    ours = jvm.dev.regauge.hadoop.NoForkRawLocalFileSystem()
    theirs = fs_pkg.RawLocalFileSystem()
    for fs in (ours, theirs):
        fs.initialize(jvm.java.net.URI("file:///"), conf)

    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("12345")
    for name in ("file", "dir"):
        path = fs_pkg.Path(f"file:{tmp_path / name}")
        a, b = ours.getFileLinkStatus(path), theirs.getFileLinkStatus(path)
        assert (a.isFile(), a.isDirectory(), a.isSymlink(), a.getLen(), str(a.getPath())) == (
            b.isFile(),
            b.isDirectory(),
            b.isSymlink(),
            b.getLen(),
            str(b.getPath()),
        )
    for fs in (ours, theirs):
        with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
            fs.getFileLinkStatus(fs_pkg.Path(f"file:{tmp_path / 'missing'}"))

    # Permissions land as Hadoop's chmod would set them, the umask (022) applied on
    # create, none on setPermission.
    perm = jvm.org.apache.hadoop.fs.permission.FsPermission
    created = fs_pkg.Path(f"file:{tmp_path / 'created'}")
    ours.create(created, perm.createImmutable(0o664), True, 4096, 1, 1 << 20, None).close()
    assert os.stat(tmp_path / "created").st_mode & 0o7777 == 0o644
    ours.setPermission(created, perm.createImmutable(0o600))
    assert os.stat(tmp_path / "created").st_mode & 0o7777 == 0o600
    ours.mkdirs(fs_pkg.Path(f"file:{tmp_path / 'a' / 'b'}"), perm.createImmutable(0o750))
    assert os.stat(tmp_path / "a" / "b").st_mode & 0o7777 == 0o750


def test_a_rename_onto_a_file_that_exists_is_refused_as_delta_needs(spark, tmp_path: Path):
    """Delta's log store commits a version by FileContext's rename without overwrite:
    two writers of one version must not both succeed. That refusal rests on the
    status of the target, which this file system now answers without readlink."""
    jvm = _jvm(spark)
    fs_pkg = jvm.org.apache.hadoop.fs
    context = fs_pkg.FileContext.getLocalFSFileContext(_hadoop_conf(spark))
    (tmp_path / "one").write_text("first writer")
    (tmp_path / "two").write_text("second writer")
    target = fs_pkg.Path(f"file:{tmp_path / '00000000000000000001.json'}")
    none = jvm.org.apache.hadoop.fs.Options.Rename.NONE

    def rename(src: str) -> None:
        renames = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
        renames[0] = none
        context.rename(fs_pkg.Path(f"file:{tmp_path / src}"), target, renames)

    rename("one")
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        rename("two")
    assert (tmp_path / "00000000000000000001.json").read_text() == "first writer"
    assert (tmp_path / "two").exists()


def test_delta_commits_and_a_streaming_checkpoint_start_no_process(spark, tmp_path: Path):
    """What the jar is for: with Hadoop's own, this test's writes started 111
    `chmod` and `readlink` processes. Counted by the JVM's own flight recorder."""
    jvm = _jvm(spark)
    recording = jvm.jdk.jfr.Recording()
    recording.enable("jdk.ProcessStart").withStackTrace()
    recording.start()
    try:
        table, copy = str(tmp_path / "table"), str(tmp_path / "copy")
        spark.range(10).write.format("delta").save(table)
        spark.range(10, 20).write.format("delta").mode("append").save(table)
        (
            spark.readStream.format("delta")
            .load(table)
            .writeStream.format("delta")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start(copy)
            .awaitTermination()
        )
        assert spark.read.format("delta").load(copy).count() == 20
    finally:
        recording.stop()
        dump = tmp_path / "processes.jfr"
        recording.dump(
            jvm.java.nio.file.Paths.get(
                str(dump), spark.sparkContext._gateway.new_array(jvm.java.lang.String, 0)
            )
        )
        recording.close()
    events = jvm.jdk.jfr.consumer.RecordingFile.readAllEvents(
        jvm.java.nio.file.Paths.get(
            str(dump), spark.sparkContext._gateway.new_array(jvm.java.lang.String, 0)
        )
    )
    # Only what Hadoop's file system started: Spark's own housekeeping may run a
    # process meanwhile (`rm -rf` of a finished session's artifacts folder).
    started = [
        str(event.getString("command"))
        for event in (events.get(i) for i in range(events.size()))
        if _started_by_hadoops_file_system(event)
    ]
    assert started == []


def _started_by_hadoops_file_system(event) -> bool:
    trace = event.getStackTrace()
    assert trace is not None, "the recording keeps each event's stack"
    frames = trace.getFrames()
    return any(
        str(frames.get(i).getMethod().getType().getName()).startswith("org.apache.hadoop.fs.")
        for i in range(frames.size())
    )
