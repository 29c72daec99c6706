"""Fetch the JVM side of the stack once, from Maven Central, into a cache outside the repo.

Everything is resolved by Maven (the only route to Maven Central here) with strict
checksums, unpacked, and marked complete with a stamp that records what was
fetched. A later run that finds a matching stamp does nothing, so setup is quick
and works offline; a run interrupted halfway leaves no stamp and is redone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

from spark_jobs.engine import class_archive, local_fs
from warehouse.base.jvm import Layout, SetupError, java17, java25, layout
from warehouse.base.settings import REPO_ROOT, Settings

log = logging.getLogger(__name__)

JVM_POMS = REPO_ROOT / "infra" / "jvm"
# Trino 476's plugins are not published as separate zips on the mirror we can
# reach, so the full server tarball is fetched and only these plugins are kept
# (geospatial provides the Geometry type the Delta Lake connector needs;
# password-authenticators the file logins of the one-box cluster).
TRINO_PLUGINS = ("delta-lake", "postgresql", "kafka", "geospatial", "password-authenticators")
# Room the first fetch needs: the 0.8 GB Trino tarball, its unpacked part, the jars.
FREE_BYTES_NEEDED = 3 * 1024**3


def _stamp_ok(directory: Path, token: str) -> bool:
    stamp = directory / ".complete"
    return stamp.is_file() and stamp.read_text().strip() == token


def _write_stamp(directory: Path, token: str) -> None:
    (directory / ".complete").write_text(token + "\n")


def _file_token(*paths: Path) -> str:
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.read_bytes())
    return digest.hexdigest()[:16]


def _check_disk(where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free
    if free < FREE_BYTES_NEEDED:
        raise SetupError(
            f"disk nearly full: {free / 1024**3:.1f} GiB free in {where}, setup needs "
            f"{FREE_BYTES_NEEDED / 1024**3:.0f} GiB; free some space or set REGAUGE_CACHE_DIR"
        )


def _mvn(args: list[str], what: str, cwd: Path, lay: Layout) -> None:
    """Run Maven with strict checksums; a failure names the artifact it was fetching."""
    if shutil.which("mvn") is None:
        raise SetupError("Maven (mvn) not found: install it with `apt-get install -y maven`")
    cmd = ["mvn", "-B", "-q", "-C", f"-Dmaven.repo.local={lay.m2}", *args]
    log.info("fetching %s with Maven", what)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        if "No space left on device" in tail:
            raise SetupError(f"disk full while fetching {what}; free space in {lay.root}")
        raise SetupError(f"could not fetch {what} from Maven Central:\n{tail}")


def _valid_jar(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.testzip() is None if path.stat().st_size < 1_000_000 else bool(zf.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def _copy_dependencies(pom_dir: Path, out: Path, what: str, lay: Layout) -> None:
    token = _file_token(pom_dir / "pom.xml")
    if _stamp_ok(out, token):
        return
    _check_disk(lay.root)
    for attempt in (1, 2):
        if out.exists():
            shutil.rmtree(out)
        _mvn(
            [
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={out}",
            ],
            what,
            pom_dir,
            lay,
        )
        broken = [p for p in out.glob("*.jar") if not _valid_jar(p)]
        if not broken:
            _write_stamp(out, token)
            return
        # A truncated file in the local repository: drop it so Maven fetches it again.
        for jar in broken:
            log.warning("%s is damaged (attempt %d); fetching it again", jar.name, attempt)
            for cached in lay.m2.rglob(jar.name):
                cached.unlink()
    raise SetupError(f"{what}: jars still damaged after a second fetch: {broken}")


def _pyspark_jar_names() -> set[str]:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return {_artifact_name(p.name) for p in jars.glob("*.jar")}


_JAR = re.compile(r"(?P<name>.+?)-(?P<version>\d[\w.]*(?:-\d+)?)\.jar")


def _artifact_name(jar: str) -> str:
    """`jackson-core-2.13.5.jar` -> `jackson-core`; `spark-sql-kafka-0-10_2.13-4.2.0.jar`
    -> `spark-sql-kafka-0-10` (the version is only the last dash-separated part)."""
    match = _JAR.fullmatch(jar)
    name = match.group("name") if match else jar.removesuffix(".jar")
    return name.removesuffix("_2.13")


def _write_spark_jar_list(lay: Layout) -> None:
    """Keep PySpark's own copy of any library it already ships: two versions of one
    class on the classpath (jackson, hadoop, parquet) break Spark in odd places."""
    shipped = _pyspark_jar_names()
    keep = sorted(
        str(p) for p in lay.spark_jars.glob("*.jar") if _artifact_name(p.name) not in shipped
    )
    text = "\n".join(keep) + "\n"
    if lay.spark_jar_list.exists() and lay.spark_jar_list.read_text() == text:
        return
    # Written whole and renamed into place: Spark drivers read the list as they start,
    # and `make test` starts the Spark tests' drivers while the cluster's smoke test
    # fetches (and so writes this list) beside them. A list read half-written would
    # start a driver without Delta.
    partial = lay.spark_jar_list.with_name(lay.spark_jar_list.name + ".partial")
    partial.write_text(text)
    os.replace(partial, lay.spark_jar_list)


def _sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_trino(settings: Settings, lay: Layout) -> None:
    version = settings.versions.trino
    home = lay.trino_home(version)
    token = f"{version}:{','.join(TRINO_PLUGINS)}"
    if _stamp_ok(home, token):
        return
    _check_disk(lay.root)
    coords = f"io.trino:trino-server:{version}:tar.gz"
    tarball = lay.m2 / "io" / "trino" / "trino-server" / version / f"trino-server-{version}.tar.gz"
    for attempt in (1, 2):
        if not tarball.is_file():
            _mvn(
                ["dependency:get", "-Dtransitive=false", f"-Dartifact={coords}"],
                coords,
                REPO_ROOT,
                lay,
            )
        expected = tarball.with_name(tarball.name + ".sha1")
        if expected.is_file() and expected.read_text().split()[0] == _sha1(tarball):
            break
        log.warning("%s failed its checksum (attempt %d); fetching it again", coords, attempt)
        tarball.unlink(missing_ok=True)
    else:
        raise SetupError(f"{coords}: checksum still wrong after a second fetch")

    log.info("unpacking Trino %s (core and plugins %s)", version, ", ".join(TRINO_PLUGINS))
    if home.exists():
        shutil.rmtree(home)
    staging = home.with_name(home.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    prefix = f"trino-server-{version}/"
    wanted = ("lib/", "bin/", *(f"plugin/{p}/" for p in TRINO_PLUGINS))
    _unpack_selected(tarball, staging, prefix, wanted)
    staging.rename(home)
    _write_stamp(home, token)


def _unpack_selected(tarball: Path, dest: Path, prefix: str, wanted: tuple[str, ...]) -> None:
    """Unpack the members under `wanted`, turning hard links into plain copies.

    Trino's plugins share jars through hard links whose targets may sit in plugins
    we skip. Reading a link target from a gzip stream seeks backwards (minutes
    for this tarball), so a first pass finds the targets we need and a second,
    strictly forward pass writes files and keeps those targets aside.
    """
    with tarfile.open(tarball, "r:gz") as tar:
        link_targets = {
            m.linkname for m in tar if m.islnk() and m.name.removeprefix(prefix).startswith(wanted)
        }
    aside = dest / ".link-targets"
    kept: dict[str, Path] = {}
    with tarfile.open(tarball, "r|gz") as tar:
        for member in tar:
            rel = member.name.removeprefix(prefix)
            if ".." in Path(rel).parts:
                raise SetupError(f"{tarball.name}: refusing unsafe path {member.name}")
            is_wanted = rel.startswith(wanted)
            if member.isfile() and (is_wanted or member.name in link_targets):
                target = dest / rel if is_wanted else aside / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file always has content
                with source, target.open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
                target.chmod(member.mode & 0o755 | 0o644)
                kept[member.name] = target
            elif member.islnk() and is_wanted:
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(kept[member.linkname], target)
    shutil.rmtree(aside, ignore_errors=True)


def fetch_all(settings: Settings) -> dict[str, str]:
    """Fetch (or confirm cached) every JVM artifact; return where each landed."""
    lay = layout(settings)
    java17()
    _copy_dependencies(JVM_POMS / "spark", lay.spark_jars, "Spark jars (Delta, Kafka source)", lay)
    _write_spark_jar_list(lay)
    _copy_dependencies(JVM_POMS / "kafka", lay.kafka_jars, "Kafka broker jars", lay)
    _fetch_trino(settings, lay)
    java25()
    no_fork = local_fs.ensure()  # before the archive, which is made with it
    archive = class_archive.ensure()
    where = {
        "spark jars": str(lay.spark_jars),
        "kafka jars": str(lay.kafka_jars),
        "trino": str(lay.trino_home(settings.versions.trino)),
        "java 17": java17(),
        "java 25": java25(),
        "local file system": str(no_fork) if no_fork else "Hadoop's (a process per file)",
        "class data": str(archive) if archive else "none (Spark drivers start slower)",
    }
    (lay.root / "artifacts.json").write_text(json.dumps(where, indent=2) + "\n")
    return where


def fetch_cluster(settings: Settings) -> dict[str, str]:
    """What only the cluster profile needs: Spark's object-store jars, and S3Proxy
    for the one-box cluster. Fetched by `regauge cluster fetch` (and `cluster up`),
    not by `make setup`: the AWS SDK alone is 650 MB."""
    lay = layout(settings)
    _copy_dependencies(
        JVM_POMS / "spark-s3", lay.spark_s3_jars, "object-store jars (hadoop-aws, AWS SDK)", lay
    )
    proxy_dir = lay.s3proxy_jar.parent
    _copy_dependencies(JVM_POMS / "s3proxy", proxy_dir, "S3Proxy", lay)
    if not lay.s3proxy_jar.is_file():
        (jar,) = (p for p in proxy_dir.glob("s3proxy-*.jar"))
        jar.rename(lay.s3proxy_jar)
    return {"object-store jars": str(lay.spark_s3_jars), "s3proxy": str(lay.s3proxy_jar)}
