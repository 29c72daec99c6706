"""The one place that knows hosts, ports and paths.

A profile is chosen by ``REGAUGE_PROFILE`` (``local`` by default, or ``cluster``).
Every individual value can also be overridden by its own ``REGAUGE_*`` variable,
so a port clash or a different lake location never needs a code change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

from warehouse.base import secret

REPO_ROOT = Path(__file__).resolve().parents[2]

PROFILES = ("local", "cluster")


class SettingsError(ValueError):
    """A profile or override that cannot be used."""


@dataclass(frozen=True)
class Versions:
    """Component versions; the POMs under infra/jvm and pyproject.toml pin the same."""

    spark: str = "4.2.0"
    delta: str = "4.4.0"
    kafka: str = "4.1.1"
    trino: str = "476"


@dataclass(frozen=True)
class Settings:
    """Everything a job, a service or a test needs to find the others."""

    profile: str
    # Where state, logs and pids of locally started services live (git-ignored).
    state_dir: Path
    # JVM artifacts and Trino fetched once from Maven Central, outside the repo.
    cache_dir: Path
    # Root of the lake; a directory locally, an s3a:// URI on a cluster.
    lake_root: str
    spark_master: str
    spark_driver_memory: str
    spark_shuffle_partitions: int
    kafka_bootstrap: str
    kafka_controller_port: int
    kafka_partitions: int
    trino_host: str
    trino_port: int
    trino_heap: str
    postgres_host: str
    postgres_port: int
    postgres_user: str
    postgres_password: str
    postgres_db: str
    airflow_db: str
    airflow_port: int
    trigger_interval: str
    # Kafka records per ingest micro-batch at most: a backlog (after an outage, or a
    # first start on a long topic) is read in bounded batches, not one that outgrows memory.
    ingest_max_records_per_batch: int = 250_000
    # Copies of each partition of the event topic: 1 on one broker; 3 on a
    # cluster, whose brokers also require 2 in sync before a write counts.
    kafka_replication: int = 1
    # How clients reach a secured Kafka (warehouse.base.kafka_conf spells them for
    # librdkafka and for Spark): PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; a SASL
    # mechanism of PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; the CA (PEM) for TLS.
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None
    kafka_ssl_ca_file: str | None = None
    # The address every server regauge starts listens on (Trino, Airflow, the
    # Spark drivers and their UIs; Kafka and PostgreSQL are on 127.0.0.1 in their
    # own config). Loopback locally, so nothing is reachable from the network:
    # Trino trusts the user name a client sends, and the Spark UI can kill jobs.
    # None on a cluster, where a driver must be reachable by its executors.
    bind_host: str | None = "127.0.0.1"
    # The audit fails when a partition's oldest record not yet in bronze is older
    # than this: ingest has stalled (dead, stuck, or far behind), and "not copied
    # yet" has become "not being copied".
    ingest_lag_alert_s: float = 300.0
    # How long `regauge maintain` keeps the files a table's newer versions no longer
    # use (Delta's VACUUM retention): time travel and a lagging change-feed reader
    # need them. Longer for a table while some reader needs an older version
    # (spark_jobs.engine.maintenance); Delta's own default is 7 days.
    maintenance_retention_hours: float = 168.0
    # How long Airflow keeps its records of runs (and their task logs) before the
    # daily regauge_maintenance deletes them (`regauge clean-airflow`). The
    # watchdog alone makes 1,440 runs a day.
    airflow_keep_days: float = 14.0
    # Tests only: an erasure fails right after it records this step as completed
    # (warehouse.ops.erasure `_done`), to show what stays stopped and what a rerun
    # resumes.
    erasure_fault: str | None = None
    # Where every Spark application regauge starts writes Spark's event log (plain
    # JSON lines: every job, stage and task with its duration and micro-batch),
    # to profile a slow batch with; None writes none. `make bench` sets it.
    spark_event_log_dir: str | None = None
    # More JVM options for every Spark driver regauge starts, after its own: to
    # profile one, e.g. "-XX:NativeMemoryTracking=summary" for `jcmd PID
    # VM.native_memory summary`, or a heap dump on OutOfMemoryError.
    spark_driver_java_options: str | None = None
    # JVM options for the drivers of commands that run once and exit (`regauge
    # audit`, `maintain`, `dbt`, `forget`, `ingest-once`, retire's archive), before
    # spark_driver_java_options. The JIT's first tier only: such a driver spends
    # much of its CPU compiling code it runs for a minute or two. `regauge audit`
    # on 2 cores took 45-62 CPU-s with it against 84-85 without (the same lake,
    # alternated). A command that runs for long on a large lake may run faster
    # without it: set it to "" there. The first tier alone gets a 48 MB code cache,
    # which `regauge maintain` filled after 27 s; HotSpot then turns the compiler off
    # and the rest runs interpreted. With 240 MB (the tiered default; only what is
    # used is committed) maintain on a test lake took 83-86 s and 99-102 CPU-s of
    # the machine against 102-115 s and 136-154 (runs alternated, stop 87).
    spark_one_shot_java_options: str = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
    # The view host's heap (ingest, every live stream, and Airflow's replay and
    # validate tasks through Spark Connect), apart from spark_driver_memory, which
    # every other Spark driver gets. Sampled every 2 s in `make bench`'s freshness
    # phase with a 4g heap, G1 kept the old generation at 0.9-2.3 GiB, never
    # needing a full collection, and committed up to 3.5 GiB, so the JVM's resident
    # size reached 4.3-5.2 GiB: the largest part of the stack's peak (8.5 GiB
    # against the 8 GiB target in the 2026-11-30 run).
    view_host_memory: str = "3g"
    # The view host's Prometheus endpoint (`regauge status` lists it), on bind_host.
    metrics_port: int = 9464
    # The view host's Spark Connect endpoint on bind_host, through which Airflow's
    # replay and validate tasks run their Spark work in the host's application
    # instead of starting a JVM each (warehouse.ops.sessions); 0 turns it off.
    spark_connect_port: int = 15002
    # Per application on a Spark cluster (ignored by local[N]): without a cap, the
    # first application (the view host) would take every core of the standalone
    # master and leave none for Airflow's tasks. One executor of 2 cores, not two
    # of 1: a JVM fewer to start and warm per application. On the one-box
    # cluster the smoke test's two applications of the time took 213 s instead of 328 s
    # (docs/SCALING.md).
    spark_executor_memory: str = "2g"
    spark_executor_cores: int = 2
    spark_cores_max: int = 2
    # The object store of an s3a:// lake. None: AWS's own endpoint and its
    # default credential chain. An endpoint of one's own (MinIO, S3Proxy, Ceph) is
    # addressed path-style, as S3-compatible servers expect.
    s3_endpoint: str | None = None
    s3_region: str = "us-east-1"
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    # S3A's check that an object did not change while it was read or copied
    # (fs.s3a.change.detection.mode): "server" compares ETags, which every object
    # must then carry. Hadoop's advice for a store whose HEAD of some objects has
    # none (S3Proxy's filesystem backend, for a folder's marker) is "none", which
    # regauge pairs with fs.s3a.change.detection.version.required=false.
    s3_change_detection: str = "server"
    # Trino over HTTPS with a password: the user regauge logs in as; other users
    # (analysts) are then impersonated by it, which Trino's rules must allow.
    trino_scheme: str = "http"
    trino_login: str = "regauge"
    trino_password: str | None = None
    # The CA (PEM) that signed Trino's certificate; None: the system's CAs.
    trino_ca_file: str | None = None
    # An Airflow regauge did not start (a cluster's): its API's URL, and the user
    # and password its REST API takes. None: the one `regauge up` started, with
    # the admin password it generated.
    airflow_base_url: str | None = None
    airflow_user: str = "admin"
    airflow_password: str | None = None
    versions: Versions = field(default_factory=Versions)

    @property
    def kafka_port(self) -> int:
        return int(self.kafka_bootstrap.rsplit(":", 1)[1])

    @property
    def trino_url(self) -> str:
        return f"{self.trino_scheme}://{self.trino_host}:{self.trino_port}"

    @property
    def airflow_url(self) -> str:
        if self.airflow_base_url:
            return self.airflow_base_url.rstrip("/")
        return f"http://{self.bind_host or '127.0.0.1'}:{self.airflow_port}"

    @property
    def is_local(self) -> bool:
        return self.profile == "local"

    @property
    def lake_is_local(self) -> bool:
        """Whether the lake is a folder on this machine, not on an object store (s3a://,
        abfss://, ...): the local Trino and Spark Connect's clients need one."""
        return "://" not in self.lake_root

    def delta_rs(self, path: str) -> tuple[str, dict[str, str]]:
        """A lake table's location and storage options for delta-rs (the `deltalake`
        package), which reads a Delta log without Spark. It reads s3a:// as S3, but
        none of Hadoop's fs.s3a settings: the object store and keys go as options."""
        if not path.startswith("s3a://"):
            return path, {}
        options = {"AWS_REGION": self.s3_region}
        if self.s3_endpoint:
            options["AWS_ENDPOINT_URL"] = self.s3_endpoint
            # delta-rs refuses plain HTTP unless told (S3Proxy on the one-box cluster).
            if self.s3_endpoint.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        if self.s3_access_key and self.s3_secret_key:
            options["AWS_ACCESS_KEY_ID"] = self.s3_access_key
            options["AWS_SECRET_ACCESS_KEY"] = self.s3_secret_key
        return path, options

    def postgres_dsn(self, db: str | None = None, *, password: bool = True) -> str:
        """The DSN to connect with; `password=False` for one to show (a status line,
        a log), which must not print the secret."""
        secret = f":{self.postgres_password}" if password else ""
        return (
            f"postgresql://{self.postgres_user}{secret}"
            f"@{self.postgres_host}:{self.postgres_port}/{db or self.postgres_db}"
        )


def _local(env: dict[str, str]) -> Settings:
    state = Path(env.get("REGAUGE_STATE_DIR", REPO_ROOT / ".state"))
    return Settings(
        profile="local",
        state_dir=state,
        cache_dir=Path(env.get("REGAUGE_CACHE_DIR", Path.home() / ".cache" / "regauge")),
        lake_root=str(REPO_ROOT / "warehouse" / "data" / "lake"),
        spark_master="local[2]",
        spark_driver_memory="4g",
        # Two cores: more shuffle partitions only add scheduling overhead.
        spark_shuffle_partitions=4,
        kafka_bootstrap="127.0.0.1:9092",
        kafka_controller_port=9093,
        kafka_partitions=4,
        # The local broker takes no client that has not logged in (SCRAM), so no
        # other local account can forge, delete or read events (issue 68, A.5).
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="regauge",
        kafka_sasl_password=env.get("REGAUGE_KAFKA_SASL_PASSWORD")
        or secret.kept(state / "secrets" / "kafka"),
        trino_host="127.0.0.1",
        trino_port=8080,
        trino_heap="2G",
        postgres_host="127.0.0.1",
        # Not 5432, so a system PostgreSQL on the default port never clashes.
        postgres_port=5433,
        postgres_user="regauge",
        # Made once per state folder and kept owner-only: a password written here
        # would let every local account log in over 127.0.0.1.
        postgres_password=env.get("REGAUGE_POSTGRES_PASSWORD")
        or secret.kept(state / "secrets" / "postgres"),
        postgres_db="regauge",
        airflow_db="airflow",
        airflow_port=8081,
        trigger_interval="1 second",
    )


def _cluster(env: dict[str, str]) -> Settings:
    """Same names, other places: everything comes from the environment."""
    base = _local(env)
    required = {
        "REGAUGE_SPARK_MASTER": "spark://host:7077 or k8s://…",
        "REGAUGE_KAFKA_BOOTSTRAP": "broker1:9092,broker2:9092",
        "REGAUGE_LAKE_ROOT": "s3a://bucket/lake",
        "REGAUGE_TRINO_HOST": "trino.example.internal",
        "REGAUGE_POSTGRES_HOST": "postgres.example.internal",
    }
    missing = [f"{k} (e.g. {v})" for k, v in required.items() if not env.get(k)]
    if missing:
        raise SettingsError("cluster profile needs: " + "; ".join(missing))
    return replace(
        base,
        profile="cluster",
        spark_master=env["REGAUGE_SPARK_MASTER"],
        kafka_bootstrap=env["REGAUGE_KAFKA_BOOTSTRAP"],
        # A cluster's brokers say how they are secured (REGAUGE_KAFKA_SECURITY_*).
        kafka_security_protocol="PLAINTEXT",
        kafka_sasl_mechanism=None,
        kafka_sasl_username=None,
        kafka_sasl_password=None,
        lake_root=env["REGAUGE_LAKE_ROOT"],
        trino_host=env["REGAUGE_TRINO_HOST"],
        postgres_host=env["REGAUGE_POSTGRES_HOST"],
        spark_shuffle_partitions=200,
        bind_host=None,
    )


# Per-value overrides; applied after the profile so they win in both.
OVERRIDES: dict[str, tuple[str, type]] = {
    "REGAUGE_LAKE_ROOT": ("lake_root", str),
    "REGAUGE_SPARK_MASTER": ("spark_master", str),
    "REGAUGE_SPARK_DRIVER_MEMORY": ("spark_driver_memory", str),
    "REGAUGE_SPARK_SHUFFLE_PARTITIONS": ("spark_shuffle_partitions", int),
    "REGAUGE_KAFKA_BOOTSTRAP": ("kafka_bootstrap", str),
    "REGAUGE_KAFKA_CONTROLLER_PORT": ("kafka_controller_port", int),
    "REGAUGE_KAFKA_PARTITIONS": ("kafka_partitions", int),
    "REGAUGE_KAFKA_REPLICATION": ("kafka_replication", int),
    "REGAUGE_KAFKA_SECURITY_PROTOCOL": ("kafka_security_protocol", str),
    "REGAUGE_KAFKA_SASL_MECHANISM": ("kafka_sasl_mechanism", str),
    "REGAUGE_KAFKA_SASL_USERNAME": ("kafka_sasl_username", str),
    "REGAUGE_KAFKA_SASL_PASSWORD": ("kafka_sasl_password", str),
    "REGAUGE_KAFKA_SSL_CA_FILE": ("kafka_ssl_ca_file", str),
    "REGAUGE_TRINO_HOST": ("trino_host", str),
    "REGAUGE_TRINO_PORT": ("trino_port", int),
    "REGAUGE_TRINO_HEAP": ("trino_heap", str),
    "REGAUGE_POSTGRES_HOST": ("postgres_host", str),
    "REGAUGE_POSTGRES_PORT": ("postgres_port", int),
    "REGAUGE_POSTGRES_PASSWORD": ("postgres_password", str),
    "REGAUGE_AIRFLOW_PORT": ("airflow_port", int),
    "REGAUGE_AIRFLOW_URL": ("airflow_base_url", str),
    "REGAUGE_AIRFLOW_USER": ("airflow_user", str),
    "REGAUGE_AIRFLOW_PASSWORD": ("airflow_password", str),
    "REGAUGE_TRIGGER_INTERVAL": ("trigger_interval", str),
    "REGAUGE_INGEST_MAX_RECORDS_PER_BATCH": ("ingest_max_records_per_batch", int),
    "REGAUGE_BIND_HOST": ("bind_host", str),
    "REGAUGE_INGEST_LAG_ALERT_S": ("ingest_lag_alert_s", float),
    "REGAUGE_MAINTENANCE_RETENTION_HOURS": ("maintenance_retention_hours", float),
    "REGAUGE_AIRFLOW_KEEP_DAYS": ("airflow_keep_days", float),
    "REGAUGE_ERASURE_FAULT": ("erasure_fault", str),
    "REGAUGE_SPARK_EVENT_LOG_DIR": ("spark_event_log_dir", str),
    "REGAUGE_SPARK_DRIVER_JAVA_OPTIONS": ("spark_driver_java_options", str),
    "REGAUGE_SPARK_ONE_SHOT_JAVA_OPTIONS": ("spark_one_shot_java_options", str),
    "REGAUGE_VIEW_HOST_MEMORY": ("view_host_memory", str),
    "REGAUGE_METRICS_PORT": ("metrics_port", int),
    "REGAUGE_SPARK_CONNECT_PORT": ("spark_connect_port", int),
    "REGAUGE_SPARK_EXECUTOR_MEMORY": ("spark_executor_memory", str),
    "REGAUGE_SPARK_EXECUTOR_CORES": ("spark_executor_cores", int),
    "REGAUGE_SPARK_CORES_MAX": ("spark_cores_max", int),
    "REGAUGE_S3_ENDPOINT": ("s3_endpoint", str),
    "REGAUGE_S3_REGION": ("s3_region", str),
    "REGAUGE_S3_ACCESS_KEY": ("s3_access_key", str),
    "REGAUGE_S3_SECRET_KEY": ("s3_secret_key", str),
    "REGAUGE_S3_CHANGE_DETECTION": ("s3_change_detection", str),
    "REGAUGE_TRINO_SCHEME": ("trino_scheme", str),
    "REGAUGE_TRINO_LOGIN": ("trino_login", str),
    "REGAUGE_TRINO_PASSWORD": ("trino_password", str),
    "REGAUGE_TRINO_CA_FILE": ("trino_ca_file", str),
}


def _one_of(variable: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SettingsError(f"{variable}={value!r}: expected one of {', '.join(choices)}")


def load(env: dict[str, str] | None = None) -> Settings:
    """Build the settings for the profile named in the environment."""
    env = dict(os.environ if env is None else env)
    profile = env.get("REGAUGE_PROFILE", "local")
    if profile not in PROFILES:
        raise SettingsError(f"REGAUGE_PROFILE={profile!r}: expected one of {', '.join(PROFILES)}")
    settings = _local(env) if profile == "local" else _cluster(env)
    changes: dict[str, object] = {}
    for var, (attr, kind) in OVERRIDES.items():
        if var in env and env[var] != "":
            try:
                changes[attr] = kind(env[var])
            except ValueError as exc:
                raise SettingsError(f"{var}={env[var]!r} is not a valid {kind.__name__}") from exc
    settings = replace(settings, **changes)  # type: ignore[arg-type]
    if not settings.kafka_security_protocol.startswith("SASL") and (
        "kafka_sasl_mechanism" not in changes
    ):
        # A Kafka of one's own without SASL: the local broker's login does not apply.
        settings = replace(
            settings, kafka_sasl_mechanism=None, kafka_sasl_username=None, kafka_sasl_password=None
        )
    _one_of(
        "REGAUGE_KAFKA_SECURITY_PROTOCOL",
        settings.kafka_security_protocol,
        ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
    )
    if settings.kafka_sasl_mechanism:
        _one_of(
            "REGAUGE_KAFKA_SASL_MECHANISM",
            settings.kafka_sasl_mechanism,
            ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
        )
    _one_of(
        "REGAUGE_S3_CHANGE_DETECTION",
        settings.s3_change_detection,
        ("server", "client", "warn", "none"),
    )
    if settings.trino_scheme not in ("http", "https"):
        raise SettingsError(f"REGAUGE_TRINO_SCHEME={settings.trino_scheme!r}: http or https")
    if settings.trino_password and settings.trino_scheme != "https":
        # Trino refuses a password over plain HTTP; say so before a query is sent.
        raise SettingsError("REGAUGE_TRINO_PASSWORD needs REGAUGE_TRINO_SCHEME=https")
    return settings


@cache
def get() -> Settings:
    """The settings of this process (read once from the environment)."""
    return load()
