"""Hadoop's local file system without a process per file: a jar `make setup` compiles.

Without Hadoop's native library, which no registry here serves, Hadoop's
RawLocalFileSystem runs `chmod` for every file it creates and `readlink` for every
rename made through FileContext (Delta's log store, Spark's streaming checkpoints):
four to six processes per Delta commit and one per Parquet file, each about 3 ms of
a core. `tests/spark_jobs/test_silver.py` alone started 8,957 processes (the
machine's fork count) and took 124 s and 186 CPU-s; with this jar, 2,680 (the
JVM's own threads; its JFR profile shows 20 processes started) and 103 s and 157
CPU-s. The classes (infra/jvm/localfs/) answer those two calls through java.nio,
with Hadoop's outcome, and change nothing else: the same checksummed local file
system, the same files on disk.

The jar lives in the virtualenv beside the class-data archive, which is made with
it on the driver's class path (the archive only fits the class path it was made
with). A session uses it while it is current; without it (no `javac`), sessions use
Hadoop's own, as before, only slower.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from warehouse.base import jvm
from warehouse.base.settings import REPO_ROOT

log = logging.getLogger(__name__)

SOURCES = REPO_ROOT / "infra" / "jvm" / "localfs" / "src"
FILE_SYSTEM = "dev.regauge.hadoop.NoForkLocalFileSystem"  # fs.file.impl
ABSTRACT_FILE_SYSTEM = "dev.regauge.hadoop.NoForkLocalFs"  # fs.AbstractFileSystem.file.impl


def jar_path() -> Path:
    return Path(sys.prefix) / "share" / "regauge" / "regauge-localfs.jar"


def _token_path() -> Path:
    return jar_path().with_suffix(".token")


def _sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.java"))


def token() -> str:
    """What the jar is made from: its sources' contents."""
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(f"{path.relative_to(SOURCES)}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def is_current() -> bool:
    try:
        return jar_path().is_file() and _token_path().read_text().strip() == token()
    except OSError:
        return False


def session_conf(spark_master: str) -> dict[str, str]:
    """The settings that make a session's local file system the jar's, or none while
    there is no current jar. Only where the executors are the driver's own JVM (a
    `local[...]` master): another JVM would need the jar on its class path too."""
    if not spark_master.startswith("local") or not is_current():
        return {}
    return {
        "spark.driver.extraClassPath": str(jar_path()),
        "spark.hadoop.fs.file.impl": FILE_SYSTEM,
        "spark.hadoop.fs.AbstractFileSystem.file.impl": ABSTRACT_FILE_SYSTEM,
    }


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def ensure() -> Path | None:
    """Compile the jar if it is missing or stale; return it, or None if it could not
    be made (sessions then use Hadoop's own local file system)."""
    if is_current():
        return jar_path()
    javac = Path(jvm.java17_home()) / "bin" / "javac"
    if not javac.is_file():
        found = shutil.which("javac")
        if found is None:
            log.warning(
                "no javac, so Spark keeps Hadoop's local file system (a process per file"
                " written): install a JDK 17 (`apt-get install -y openjdk-17-jdk-headless`)"
            )
            return None
        javac = Path(found)
    hadoop = [str(p) for p in sorted(_pyspark_jars().glob("hadoop-client-*.jar"))]
    target = jar_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    expected = token()
    log.info("compiling %s (Hadoop's local file system without a process per file)", target)
    with tempfile.TemporaryDirectory(prefix="regauge-localfs-") as work:
        classes, made = Path(work) / "classes", Path(work) / "made.jar"
        compile_ = subprocess.run(
            [str(javac), "--release", "17", "-cp", ":".join(hadoop), "-d", str(classes)]
            + [str(p) for p in _sources()],
            capture_output=True,
            text=True,
        )
        if compile_.returncode != 0:
            log.warning("could not compile %s:\n%s", target.name, compile_.stderr[-2000:])
            return None
        shutil.make_archive(str(made.with_suffix("")), "zip", classes)
        made.with_suffix(".zip").replace(target)
    _token_path().write_text(expected + "\n")
    return target
