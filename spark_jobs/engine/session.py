"""The one Spark session factory, used by every job and every test."""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs.engine import class_archive, local_fs
from warehouse.base import jvm
from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.base.settings import get as get_settings

LOG_CONFIG = REPO_ROOT / "infra" / "spark" / "log4j2.properties"


# Plans evaluated without generated code: for small, frequent batches, whose
# literals (time ranges, positions) would otherwise make every batch compile
# (Janino) and JIT-compile classes of its own (`runner.LIVE_SESSION_CONF`).
INTERPRETED_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


# A live batch's plans, with few shuffle partitions, run without adaptive query
# execution: AQE runs each shuffle stage of a plan as a Spark job of its own and
# re-plans between them, which pays on large shuffles and not on a batch's few
# hours, sessions or ids. Issue 67's spike (2026-12-03, a scratch lake, 200 events
# a round, one live view at a time): a live view's jobs per round went 45 -> 28
# (cart_sessions), 31 -> 21 (revenue_hourly v1) and 48 -> 33 (v2), JVM CPU 0-15 %
# less; a recompute of v2's hours alone, 1.8 -> 1.2 CPU-s. Without AQE every
# shuffle has spark.sql.shuffle.partitions partitions: 4 on one machine; a
# cluster's 200 want AQE to coalesce them.
AQE = "spark.sql.adaptive.enabled"
NO_AQE_UP_TO_PARTITIONS = 8


def few_shuffles_conf(spark: SparkSession) -> dict[str, str]:
    """Settings for a live batch's plans in `spark`: AQE off where its shuffles have few
    partitions (a machine's), as the live views' sessions run (`runner.live_session`)
    and ingest's classification of a batch (`silver._settle`); none on a cluster."""
    if int(spark.conf.get("spark.sql.shuffle.partitions") or 200) <= NO_AQE_UP_TO_PARTITIONS:
        return {AQE: "false"}
    return {}


def build_session(
    app_name: str = "regauge",
    settings: Settings | None = None,
    *,
    ui: bool = True,
    extra_conf: dict[str, str] | None = None,
    extra_java_options: str | None = None,
    one_shot: bool = False,
) -> SparkSession:
    """A Spark session with Delta, the Kafka source and UTC everywhere.

    Jars come from the cache `make setup` filled, passed explicitly so no run
    resolves anything over the network. The driver's JVM maps the class-data
    archive `make setup` made, unless `extra_java_options` is given instead.
    `one_shot`: the driver of a command that runs once and exits, which gets
    `Settings.spark_one_shot_java_options` (the JIT's first tier only).
    """
    s = settings or get_settings()
    # Spark 4.2 needs Java 17's jdk.incubator.vector; never pick up another JVM. A
    # cluster's driver machine may have its own JDK instead of Debian's.
    try:
        os.environ["JAVA_HOME"] = jvm.java17_home()
    except jvm.SetupError:
        if s.is_local or not os.environ.get("JAVA_HOME"):
            raise
    bind: dict[str, str] = {}
    if s.bind_host:
        # The UI's server binds to SPARK_LOCAL_IP, read from the JVM's environment
        # (no spark.* setting reaches it), else to every interface; the driver's
        # RPC and block manager bind to spark.driver.bindAddress.
        os.environ["SPARK_LOCAL_IP"] = s.bind_host
        bind = {"spark.driver.bindAddress": s.bind_host, "spark.driver.host": s.bind_host}
    events: dict[str, str] = {}
    if s.spark_event_log_dir:
        if "://" not in s.spark_event_log_dir:  # a local folder; Spark will not make it
            Path(s.spark_event_log_dir).mkdir(parents=True, exist_ok=True)
        events = {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": s.spark_event_log_dir,
            # Plain JSON lines, so jq or a few lines of Python can read them.
            "spark.eventLog.compress": "false",
        }
    conf = {
        "spark.master": s.spark_master,
        **_cluster_conf(s),
        **_class_path_conf(local_fs.session_conf(s.spark_master), _object_store_conf(s)),
        **events,
        **bind,
        "spark.driver.memory": s.spark_driver_memory,
        "spark.jars": ",".join(jvm.spark_jars(s)),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": (
            f"-Duser.timezone=UTC -Dlog4j2.configurationFile={LOG_CONFIG} "
            + (class_archive.java_option() if extra_java_options is None else extra_java_options)
            + (f" {s.spark_one_shot_java_options}" if one_shot else "")
            + f" {s.spark_driver_java_options or ''}"
        ).strip(),
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.sql.shuffle.partitions": str(s.spark_shuffle_partitions),
        # Delta rebuilds a table's state after every commit (e.g. for txnAppId
        # checks) with this many tasks. Its default of 50 costs seconds per commit
        # on few cores; regauge's logs are small, and one task beat four: a 2,000
        # event silver batch took 6.4 s instead of 7.7 s, alone on 2 cores. A
        # cluster's tables and cores are larger: there it follows the shuffle.
        "spark.databricks.delta.snapshotPartitions": (
            "1" if s.is_local else str(s.spark_shuffle_partitions)
        ),
        "spark.ui.enabled": str(ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        # The UI shows; it does not kill jobs or stages.
        "spark.ui.killEnabled": "false",
        # Prometheus text on the UI's port: /metrics/prometheus (the driver's
        # metrics, with each streaming query's rates and latency) and
        # /metrics/executors/prometheus. `regauge status` lists the view host's.
        "spark.ui.prometheus.enabled": "true",
        "spark.sql.streaming.metricsEnabled": "true",
        "spark.metrics.conf.*.sink.prometheusServlet.class": (
            "org.apache.spark.metrics.sink.PrometheusServlet"
        ),
        "spark.metrics.conf.*.sink.prometheusServlet.path": "/metrics/prometheus",
        # Tables written here must stay readable by Trino 476: no deletion vectors
        # or other features until a test shows Trino reads them.
        "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
        **(extra_conf or {}),
    }
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if s.s3_access_key and s.s3_secret_key and s.lake_root.startswith("s3a://"):
        # Set in the running JVM, not as spark.* settings: PySpark passes those to
        # spark-submit on its command line, where any local user could read the
        # secret (ps). Tasks carry the driver's Hadoop configuration to executors.
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        hadoop.set("fs.s3a.access.key", s.s3_access_key)
        hadoop.set("fs.s3a.secret.key", s.s3_secret_key)
    return spark


