#!/usr/bin/env bash
# `make setup`: install everything regauge needs, from the project's own files.
# Idempotent and quick when nothing changed (stamps record what was installed);
# offline after the first run (Python wheels in uv's cache, JVM artifacts in
# ~/.cache/regauge).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }

PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found: install Python 3.11 or set PYTHON=/path/to/python3.11"
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$pyver" = "3.11" ] || die "Python 3.11 is required, $PYTHON is $pyver: set PYTHON=/path/to/python3.11"

# -- Debian packages: Java 17 (a JDK) for Spark and Kafka, PostgreSQL, Maven, openssl, Chromium, nftables
need=()
# The JDK, not only its runtime: javac compiles infra/jvm/localfs/ (spark_jobs/engine/local_fs.py).
compgen -G "/usr/lib/jvm/java-17-openjdk-*/bin/javac" >/dev/null || need+=(openjdk-17-jdk-headless)
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need+=(postgresql)
command -v mvn >/dev/null || need+=(maven)
# openssl makes the one-box cluster's CA and Trino's certificate.
command -v openssl >/dev/null || need+=(openssl)
# The rollout page's browser test: headless Chromium and its driver, from Debian
# (Playwright's and Selenium's own browser downloads cannot reach their hosts).
[ -x /usr/bin/chromedriver ] || need+=(chromium chromium-driver)
# nft loads the guard that lets only this account open Trino's local port
# (warehouse/ops/stack/guard.py). Only root can load it, so only root needs it.
if [ "$(id -u)" -eq 0 ]; then
  PATH="$PATH:/usr/sbin:/sbin" command -v nft >/dev/null || need+=(nftables)
fi
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || die "missing Debian packages ${need[*]}: run 'sudo apt-get install -y ${need[*]}' and retry"
  say "installing Debian packages: ${need[*]}"
  apt-get update -qq || die "apt-get update failed: check the network to Debian's mirror"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || die "apt-get install ${need[*]} failed"
fi

# -- promtool, which checks the shipped alert rules (infra/prometheus/) ------------
# From Debian's prometheus package, unpacked into the cache, not installed: the
# package would also install and start a Prometheus server.
CACHE="${REGAUGE_CACHE_DIR:-$HOME/.cache/regauge}"
PROMTOOL="$CACHE/promtool/promtool"
if [ ! -x "$PROMTOOL" ]; then
  say "fetching promtool from Debian's prometheus package into $CACHE/promtool"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root prometheus >/dev/null) \
    || die "apt-get download prometheus failed: check the network to Debian's mirror"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/unpacked"
  mkdir -p "$CACHE/promtool"
  install -m 0755 "$tmp/unpacked/usr/bin/promtool" "$PROMTOOL"
  rm -rf "$tmp"
fi

# -- Python virtualenvs -----------------------------------------------------------
# uv resolves and installs much faster than pip, and caches wheels for offline reruns.
stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

# uv is pinned in pyproject.toml's dev extra (so the lock keeps it); the same
# version bootstraps a fresh .venv.
UV_VERSION=0.13.9

make_venv() {  # make_venv DIR LOCKFILE STAMP-FILES...; true if it (re)installed
  local dir=$1 lock=$2 stamp
  stamp=$(stamp_of "${@:2}")
  if [ -f "$dir/.regauge-stamp" ] && [ "$(cat "$dir/.regauge-stamp")" = "$stamp" ]; then
    return 1
  fi
  say "installing $dir from $lock (this takes a few minutes the first time)"
  [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir" || die "cannot make a virtualenv in $dir"
  [ -x .venv/bin/uv ] || { [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv; .venv/bin/pip install -q "uv==$UV_VERSION"; }
  # sync, not install: the virtualenv then holds exactly the lock, nothing left over.
  .venv/bin/uv pip sync --quiet --python "$dir/bin/python" "$lock" \
    || die "installing $lock into $dir failed (see the lines above)"
  echo "$stamp" > "$dir/.regauge-stamp"
}

# The locks pin every package, dependencies of dependencies too (`make lock`
# writes them from pyproject.toml and infra/airflow-requirements.txt).
if make_venv .venv infra/requirements/pipeline.lock pyproject.toml infra/requirements/pipeline.lock; then
  # regauge itself, editable; its dependencies are already there from the lock.
  .venv/bin/uv pip install --quiet --python .venv/bin/python --no-deps -e . \
    || die "installing regauge into .venv failed (see the lines above)"
fi
# Airflow gets its own virtualenv: its Spark provider's pyspark-client would
# overwrite the pipeline's PySpark. Its tasks call the pipeline's CLI instead.
make_venv .venv-airflow infra/requirements/airflow.lock \
  infra/airflow-requirements.txt infra/requirements/airflow.lock || true

# -- JVM artifacts (Maven Central -> ~/.cache/regauge) ------------------------------
.venv/bin/regauge setup >/dev/null
say "ready (run 'make up' to start the stack, 'make demo' or 'make test')"
