"""Delta's checksum file (`_delta_log/<version>.crc`) for the commits delta-rs makes.

delta-rs writes none, and nearly every live commit is delta-rs's (`lake.Committer`).
Without a checksum for the very version a snapshot is built at, delta-spark 4.4
reads the table's protocol and metadata with a Spark job over its log, and runs
another to see whether its checkpoint is a V2 one; each view's stream builds two
such snapshots of silver every micro-batch (docs/design/issue-67-checksums.md).
And Spark's next commit after one of delta-rs's, which derives its own checksum
from the previous version's, rebuilds the whole state instead.

So after each of its commits, `lake.Committer` writes the checksum Spark would,
derived as Spark derives it (delta-spark's `Checksum.computeNewChecksum`): the
previous version's checksum plus the commit's actions. Where the previous version
has none, or the commit holds anything this does not follow (deletion vectors,
domain metadata, a table feature that bears on the checksum), it writes none, and
Spark does what it did before. A checksum Delta takes as true must be exactly
true: its protocol and metadata are what a snapshot runs on, and its transaction
ids are what exactly-once asks (`lake.txn_version`), so each field is either
carried over as Spark would or the file is not written.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Delta keeps a table's transaction ids in its checksum up to this many
# (`spark.databricks.delta.maxSetTransactionsInCrc`, 100 by default); past it,
# the checksum leaves them out, as here.
MAX_SET_TRANSACTIONS = 100
# With a retention set, Delta expires old ids as it replays the log, which a
# checksum carried forward would not: Spark leaves them out then, as here.
_TXN_RETENTION = "delta.setTransactionRetentionDuration"
# The table features whose tables this writes checksums for: none of them adds a
# field to the checksum or an action it must follow. Others (deletion vectors,
# row tracking, domain metadata, in-commit timestamps, V2 checkpoints) do.
_FOLLOWED_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",
        "checkConstraints",
        "changeDataFeed",
        "generatedColumns",
        "columnMapping",
        "identityColumns",
        "timestampNtz",
    }
)
# How many versions back a commit's checksum is derived from, where the versions
# before it have none: each is a read of a small file.
CATCH_UP = 100
# Operations whose files Spark does not count as added or removed (they re-add
# files that exist, or remove deletion-vector tombstones): not followed.
_UNCOUNTED_OPERATIONS = frozenset(
    {
        "COMPUTE STATS",
        "ROW TRACKING BACKFILL",
        "ROW TRACKING UNBACKFILL",
        "DROP FEATURE",
        "Deletion Vector Tombstones",
    }
)
# The checksum's deletion-vector counts: a table that keeps them is not followed.
_DV_FIELDS = ("numDeletedRecordsOpt", "numDeletionVectorsOpt", "deletedRecordCountsHistogramOpt")


def _features_followed(protocol: dict[str, Any]) -> bool:
    named = set(protocol.get("readerFeatures") or ()) | set(protocol.get("writerFeatures") or ())
    return named <= _FOLLOWED_FEATURES


def _retains_txns(metadata: dict[str, Any]) -> bool:
    return _TXN_RETENTION in (metadata.get("configuration") or {})


def _histogram_add(histogram: dict[str, Any] | None, size: int, sign: int) -> None:
    """Count a file in or out of its bin: the largest boundary at or below its size."""
    if histogram is None:
        return
    index = bisect.bisect_right(histogram["sortedBinBoundaries"], size) - 1
    if index >= 0:
        histogram["fileCounts"][index] += sign
        histogram["totalBytes"][index] += sign * size


def _set_transactions(
    previous: list[dict[str, Any]] | None,
    committed: list[dict[str, Any]],
    retained: bool,
) -> list[dict[str, Any]] | None:
    """The ids after the commit: the previous ones with the commit's replacing theirs
    (Delta's log replay keeps an id's last action). None, leaving them out, where
    the previous checksum left them out, a retention expires them, or there are too
    many: a list that is present is taken as all of them."""
    if previous is None or retained:
        return None
    if max(len(previous), len(committed)) > MAX_SET_TRANSACTIONS:
        return None
    by_app = {t["appId"]: t for t in previous}
    for txn in committed:
        by_app[txn["appId"]] = {k: v for k, v in txn.items() if v is not None}
    found = list(by_app.values())
    return found if len(found) <= MAX_SET_TRANSACTIONS else None


def next_checksum(previous: dict[str, Any], actions: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The checksum of a commit of `actions` (its log lines, parsed) made on the version
    whose checksum is `previous`; None where Spark's rules cannot be followed here, so
    that no checksum is better than a wrong one."""
    metadata, protocol = previous.get("metadata"), previous.get("protocol")
    if metadata is None or protocol is None or any(previous.get(f) is not None for f in _DV_FIELDS):
        return None
    try:
        size, files = int(previous["tableSizeBytes"]), int(previous["numFiles"])
    except (KeyError, TypeError, ValueError):
        return None
    histogram = copy.deepcopy(previous.get("fileSizeHistogram"))
    committed: list[dict[str, Any]] = []
    for action in actions:
        if len(action) != 1:
            return None
        ((kind, body),) = action.items()
        if kind in ("add", "remove") and body.get("deletionVector") is not None:
            return None
        if kind == "add":
            size += int(body["size"])
            files += 1
            _histogram_add(histogram, int(body["size"]), 1)
        elif kind == "remove":
            # Spark's rule: a remove without its size (no extended metadata) leaves
            # the size unknown, and the state is rebuilt instead.
            if body.get("extendedFileMetadata") is not True or body.get("size") is None:
                return None
            size -= int(body["size"])
            files -= 1
            _histogram_add(histogram, int(body["size"]), -1)
        elif kind == "metaData":
            metadata = body
        elif kind == "protocol":
            protocol = body
        elif kind == "txn":
            committed.append(body)
        elif kind == "commitInfo":
            if body.get("inCommitTimestamp") is not None:
                return None
            if body.get("operation") in _UNCOUNTED_OPERATIONS:
                return None
        elif kind != "cdc":  # change data files are not the table's files
            return None
    if not _features_followed(protocol) or files < 0 or size < 0:
        return None
    txns = _set_transactions(
        previous.get("setTransactions"),
        committed,
        _retains_txns(previous["metadata"]) or _retains_txns(metadata),
    )
    found: dict[str, Any] = {
        "tableSizeBytes": size,
        "numFiles": files,
        "numMetadata": 1,
        "numProtocol": 1,
        "metadata": metadata,
        "protocol": protocol,
    }
    if txns is not None:
        found["setTransactions"] = txns
    if previous.get("domainMetadata") is not None:
        found["domainMetadata"] = previous["domainMetadata"]
    if histogram is not None:
        found["fileSizeHistogram"] = histogram
    # No `allFiles`: Spark keeps the file list only for small tables, and rebuilds
    # it where it is missing; no transaction UUID (`txnId`), which is optional.
    return found