# Spark Connect's server as a plugin of an application that runs anyway (the view
# host): clients then run their Spark work in its JVM, paying a gRPC session
# instead of a JVM's start and warm-up (about 20 CPU-s on 2 cores).
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
# Read by the server (and by a client without ;token= in its URL). Passed in the
# environment, not as a spark.* setting: those go on spark-submit's command line.
CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"


def connect_conf(host: str, port: int) -> dict[str, str]:
    """The settings that serve Spark Connect from a driver, on host:port only."""
    return {
        "spark.plugins": CONNECT_PLUGIN,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        # How often a client hears of its operation's stages (progress.Progress
        # logs every 5 s); a short operation may end before the first report.
        "spark.connect.progress.reportInterval": "1s",
    }


# A client gives up on an unreachable server after about 10 s instead of PySpark's
# 10 minutes: the view host restarting (a new token) or gone is a fault to report.
CONNECT_RETRIES = 5


def connect_session(port: int, token: str) -> SparkSession:
    """A Spark Connect session on this machine's server at 127.0.0.1:`port`.

    The client sends a token without TLS only to a host named `localhost`
    (pyspark's ChannelBuilder), yet `localhost` may resolve to ::1 first, where
    another user's process could listen: the channel is named localhost and
    dials 127.0.0.1.
    """
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    class Loopback(DefaultChannelBuilder):
        @property
        def endpoint(self) -> str:
            return f"127.0.0.1:{port}"

    # What PySpark's own builder sets for a remote session: DataFrame functions
    # then build Connect's plans in this process.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    builder = ConnectSession.builder.channelBuilder(
        Loopback(f"sc://localhost:{port}/;token={token}")
    )
    # create(), not getOrCreate(): never an earlier session, with its old port or token.
    spark = builder.create()
    spark.client.set_retry_policies(
        [
            DefaultPolicy(
                max_retries=CONNECT_RETRIES,
                initial_backoff=100,
                max_backoff=4000,
                # Nor may a server's suggested delay stretch each wait to minutes.
                max_server_retry_delay=4000,
            )
        ]
    )
    return spark  # type: ignore[return-value]


def is_connect(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect client (no JVM in this process)."""
    # A classic session has its JVM twin; importing pyspark.sql.connect needs the
    # client's packages, which a classic-only caller need not load.
    return not hasattr(spark, "_jsparkSession")


def _cluster_conf(s: Settings) -> dict[str, str]:
    """Executors' size and each application's share of a Spark cluster."""
    if s.spark_master.startswith("local"):
        return {}
    return {
        "spark.executor.memory": s.spark_executor_memory,
        "spark.executor.cores": str(s.spark_executor_cores),
        "spark.cores.max": str(s.spark_cores_max),
    }


def _class_path_conf(*parts: dict[str, str]) -> dict[str, str]:
    """Merge settings, joining the drivers' and executors' class paths, which two
    parts may each extend."""
    merged: dict[str, str] = {}
    for part in parts:
        for key, value in part.items():
            if key.endswith(".extraClassPath") and key in merged:
                value = f"{merged[key]}:{value}"
            merged[key] = value
    return merged


def _object_store_conf(s: Settings) -> dict[str, str]:
    """S3A for a lake on s3a:// (nothing for a local folder).

    hadoop-aws and the AWS SDK go on the driver's and the executors' classpath at
    start, not through spark.jars: Hadoop looks file systems up through the JVM's
    own class loader, and the 650 MB SDK would otherwise be copied to every
    executor of every application. An executor must therefore find them at the
    same path: on the one-box cluster it shares the disk; an image for the Spark
    operator carries them.
    """
    if not s.lake_root.startswith("s3a://"):
        return {}
    jars = ":".join(jvm.spark_s3_jars(s))
    conf = {"spark.driver.extraClassPath": jars, "spark.executor.extraClassPath": jars}
    conf["spark.hadoop.fs.s3a.change.detection.mode"] = s.s3_change_detection
    if s.s3_change_detection == "none":
        # S3A still refuses an object without an ETag, whatever the mode, unless
        # the version is optional too (ChangeTracker checks this flag alone).
        conf["spark.hadoop.fs.s3a.change.detection.version.required"] = "false"
    if s.s3_endpoint:
        conf |= {
            "spark.hadoop.fs.s3a.endpoint": s.s3_endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": s.s3_region,
            "spark.hadoop.fs.s3a.path.style.access": "true",
        }
    return conf
