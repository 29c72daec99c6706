"""One set of Kafka security settings, spelt for librdkafka and for Spark's Kafka source."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from warehouse.base import kafka_conf
from warehouse.base.settings import SettingsError, load


def test_plaintext_needs_nothing_but_the_brokers():
    s = load(
        {"REGAUGE_KAFKA_BOOTSTRAP": "a:9092,b:9092", "REGAUGE_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"}
    )
    assert kafka_conf.client_conf(s) == {"bootstrap.servers": "a:9092,b:9092"}
    assert kafka_conf.spark_options(s) == {"kafka.bootstrap.servers": "a:9092,b:9092"}


def test_sasl_over_tls_reaches_both_clients():
    s = load(
        {
            "REGAUGE_KAFKA_BOOTSTRAP": "k:9093",
            "REGAUGE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "REGAUGE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "REGAUGE_KAFKA_SASL_USERNAME": "regauge",
            "REGAUGE_KAFKA_SASL_PASSWORD": 'p"w',
            "REGAUGE_KAFKA_SSL_CA_FILE": "/etc/ca.pem",
        }
    )
    assert kafka_conf.client_conf(s) == {
        "bootstrap.servers": "k:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "regauge",
        "sasl.password": 'p"w',
        "ssl.ca.location": "/etc/ca.pem",
    }
    spark = kafka_conf.spark_options(s)
    assert spark["kafka.security.protocol"] == "SASL_SSL"
    assert spark["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert spark["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="regauge" password="p\\"w";'
    )
    assert spark["kafka.ssl.truststore.location"] == "/etc/ca.pem"
    assert spark["kafka.ssl.truststore.type"] == "PEM"


@pytest.mark.parametrize(
    ("var", "value"),
    [("REGAUGE_KAFKA_SECURITY_PROTOCOL", "TLS"), ("REGAUGE_KAFKA_SASL_MECHANISM", "GSSAPI")],
)
def test_an_unknown_protocol_or_mechanism_is_refused(var: str, value: str):
    with pytest.raises(SettingsError, match=var):
        load({var: value})


def test_a_client_logger_says_a_repeated_line_once(caplog, monkeypatch):
    clock = iter([100.0, 100.2, 100.3, 131.0])
    # Only kafka_conf's clock: patching time.monotonic itself would hand these
    # values to every other thread of the test worker too.
    monkeypatch.setattr(kafka_conf, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    logger = kafka_conf.client_logger("test-repeats")
    refused = (
        "127.0.0.1:9092/{}: Connect to ipv4#127.0.0.1:9092 failed (after {}ms in state CONNECT)"
    )
    with caplog.at_level("ERROR", logger=logger.name):
        logger.error(refused.format(1, 0))
        logger.error(refused.format(1, 4))  # the same but for its numbers: quiet
        logger.error("Disconnected: connection reset by peer")  # another line
        logger.error(refused.format(2, 0))  # 31 s after the first: said again
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        refused.format(1, 0),
        "Disconnected: connection reset by peer",
        refused.format(2, 0),
    ]
    assert kafka_conf.client_logger("test-repeats") is logger and len(logger.filters) == 1
