"""Following a view as one user sees it, from the versions' change topics (docs/contract.md §9).

A subscriber reads the topic of the version the user is routed to (§4) and
applies its records in order: an upsert sets a row, a tombstone removes one.
It checks the route every few seconds; when a rollout moves the user, it
starts over on the new version's topic from its first record, so the copy
becomes the new version's whole table (a `reset`, then its rows) and then
follows its changes. With `from_start` the first version is read from its
first record too (the compacted topic holds every row's latest state);
without, only changes from now on. An erasure deletes and creates each live
version's topic again (docs/contract.md §8): the subscriber sees the topic's new id
and starts over the same way, so its copy loses the erased rows too.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from warehouse.base import kafka_conf, metrics, registry
from warehouse.base.settings import Settings
from warehouse.sql import versions

log = logging.getLogger(__name__)

ROUTE_EVERY_S = 2.0
# How long a consumer being replaced may take to close before it is left to finish
# on its own (see `_retire`).
CLOSE_WAIT_S = 5.0


@dataclass(frozen=True)
class Change:
    """One thing a subscriber saw: `reset` (the copy starts over, as `version`),
    `upsert` (a row set), `delete` (a row removed) or `waiting` (no live version)."""

    op: str
    view: str
    version: int | None
    key: dict[str, Any] | None = None
    row: dict[str, Any] | None = None
    gold_version: int | None = None

    def as_json(self) -> str:
        return json.dumps(
            {k: v for k, v in self.__dict__.items() if v is not None}, separators=(",", ":")
        )


@dataclass
class Copy:
    """A subscriber's local copy of the view: rows by key, as of `gold_version`."""

    version: int | None = None
    gold_version: int | None = None
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def apply(self, change: Change) -> None:
        if change.op in ("reset", "waiting"):
            self.version, self.gold_version, self.rows = change.version, None, {}
            return
        key = json.dumps(change.key, sort_keys=True)
        if change.op == "upsert" and change.row is not None:
            self.rows[key] = change.row
        elif change.op == "delete":
            self.rows.pop(key, None)
        self.gold_version = change.gold_version


def parse(
    view: str, version: int, key: bytes | None, value: bytes | None, gold: int | None = None
) -> Change:
    """A record of a view version's topic -> the change it says. `gold` is the gold
    commit from the record's header (a tombstone has no value to carry it in)."""
    parsed_key = json.loads(key) if key else {}
    if value is None:
        return Change("delete", view, version, parsed_key, None, gold)
    row = json.loads(value)
    return Change("upsert", view, version, parsed_key, row, row.pop("_gold_version", gold))


def header_commit(headers: Any) -> int | None:
    """The gold commit a record's `gold_version` header names, if it has one (librdkafka
    gives a consumed record's headers as a list of pairs)."""
    for name, raw in headers or []:
        if name == "gold_version" and raw:
            return int(raw)
    return None


def _retire(consumer: Consumer, topic: str) -> None:
    """Close a consumer without waiting on it for long. librdkafka's close can block
    for good when the consumer's topic was just deleted (confluentinc/librdkafka#4362,
    open): seen here as a subscriber that logged an erasure's new topic and then
    printed nothing more. Unassigning first is the workaround reported upstream; a
    close that still hangs is left in a daemon thread, and the subscriber goes on
    with a new consumer."""

    def close() -> None:
        try:
            consumer.unassign()
        except KafkaException as exc:
            log.debug("unassigning the old consumer of %s: %s", topic, exc)
        consumer.close()

    # Both in the thread: either may wait on librdkafka's main thread.
    closing = threading.Thread(target=close, name="subscriber-close", daemon=True)
    closing.start()
    closing.join(CLOSE_WAIT_S)
    if closing.is_alive():
        log.warning(
            "the old consumer of %s did not close within %.0f s (librdkafka#4362); "
            "going on without it",
            topic,
            CLOSE_WAIT_S,
        )


