"""How every Kafka client of regauge reaches the brokers: one set of settings,
spelt for librdkafka (confluent-kafka: the producer, the admin, the lag and audit
readers) and for the Java client under Spark's Kafka source (`kafka.`-prefixed
options). A cluster with SASL or TLS needs only the REGAUGE_KAFKA_* variables.
"""

from __future__ import annotations

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
