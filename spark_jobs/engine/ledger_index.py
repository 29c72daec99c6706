"""Which event ids the ledger has seen, and where, kept on ingest's driver.

Exact dedup needs, for each event id of a micro-batch, every record of that id
ever accepted: the ledger. Joining the batch's ids against the ledger reads all
of it, every batch, so the batch's cost grows with history (8.8 M rows, 670 MB,
read for a batch of 2,000 records on the developer's lake).

The index holds, for every ledger row, the 64-bit hash of its event id and its
position (partition, offset), sorted by hash: 16 bytes a row, built once from the
ledger when ingest's query starts. A batch looks its ids' hashes up; only ids
found there have earlier records, and their positions name the ledger rows to
read (`lake.at_positions`, whose ranges let Delta skip every other file). An id
whose hash another id shares only adds a row to read, which the join on the
event id then drops: the answer still comes from the ledger, not from the hash.

It follows the ledger commit by commit, through Delta's log (`getChanges`, or on a
local lake its commit files, `LedgerIndex.writer`): ingest's
own append of a batch adds the batch's rows; a commit that changes no data
(OPTIMIZE) leaves it as it is; anything else (an erasure, another writer, a
ledger made again, a log cleaned past it) rebuilds it. An index that lists a
position the ledger no longer holds is harmless (that read finds no row); one
that misses a position would not be, hence the rebuild. A commit that only
removes files (a DELETE of whole files) leaves such positions.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine import lake
from spark_jobs.engine.sorted_pairs import SortedPairs

log = logging.getLogger(__name__)

# A position as one 64-bit number: partition in the high 16 bits, offset below.
# Kafka offsets stay far below 2**47.
_OFFSET_BITS = 48
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
_MAX_PARTITION = (1 << 15) - 1


def keyed(rows: DataFrame, *keep: str) -> DataFrame:
    """Rows with `event_id`, `partition`, `offset` -> (`id_hash`, `position`), as kept,
    after the columns `keep`. A position that does not fit fails the query: packed
    wrong, it would be missed."""
    fits = F.col("partition").between(0, _MAX_PARTITION) & F.col("offset").between(0, _OFFSET_MASK)
    packed = F.shiftleft(F.col("partition").cast("long"), _OFFSET_BITS).bitwiseOR(F.col("offset"))
    return rows.select(
        *keep,
        F.xxhash64("event_id").alias("id_hash"),
        F.when(fits, packed)
        .otherwise(
            F.raise_error(
                F.format_string(
                    "ledger index: position (%d, %d) is outside partitions 0-%d and offsets 0-%d",
                    "partition",
                    "offset",
                    F.lit(_MAX_PARTITION),
                    F.lit(_OFFSET_MASK),
                )
            )
        )
        .alias("position"),
    )


@dataclass(frozen=True)
class Keys:
    """Id hashes and positions of some ledger-shaped rows, on the driver."""

    hashes: np.ndarray
    positions: np.ndarray

    @classmethod
    def of(cls, rows: DataFrame) -> Keys:
        """Collected through Arrow: 16 bytes a row."""
        return cls.from_arrow(keyed(rows).toArrow())

    @classmethod
    def from_arrow(cls, table: pa.Table) -> Keys:
        """From a collected `keyed` table (its `id_hash` and `position` columns)."""
        return cls(
            table.column("id_hash").to_numpy().astype(np.int64, copy=False),
            table.column("position").to_numpy().astype(np.int64, copy=False),
        )


class LedgerIndex:
    """The ledger's event-id hashes and positions; see the module's doc."""

    def __init__(self, path: str, writer: lake.Committer | None = None) -> None:
        self.path = path
        # The ledger's delta-rs committer (a live query's on a local lake): its live
        # appends are delta-rs's then (`lake.append_live`), and `follow` reads their
        # commits from the log's files, where Spark would rebuild the table's
        # protocol and metadata from them (a job) to update its snapshot.
        self.writer = writer
        self.version: int | None = None
        self.table_id: str | None = None
        # Id hash -> packed position.
        self._pairs = SortedPairs()

    def __len__(self) -> int:
        return len(self._pairs)

    # -- keeping up with the ledger ---------------------------------------------------------
    def rebuild(self, spark: SparkSession, why: str) -> None:
        started = time.monotonic()
        snapshot = lake.snapshot(spark, self.path)
        version = int(snapshot.version())
        self.table_id = str(snapshot.metadata().id())
        keys = Keys.of(lake.read_version(spark, self.path, version))
        self._pairs.reset(keys.hashes, keys.positions)
        self.version = version
        log.info(
            "ledger index: %s rows of ledger version %d in %.1f s (%s)",
            f"{len(self):,}",
            version,
            time.monotonic() - started,
            why,
        )

    def follow(self, spark: SparkSession, ours: tuple[str, int], batch: Keys) -> None:
        """Bring the index to the ledger's newest version. `ours` (txnAppId, txnVersion)
        names the ledger append of the batch whose accepted records are `batch`."""
        if self.version is None:
            self.rebuild(spark, "first batch")
            return
        if self.writer is not None:
            table = self.writer.table()
            newest, table_id = int(table.version()), str(table.metadata().id)
        else:
            snapshot = lake.snapshot(spark, self.path)
            newest, table_id = int(snapshot.version()), str(snapshot.metadata().id())
        if table_id != self.table_id or newest < self.version:
            self.rebuild(spark, "the ledger was made again")
            return
        if newest == self.version:
            return
        commits = (
            _commits(spark, self.path, self.version + 1, newest)
            if self.writer is None
            else _local_commits(self.writer.where, self.version + 1, newest)
        )
        if commits is None:
            self.rebuild(spark, f"the ledger's log from version {self.version + 1} is gone")
            return
        for version, (txn, adds_data) in commits:
            if txn == ours:
                self.add(batch)
            elif adds_data:
                self.rebuild(spark, f"ledger version {version} was written by another writer")
                return
        self.version = newest

    def add(self, keys: Keys) -> None:
        self._pairs.add(keys.hashes, keys.positions)

    # -- lookups ----------------------------------------------------------------------------
    def positions_of(
        self, hashes: np.ndarray, leaving_out: np.ndarray | None = None
    ) -> list[tuple[int, int]]:
        """Every (partition, offset) the index holds for any of these id hashes, but
        the packed positions `leaving_out`."""
        found = self._pairs.values_of(hashes)
        if leaving_out is not None:
            found = found[~np.isin(found, leaving_out)]
        return [(int(p >> _OFFSET_BITS), int(p & _OFFSET_MASK)) for p in found]

    def earlier(self, batch: Keys) -> list[tuple[int, int]]:
        """The positions of every earlier record of the batch's event ids (the batch's
        own left out): where the ledger holds them, if it does."""
        return self.positions_of(batch.hashes, leaving_out=batch.positions)


def _commits(
    spark: SparkSession, path: str, first: int, last: int
) -> list[tuple[int, tuple[tuple[str, int] | None, bool]]] | None:
    """For each ledger commit from `first` to `last`: its transaction id (appId,
    version) if it has one, and whether it adds data. None if the log no longer has them."""
    jvm: Any = spark._jvm
    out = []
    changes = lake.delta_log(spark, path).getChanges(first, last, jvm.scala.Option.empty(), False)
    while changes.hasNext():
        pair = changes.next()
        txn: tuple[str, int] | None = None
        adds_data = False
        actions = pair._2()
        for i in range(actions.size()):
            action = actions.apply(i)
            kind = action.getClass().getSimpleName()
            if kind == "SetTransaction":
                txn = (str(action.appId()), int(action.version()))
            elif kind == "AddFile" and action.dataChange():
                adds_data = True
        out.append((int(pair._1()), (txn, adds_data)))
    if [v for v, _ in out] != list(range(first, last + 1)):
        return None
    return out


def _local_commits(
    where: str, first: int, last: int
) -> list[tuple[int, tuple[tuple[str, int] | None, bool]]] | None:
    """`_commits` of a local ledger, read from its log's commit files."""
    out = []
    for version in range(first, last + 1):
        try:
            text = (Path(where) / "_delta_log" / f"{version:020d}.json").read_text("utf-8")
        except FileNotFoundError:
            return None
        txn: tuple[str, int] | None = None
        adds_data = False
        for action in map(json.loads, filter(None, text.splitlines())):
            if "txn" in action:
                txn = (str(action["txn"]["appId"]), int(action["txn"]["version"]))
            elif "add" in action and action["add"].get("dataChange", True):
                adds_data = True
        out.append((version, (txn, adds_data)))
    return out
