"""Delta's checksum after delta-rs's commits (`delta_checksum`): what Spark would have
written, checked against Spark's own state of the table, and what it spares Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest

from spark_jobs.engine import delta_checksum, lake
from tests.spark_jobs.test_lake import _merge

PREVIOUS: dict[str, Any] = {
    "txnId": "t",
    "tableSizeBytes": 300,
    "numFiles": 2,
    "numMetadata": 1,
    "numProtocol": 1,
    "setTransactions": [{"appId": "a", "version": 1}, {"appId": "b", "version": 4}],
    "domainMetadata": [],
    "metadata": {"id": "m", "configuration": {}},
    "protocol": {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["appendOnly"]},
    "fileSizeHistogram": {
        "sortedBinBoundaries": [0, 100, 1000],
        "fileCounts": [1, 1, 0],
        "totalBytes": [50, 250, 0],
    },
    "allFiles": [],
}


def _add(size: int) -> dict:
    return {"add": {"path": f"f{size}", "size": size, "dataChange": True}}


def _remove(size: int | None, extended: bool = True) -> dict:
    return {"remove": {"path": "f", "size": size, "extendedFileMetadata": extended}}


def test_a_commits_files_ids_and_metadata_carry_the_previous_checksum_forward():
    found = delta_checksum.next_checksum(
        PREVIOUS,
        [
            {"commitInfo": {"operation": "MERGE"}},
            _add(1500),
            _add(80),
            _remove(250),
            {"cdc": {"path": "_change_data/c", "size": 9}},
            {"txn": {"appId": "b", "version": 5, "lastUpdated": None}},
            {"txn": {"appId": "c", "version": 0, "lastUpdated": 7}},
        ],
    )
    assert found is not None
    assert (found["tableSizeBytes"], found["numFiles"]) == (300 + 1500 + 80 - 250, 3)
    assert found["fileSizeHistogram"] == {
        "sortedBinBoundaries": [0, 100, 1000],
        "fileCounts": [2, 0, 1],
        "totalBytes": [130, 0, 1500],
    }
    assert found["setTransactions"] == [
        {"appId": "a", "version": 1},
        {"appId": "b", "version": 5},
        {"appId": "c", "version": 0, "lastUpdated": 7},
    ]
    assert found["metadata"] == PREVIOUS["metadata"] and found["protocol"] == PREVIOUS["protocol"]
    assert found["domainMetadata"] == []
    # Neither the file list nor the transaction UUID is carried: they would be wrong.
    assert "allFiles" not in found and "txnId" not in found
    assert PREVIOUS["fileSizeHistogram"]["fileCounts"] == [1, 1, 0]  # not changed in place
    changed = {"id": "m", "configuration": {"delta.appendOnly": "true"}}
    with_metadata = delta_checksum.next_checksum(PREVIOUS, [{"metaData": changed}])
    assert with_metadata is not None and with_metadata["metadata"] == changed


@pytest.mark.parametrize(
    "case,actions",
    [
        ("a remove without its size", [_remove(None)]),
        ("a remove without extended metadata", [_remove(250, extended=False)]),
        ("a deletion vector", [{"add": {"path": "f", "size": 1, "deletionVector": {}}}]),
        ("domain metadata", [{"domainMetadata": {"domain": "d", "removed": False}}]),
        ("an in-commit timestamp", [{"commitInfo": {"inCommitTimestamp": 1}}]),
        ("a feature it does not follow", [{"protocol": {"writerFeatures": ["rowTracking"]}}]),
        ("a line of two actions", [{**_add(1), **_remove(1)}]),
        ("files Spark does not count", [{"commitInfo": {"operation": "COMPUTE STATS"}}]),
        ("more files removed than there are", [_remove(1), _remove(1), _remove(1)]),
    ],
)
def test_a_commit_it_cannot_follow_gets_no_checksum(case, actions):
    assert delta_checksum.next_checksum(PREVIOUS, actions) is None, case


def test_transaction_ids_are_left_out_where_a_list_of_them_could_be_incomplete():
    def ids(previous: dict, actions: list[dict]):
        found = delta_checksum.next_checksum(previous, actions)
        assert found is not None
        return found.get("setTransactions")

    txn = {"txn": {"appId": "new", "version": 0}}
    assert ids({**PREVIOUS, "setTransactions": None}, [txn]) is None
    full = [{"appId": f"a{i}", "version": 0} for i in range(delta_checksum.MAX_SET_TRANSACTIONS)]
    assert ids({**PREVIOUS, "setTransactions": full}, [txn]) is None
    assert len(ids({**PREVIOUS, "setTransactions": full[1:]}, [txn])) == 100
    retained = {"id": "m", "configuration": {"delta.setTransactionRetentionDuration": "1 day"}}
    assert ids({**PREVIOUS, "metadata": retained}, [txn]) is None
    assert ids(PREVIOUS, [txn, {"metaData": retained}]) is None
    # Deletion-vector counts kept by the previous checksum: none at all.
    assert delta_checksum.next_checksum({**PREVIOUS, "numDeletionVectorsOpt": 0}, [txn]) is None


def _log(tmp_path: Path, commits: int) -> Path:
    """A log whose version 0 has a checksum and versions 1..`commits` one add each."""
    log_dir = tmp_path / "_delta_log"
    log_dir.mkdir(parents=True)
    (log_dir / f"{0:020d}.crc").write_text(json.dumps(PREVIOUS) + "\n")
    for version in range(1, commits + 1):
        commit = [{"commitInfo": {"operation": "WRITE"}}, _add(version)]
        (log_dir / f"{version:020d}.json").write_text("\n".join(map(json.dumps, commit)) + "\n")
    return log_dir


def test_a_checksum_catches_up_from_the_newest_version_before_it_that_has_one(tmp_path):
    log_dir = _log(tmp_path, 3)
    assert delta_checksum.write_after_commit(log_dir, 3)
    found = [json.loads((log_dir / f"{v:020d}.crc").read_text()) for v in (1, 2, 3)]
    assert [f["numFiles"] for f in found] == [3, 4, 5]
    assert found[2]["tableSizeBytes"] == 300 + 1 + 2 + 3
    assert sorted(p.name for p in log_dir.iterdir() if p.name.startswith(".")) == []  # no temp
    assert not delta_checksum.write_after_commit(log_dir, 3)  # there already


def test_no_checksum_where_a_commit_between_is_gone_or_none_is_near(tmp_path, monkeypatch):
    log_dir = _log(tmp_path, 3)
    (log_dir / f"{2:020d}.json").unlink()  # history removed before a checkpoint
    assert not delta_checksum.write_after_commit(log_dir, 3)
    assert (log_dir / f"{1:020d}.crc").exists() and not (log_dir / f"{3:020d}.crc").exists()
    monkeypatch.setattr(delta_checksum, "CATCH_UP", 1)
    far = _log(tmp_path / "far", 3)
    assert not delta_checksum.write_after_commit(far, 3)
    assert [p.name for p in far.glob("*.crc")] == [f"{0:020d}.crc"]  # 2 back: too far


def test_a_checksum_left_by_another_table_or_unreadable_is_not_built_on(tmp_path):
    """A table made again at the same path over a checksum of the one before (another
    id): nothing written. A torn newest checksum is passed over for the one before."""
    log_dir = _log(tmp_path, 3)
    assert not delta_checksum.write_after_commit(log_dir, 1, table_id="another")
    assert not (log_dir / f"{1:020d}.crc").exists()
    assert delta_checksum.write_after_commit(log_dir, 1, table_id="m")
    (log_dir / f"{1:020d}.crc").write_text('{"tableSizeBy')  # torn
    assert delta_checksum.write_after_commit(log_dir, 2, table_id="m")
    assert json.loads((log_dir / f"{2:020d}.crc").read_text())["numFiles"] == 4  # from 0's
    # Another writer's checksum that landed first stands (no file is replaced).
    (log_dir / f"{3:020d}.crc").write_text(json.dumps({**PREVIOUS, "numFiles": 9}) + "\n")
    assert delta_checksum._write(log_dir, 3, PREVIOUS)["numFiles"] == 9
    assert sorted(p.name for p in log_dir.iterdir() if p.name.startswith(".")) == []


def _next_job(spark) -> int:
    """The id Spark's scheduler gives its next job: read from the scheduler itself,
    not from the listener, which can lag behind a job's end."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


