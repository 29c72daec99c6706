"""Kafka, a single-node KRaft broker, and the admin helpers that make its topic."""

from __future__ import annotations

import base64
import logging
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from confluent_kafka.admin import AdminClient

from warehouse import sources
from warehouse.base import jvm, kafka_conf, registry
from warehouse.base.settings import Settings
from warehouse.ops.stack.base import INFRA, Service, _render, kept_secret
from warehouse.ops.stack.process import Proc, ServiceError, port_open

log = logging.getLogger(__name__)


class Kafka(Service):
    """A single-node Kafka 4 broker in KRaft mode, from Maven Central jars."""

    name = "kafka"
    priority = 200
    health_timeout = 90.0

    def ports(self) -> Sequence[int]:
        return [self.settings.kafka_port, self.settings.kafka_controller_port]

    def _java_base(self, heap: str = "1g") -> list[str]:
        jars = jvm.layout(self.settings).kafka_jars
        if not (jars / ".complete").is_file():
            raise ServiceError(f"Kafka jars are not fetched yet ({jars}): run `make setup`")
        return [
            jvm.java17(),
            "-Xms256m",
            f"-Xmx{heap}",
            "-XX:+UseG1GC",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            "-cp",
            f"{jars}/*",
        ]

    def procs(self) -> Sequence[Proc]:
        return [
            Proc(
                name="kafka",
                argv=[*self._java_base(), "kafka.Kafka", str(self.home / "server.properties")],
            )
        ]

    def _config(self) -> dict[str, object]:
        """The server.properties template and what fills it in."""
        s = self.settings
        return {
            "template": INFRA / "kafka" / "server.properties",
            "port": s.kafka_port,
            "controller_port": s.kafka_controller_port,
            "data_dir": self.home / "data",
            "partitions": s.kafka_partitions,
            "broker_password": self._broker_password(),
        }

    def _broker_password(self) -> str:
        return kept_secret(self.settings.state_dir / "secrets" / "kafka-broker")

    def _own_admin(self, bootstrap: str | None = None) -> AdminClient:
        """An admin client logged in as the node itself (PLAIN): it answers before
        the clients' SCRAM credential exists, which it then sets. `bootstrap`: one
        broker's address instead of the settings' list."""
        if not self.settings.kafka_sasl_mechanism:
            return kafka_admin(self.settings, bootstrap)
        return kafka_admin(
            replace(
                self.settings,
                kafka_sasl_mechanism="PLAIN",
                kafka_sasl_username="broker",
                kafka_sasl_password=self._broker_password(),
            ),
            bootstrap,
        )

    def set_client_login(self) -> None:
        """The clients' SCRAM credential, set (again) after every start: a broker
        formatted before regauge used SASL has none, and a changed secret applies."""
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        s = self.settings
        name = s.kafka_sasl_mechanism or ""
        if not name.startswith("SCRAM") or not s.kafka_sasl_username:
            return
        mechanism = getattr(ScramMechanism, name.replace("-", "_"))
        upsert = UserScramCredentialUpsertion(
            s.kafka_sasl_username,
            ScramCredentialInfo(mechanism, 8192),
            (s.kafka_sasl_password or "").encode(),
        )
        admin = self._own_admin()  # held: a client collected early fails its futures
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)

    def _cluster_id(self) -> str:
        return _kafka_cluster_id()

    def prepare(self) -> None:
        config = self._config()
        template = config.pop("template")
        assert isinstance(template, Path)
        data = self.home / "data"
        _render(template, self.home / "server.properties", **config)
        shutil.copyfile(INFRA / "kafka" / "log4j2.properties", self.home / "log4j2.properties")
        if (data / "meta.properties").is_file():
            return
        cluster_id = self._cluster_id()
        log.info("formatting Kafka storage in %s (cluster %s)", data, cluster_id)
        proc = subprocess.run(
            [
                *self._java_base(),
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",
                f"--config={self.home / 'server.properties'}",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ServiceError(f"kafka storage format failed:\n{proc.stdout}{proc.stderr}")

    def healthy(self) -> bool:
        if not port_open(self.settings.kafka_port):
            return False
        try:
            md = self._own_admin().list_topics(timeout=3)
        except Exception:
            return False
        return bool(md.brokers)

    def after_start(self) -> None:
        self.set_client_login()
        ensure_source_topics(self.settings)


def _kafka_cluster_id() -> str:
    """A random cluster id as Kafka makes them: 22 base64url characters, never a
    leading '-', which the storage tool's argument parser would take for an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def kafka_admin(settings: Settings, bootstrap: str | None = None) -> AdminClient:
    # A quiet logger: while the broker starts, librdkafka would print every refusal.
    quiet = logging.getLogger("regauge.kafka-admin")
    quiet.setLevel(logging.CRITICAL)
    conf = kafka_conf.client_conf(settings)
    if bootstrap:
        conf["bootstrap.servers"] = bootstrap
    return AdminClient(conf, logger=quiet)


def ensure_topic(
    settings: Settings,
    topic: str = registry.TOPIC,
    config: dict[str, str] | None = None,
    partitions: int | None = None,
) -> None:
    """Create a topic (by default the event topic) with `partitions` (by default the
    settings' count), the settings' replication and `config`, if it does not exist."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    admin = kafka_admin(settings)
    if topic in admin.list_topics(timeout=10).topics:
        return
    futures = admin.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=partitions or settings.kafka_partitions,
                replication_factor=settings.kafka_replication,
                config=config or {},
            )
        ]
    )
    try:
        futures[topic].result(timeout=30)
        log.info(
            "created topic %s with %d partitions, %d replicas each",
            topic,
            partitions or settings.kafka_partitions,
            settings.kafka_replication,
        )
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise


def ensure_source_topics(settings: Settings) -> None:
    """Every declared source's topic (docs/contract.md §10: source `S` reads `S.events`)."""
    for name in sorted(sources.discover()):
        ensure_topic(settings, registry.source_tables(name).topic)


def ensure_view_topic(settings: Settings, view: str, version: int) -> None:
    """The compacted topic a live view version publishes its changes to (docs/contract.md §9).

    One partition: a subscriber then reads the commits in the order they were made,
    so its copy is always the table as of one commit.
    """
    ensure_topic(
        settings, registry.view_topic(view, version), {"cleanup.policy": "compact"}, partitions=1
    )


def drop_view_topic(settings: Settings, view: str, version: int) -> list[str]:
    """Delete a retired version's topic and its publisher's mark: a version built again
    under the same number (a new table, its commits counted from 0) starts afresh."""
    from confluent_kafka import KafkaException

    admin = kafka_admin(settings)
    topic = registry.view_topic(view, version)
    group = registry.view_publisher_group(view, version)
    done = []
    if topic in admin.list_topics(timeout=30).topics:
        admin.delete_topics([topic])[topic].result(timeout=30)
        done.append(f"topic {topic} deleted")
    try:
        admin.delete_consumer_groups([group])[group].result(timeout=30)
        done.append(f"its publisher's mark ({group}) deleted")
    except KafkaException as exc:
        if "GROUP_ID_NOT_FOUND" not in str(exc):
            raise
    return done


def view_topics(settings: Settings) -> list[tuple[str, int]]:
    """(view, version) of every view version's change topic the broker holds, registered
    or not, live or not."""
    prefix = registry.view_topic("", 0).removesuffix("_v0")
    found = []
    for topic in kafka_admin(settings).list_topics(timeout=30).topics:
        view, sep, version = topic.removeprefix(prefix).rpartition("_v")
        if topic.startswith(prefix) and sep and view and version.isdigit():
            found.append((view, int(version)))
    return sorted(found)


def topic_config(settings: Settings, topic: str) -> dict[str, str]:
    """A topic's configuration as the broker reports it."""
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    # Held in a name: a client collected before its future resolves fails it (_DESTROY).
    admin = kafka_admin(settings)
    described = admin.describe_configs([resource])[resource].result(timeout=30)
    return {name: entry.value for name, entry in described.items()}