def _read_checksum(log_dir: Path, version: int) -> dict[str, Any] | None:
    """A version's checksum, as Delta reads it (its first line); None if there is
    none, or it cannot be read."""
    try:
        with (log_dir / f"{version:020d}.crc").open(encoding="utf-8") as f:
            first = f.readline()
        found = json.loads(first)
    except (FileNotFoundError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _write(log_dir: Path, version: int, found: dict[str, Any]) -> dict[str, Any]:
    """Write `version`'s checksum as a temporary file linked into place, which refuses
    to replace one another writer (Spark) wrote meanwhile (Spark writes its own so
    too); the checksum to go on from (that one's, where it was first)."""
    target = log_dir / f"{version:020d}.crc"
    temporary = log_dir / f".{target.name}.{uuid.uuid4()}.tmp"
    try:
        temporary.write_text(json.dumps(found, separators=(",", ":")) + "\n", encoding="utf-8")
        os.link(temporary, target)
    except FileExistsError:
        # Followed onward where it can be read; where it cannot (torn), this one is.
        return _read_checksum(log_dir, version) or found
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return found


def _commit_actions(log_dir: Path, version: int) -> list[dict[str, Any]] | None:
    try:
        with (log_dir / f"{version:020d}.json").open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:  # removed with the history before a checkpoint
        return None


def write_after_commit(log_dir: Path, version: int, table_id: str | None = None) -> bool:
    """Write `version`'s checksum, unless it has one, and those of the versions before
    it back to the newest that has a readable one (at most CATCH_UP versions back):
    each from the one before and its commit's actions. Whether this wrote `version`'s.
    For a local table, under its commit lock (`lake.committing`).

    `table_id`: the table's id (its metadata's), as the writer that just committed
    reads it; a checksum derived for another id (one left by a table made before at
    the same path) is not written.

    Catching up mends the chain where a process stopped between a commit and its
    checksum (a kill -9), and starts it on a table whose last checksum is older
    than delta-rs's writing them. A reader that built its snapshot before a file
    landed just lacks it, as before."""
    if version < 1 or (log_dir / f"{version:020d}.crc").exists():
        return False
    oldest = max(version - 1 - CATCH_UP, -1)
    # The newest readable one: a torn or empty file (a power loss) is passed over.
    start, found = None, None
    for before in range(version - 1, oldest, -1):
        found = _read_checksum(log_dir, before)
        if found is not None:
            start = before
            break
    if start is None or found is None:
        return False
    for at in range(start + 1, version + 1):
        actions = _commit_actions(log_dir, at)
        derived = None if actions is None else next_checksum(found, actions)
        if derived is None or (table_id is not None and derived["metadata"].get("id") != table_id):
            log.debug("%s: no checksum for version %d (a commit it does not follow)", log_dir, at)
            return False
        found = _write(log_dir, at, derived)
    return True