def test_delta_rs_commits_get_the_checksum_spark_computes_and_spark_reads_them_without_jobs(
    spark, tmp_path
):
    """A table made and appended to by Spark (its checksums), then merged into and
    appended to by delta-rs (`lake.Committer`): every version gets a checksum that
    Delta's own validation against the state rebuilt from the log accepts (sizes,
    counts, file-size histogram, metadata, protocol, every transaction id), a
    metadata change by delta-rs included; Spark builds the newest snapshot with no
    job, where a version without one takes jobs over the log; and Spark's commit
    after them derives its checksum from theirs."""
    path = str(tmp_path / "t")
    log_dir = Path(path) / "_delta_log"
    spark.sql(
        f"CREATE TABLE delta.`{path}` (k STRING NOT NULL, n BIGINT) USING delta TBLPROPERTIES "
        "('delta.enableChangeDataFeed'='true', 'delta.checkpointInterval'='4')"
    )
    lake.append_once(spark.createDataFrame([("a", 1), ("b", 2)], "k string, n long"), path, "s", 0)
    assert (log_dir / f"{1:020d}.crc").exists()
    committer = lake.Committer(path, {})

    def merge(rows: list[tuple[str, int, str]], batch: int) -> int | None:
        return _merge(committer, rows, batch)  # under ("app", batch)

    def append(n: int, app: str, batch: int) -> int | None:
        rows = pa.table({"k": [f"x{n}"], "n": pa.array([n], pa.int64())})
        return committer.append(rows, txn=(app, batch), user_metadata=None)

    made = [
        merge([("a", 10, "upsert"), ("b", 0, "delete"), ("c", 3, "upsert")], 0),
        append(1, "other", 0),
        merge([("c", 4, "upsert")], 1),  # version 4: delta-rs's checkpoint too
        append(2, "other", 1),
        append(3, "third", 0),
    ]
    assert made == [2, 3, 4, 5, 6]
    assert merge([("c", 4, "upsert")], 2) is None  # nothing changed: no commit, no checksum
    # A metadata change by delta-rs outside the committer (or a commit whose process
    # stopped before its checksum): the next commit's checksum catches up.
    deltalake.DeltaTable(path).alter.set_table_properties({"delta.logRetentionDuration": "30 days"})
    assert not (log_dir / f"{7:020d}.crc").exists()
    assert append(4, "third", 1) == 8
    assert not delta_checksum.write_after_commit(log_dir, 8)  # one there already
    for version in range(2, 9):
        assert (log_dir / f"{version:020d}.crc").exists(), version

    jvm = spark._jvm
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    before = _next_job(spark)
    newest = lake.snapshot(spark, path)
    assert int(newest.version()) == 8 and newest.checksumOpt().isDefined()
    assert newest.metadata().configuration().get("delta.logRetentionDuration").get() == "30 days"
    assert _next_job(spark) == before  # protocol and metadata from the checksum
    assert lake._checksum_txns(newest) == {"s": 0, "app": 1, "other": 1, "third": 1}
    for version in range(2, 9):
        none = jvm.scala.Option.empty()
        at = lake.delta_log(spark, path).getSnapshotAt(version, none, none, False)
        assert at.checksumOpt().isDefined(), version
        # Against the state rebuilt from the log; a mismatch raises.
        assert at.validateChecksum(getattr(at, "validateChecksum$default$1")()), version

    # Without it (as before), the same snapshot takes jobs over the log.
    (log_dir / f"{8:020d}.crc").rename(tmp_path / "kept.crc")
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    before = _next_job(spark)
    assert not lake.snapshot(spark, path).checksumOpt().isDefined()
    assert _next_job(spark) > before
    (tmp_path / "kept.crc").rename(log_dir / f"{8:020d}.crc")
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()

    # Spark's own append after them reads the ids from the checksum (no writer's
    # rebuild: `_append_by_checksum` commits) and writes a checksum that holds.
    rows = spark.createDataFrame([("z", 9)], "k string, n long")
    assert lake._append_by_checksum(rows, path, "s", 1) is True
    spark_commit = json.loads((log_dir / f"{9:020d}.crc").read_text())
    assert {t["appId"]: t["version"] for t in spark_commit["setTransactions"]} == {
        "s": 1,
        "app": 1,
        "other": 1,
        "third": 1,
    }
    at = lake.snapshot(spark, path)
    assert at.validateChecksum(getattr(at, "validateChecksum$default$1")())
    assert sorted(map(tuple, spark.read.format("delta").load(path).collect())) == [
        ("a", 10),
        ("c", 4),
        ("x1", 1),
        ("x2", 2),
        ("x3", 3),
        ("x4", 4),
        ("z", 9),
    ]
