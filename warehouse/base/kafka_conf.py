"""How every Kafka client of regauge reaches the brokers: one set of settings,
spelt for librdkafka (confluent-kafka: the producer, the admin, the lag and audit
readers) and for the Java client under Spark's Kafka source (`kafka.`-prefixed
options). A cluster with SASL or TLS needs only the REGAUGE_KAFKA_* variables.
"""

from __future__ import annotations

import logging
import re
import time

from warehouse.base.settings import Settings

# SASL mechanisms and the Java login module each one takes.
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


# librdkafka's configuration values, as confluent-kafka types them.
Conf = dict[str, str | int | float | bool]


def client_conf(settings: Settings) -> Conf:
    """librdkafka's settings: the brokers and their security."""
    s = settings
    conf: Conf = {"bootstrap.servers": s.kafka_bootstrap}
    if s.kafka_security_protocol != "PLAINTEXT":
        conf["security.protocol"] = s.kafka_security_protocol
    if s.kafka_sasl_mechanism:
        conf |= {
            "sasl.mechanisms": s.kafka_sasl_mechanism,
            "sasl.username": s.kafka_sasl_username or "",
            "sasl.password": s.kafka_sasl_password or "",
        }
    if s.kafka_ssl_ca_file:
        conf["ssl.ca.location"] = s.kafka_ssl_ca_file
    return conf


def spark_options(settings: Settings) -> dict[str, str]:
    """The same, as options of Spark's Kafka source and sink."""
    s = settings
    options = {"kafka.bootstrap.servers": s.kafka_bootstrap}
    if s.kafka_security_protocol != "PLAINTEXT":
        options["kafka.security.protocol"] = s.kafka_security_protocol
    if s.kafka_sasl_mechanism:
        module = _LOGIN_MODULES[s.kafka_sasl_mechanism]
        user = _jaas_quote(s.kafka_sasl_username or "")
        password = _jaas_quote(s.kafka_sasl_password or "")
        options |= {
            "kafka.sasl.mechanism": s.kafka_sasl_mechanism,
            "kafka.sasl.jaas.config": (
                f'{module} required username="{user}" password="{password}";'
            ),
        }
    if s.kafka_ssl_ca_file:
        # The Java client reads a PEM file as a trust store since Kafka 2.7.
        options |= {
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": s.kafka_ssl_ca_file,
        }
    return options


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


# How long a repeated librdkafka message stays quiet after it was logged once.
REPEAT_QUIET_S = 30.0
_NUMBERS = re.compile(r"\d+")


class _Repeats(logging.Filter):
    """Lets a librdkafka message through once per REPEAT_QUIET_S: while a broker is
    down, every client says "Connect to ... failed: Connection refused" several
    times a second, one line per broker connection, differing only in numbers."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = _NUMBERS.sub("#", record.getMessage())
        now = time.monotonic()
        if now - self._last.get(key, -REPEAT_QUIET_S) < REPEAT_QUIET_S:
            return False
        self._last[key] = now
        return True


def client_logger(name: str) -> logging.Logger:
    """The logger a confluent-kafka client is given (`logger=`): librdkafka's lines
    then go through logging, with timestamps and the client's name, instead of
    straight to stderr, and a repeated one is said once per REPEAT_QUIET_S."""
    logger = logging.getLogger(f"regauge.kafka.{name}")
    if not any(isinstance(f, _Repeats) for f in logger.filters):
        logger.addFilter(_Repeats())
    return logger