class Subscriber:
    """Reads one user's route and the topic it leads to; see the module."""

    def __init__(self, settings: Settings, view: str, user: str, *, from_start: bool) -> None:
        self.settings, self.view, self.user, self.from_start = settings, view, user, from_start
        self.version: int | None = None
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None
        self._topic_id: str | None = None
        self._route_at = 0.0

    def route(self) -> int | None:
        return versions.route(
            versions.versions(self.settings, self.view),
            versions.pins(self.settings, self.view),
            self.user,
        )

    def _assign(self, version: int, start: int) -> bool:
        """Read `version`'s topic from `start`; False while the topic does not exist yet."""
        topic = registry.view_topic(self.view, version)
        # A new consumer for every assignment: one that followed a topic deleted and
        # created again under the same name keeps the old topic's id in its metadata
        # and fetched nothing from the new one (the copy stayed empty after an erasure).
        if self._consumer is not None:
            _retire(self._consumer, topic)
            self._consumer = None
        consumer = self._consumer = Consumer(
            {
                **kafka_conf.client_conf(self.settings),
                # Assigned, never subscribed: the group only names the client.
                "group.id": f"regauge-subscriber-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return False
        self._topic_id = self._id_of(topic)
        consumer.assign([TopicPartition(topic, p, start) for p in sorted(meta.partitions)])
        return True

    def _id_of(self, topic: str) -> str | None:
        """The topic's id (None while it does not exist): a topic deleted and created
        again under the same name has a new one."""
        if self._admin is None:
            self._admin = AdminClient(kafka_conf.client_conf(self.settings))
        found = self._admin.describe_topics(TopicCollection([topic]), request_timeout=10)
        try:
            return str(found[topic].result().topic_id)
        except KafkaException:
            return None

    def _started_over(self) -> bool:
        """Whether the followed version's topic was created again since it was assigned."""
        if self.version is None or self._topic_id is None:
            return False
        now = self._id_of(registry.view_topic(self.view, self.version))
        if now is None or now == self._topic_id:
            return False
        log.info(
            "%s v%d's topic was created again: reading it from the start", self.view, self.version
        )
        return True

    def follow(self, emit: Callable[[Change], None], stop: threading.Event) -> None:
        """Emit every change the user's copy goes through until `stop` is set."""

        def counted(change: Change) -> None:
            emit(change)
            metrics.SUBSCRIBER_CHANGES.labels(self.view, self.user, change.op).inc()
            metrics.SUBSCRIBER_VERSION.labels(self.view, self.user).set(change.version or 0)

        self._follow(counted, stop)

    def _follow(self, emit: Callable[[Change], None], stop: threading.Event) -> None:
        first = True
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= self._route_at:
                    self._route_at = now + ROUTE_EVERY_S
                    try:
                        wanted = self.route()
                    except Exception as exc:
                        # PostgreSQL away for a moment: keep following the current route.
                        log.warning("cannot read %s's route (%s); trying again", self.user, exc)
                        wanted = self.version
                    if wanted != self.version or self._consumer is None or self._started_over():
                        if wanted is None:
                            if self.version is not None or first:
                                emit(Change("waiting", self.view, None))
                            self.version, first = None, False
                            stop.wait(ROUTE_EVERY_S)
                            continue
                        start = OFFSET_BEGINNING if (self.from_start or not first) else OFFSET_END
                        if not self._assign(wanted, start):
                            log.info("%s v%d has published nothing yet", self.view, wanted)
                            stop.wait(ROUTE_EVERY_S)
                            continue
                        if start == OFFSET_BEGINNING:
                            emit(Change("reset", self.view, wanted))
                        self.version, first = wanted, False
                if self._consumer is None or self.version is None:
                    stop.wait(ROUTE_EVERY_S)
                    continue
                msg = self._consumer.poll(0.5)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("%s: %s", msg.topic(), error)
                    continue
                if msg.topic() != registry.view_topic(self.view, self.version):
                    continue  # fetched before the move to another version
                gold = header_commit(msg.headers())
                emit(parse(self.view, self.version, msg.key(), msg.value(), gold))
                kind, published_ms = msg.timestamp()
                if kind != TIMESTAMP_NOT_AVAILABLE:
                    metrics.SUBSCRIBER_DELAY.labels(self.view, self.user).set(
                        max(0.0, time.time() - published_ms / 1000)
                    )
        finally:
            if self._consumer is not None:
                _retire(self._consumer, f"{self.view}'s topic")
                self._consumer = None
