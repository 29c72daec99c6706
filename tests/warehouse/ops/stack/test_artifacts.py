import io
import tarfile

import pytest

from warehouse.base import jvm
from warehouse.base.jvm import SetupError
from warehouse.ops.stack import artifacts


@pytest.mark.parametrize(
    ("jar", "name"),
    [
        ("jackson-core-2.13.5.jar", "jackson-core"),
        ("delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_4.2"),
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10"),
        ("zstd-jni-1.5.7-3.jar", "zstd-jni"),
        ("scala-library-2.13.17.jar", "scala-library"),
    ],
)
def test_artifact_names_ignore_versions(jar, name):
    assert artifacts._artifact_name(jar) == name


def test_spark_gets_delta_and_kafka_but_never_a_second_copy_of_a_pyspark_jar(settings):
    jars = [p.rsplit("/", 1)[1] for p in jvm.spark_jars(settings)]
    assert any(j.startswith("delta-spark_4.2_2.13-") for j in jars)
    assert any(j.startswith("spark-sql-kafka-0-10_2.13-") for j in jars)
    shipped = artifacts._pyspark_jar_names()
    assert not [j for j in jars if artifacts._artifact_name(j) in shipped]


def test_the_jar_list_is_replaced_whole_and_left_alone_when_unchanged(tmp_path):
    """Spark drivers read the list as they start, while `make test`'s cluster smoke
    test fetches beside the Spark tests: never a half-written list, and no write at
    all when the jars are the same."""
    lay = jvm.Layout(tmp_path)
    lay.spark_jars.mkdir(parents=True)
    for jar in ("delta-spark_4.2_2.13-4.4.0.jar", "scala-library-2.13.17.jar"):
        (lay.spark_jars / jar).write_bytes(b"")
    artifacts._write_spark_jar_list(lay)
    listed = lay.spark_jar_list.read_text().splitlines()
    assert listed == [str(lay.spark_jars / "delta-spark_4.2_2.13-4.4.0.jar")]  # PySpark ships scala
    first = lay.spark_jar_list.stat().st_ino
    artifacts._write_spark_jar_list(lay)
    assert lay.spark_jar_list.stat().st_ino == first  # unchanged: not written again
    (lay.spark_jars / "delta-storage-4.4.0.jar").write_bytes(b"")
    artifacts._write_spark_jar_list(lay)
    assert lay.spark_jar_list.stat().st_ino != first  # a new file renamed over it
    assert len(lay.spark_jar_list.read_text().splitlines()) == 2
    assert sorted(p.name for p in lay.spark_jars.iterdir() if not p.name.endswith(".jar")) == [
        "spark-jars.txt"
    ]


def test_missing_java_17_says_what_to_do(tmp_path):
    with pytest.raises(SetupError, match=r"Java 17 not found under .*run `make setup`"):
        jvm.java17(tmp_path)


def test_too_little_disk_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "FREE_BYTES_NEEDED", 1 << 60)
    with pytest.raises(SetupError, match=r"disk nearly full: .* GiB free in"):
        artifacts._check_disk(tmp_path)


def _add(tar, name, data=None, link=None):
    info = tarfile.TarInfo(name)
    if link:
        info.type, info.linkname = tarfile.LNKTYPE, link
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def test_unpack_keeps_wanted_parts_and_resolves_links_into_skipped_ones(tmp_path):
    tarball = tmp_path / "server.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        _add(tar, "server-1/lib/core.jar", b"core")
        _add(tar, "server-1/plugin/hive/shared.jar", b"shared bytes")
        _add(tar, "server-1/plugin/hive/only-hive.jar", b"hive")
        _add(tar, "server-1/plugin/delta/shared.jar", link="server-1/plugin/hive/shared.jar")
        _add(tar, "server-1/plugin/delta/core.jar", link="server-1/lib/core.jar")
    dest = tmp_path / "out"
    artifacts._unpack_selected(tarball, dest, "server-1/", ("lib/", "plugin/delta/"))
    assert (dest / "lib/core.jar").read_bytes() == b"core"
    assert (dest / "plugin/delta/shared.jar").read_bytes() == b"shared bytes"
    assert (dest / "plugin/delta/core.jar").read_bytes() == b"core"
    assert not (dest / "plugin/hive").exists()
    assert not (dest / ".link-targets").exists()
