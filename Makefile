# regauge: the two commands that matter are `make demo` and `make test`;
# both run `make setup` first, which does nothing when everything is installed.
SHELL := /bin/bash
REGAUGE := .venv/bin/regauge
PYTEST := .venv/bin/pytest

.PHONY: help setup lock up down status demo test test-fast test-cluster cluster-up cluster-down lint format bench chaos soak clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup:  ## install everything (Debian packages, virtualenvs, JVM artifacts); idempotent
	@bash infra/setup.sh

# The locks are for this platform (Linux x86-64, CPython 3.11), the one setup supports.
LOCK := .venv/bin/uv pip compile --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28

lock:  ## pin every Python package again after a change to pyproject.toml or infra/airflow-requirements.txt (current pins kept where they still fit; add --upgrade via LOCK_ARGS)
	@$(LOCK) $(LOCK_ARGS) pyproject.toml --all-extras -o infra/requirements/pipeline.lock
	@$(LOCK) $(LOCK_ARGS) infra/airflow-requirements.txt -o infra/requirements/airflow.lock
	@echo "locks written; make setup installs them"

up: setup  ## start PostgreSQL, Kafka, Trino and Airflow and wait until healthy
	@$(REGAUGE) up

down:  ## stop every process the project started
	@if [ -x $(REGAUGE) ]; then $(REGAUGE) down; else echo "nothing installed, nothing to stop"; fi

status:  ## each service's state, port, pid, memory and log file
	@$(REGAUGE) status

demo: setup  ## the whole pipeline on the local stack, ending with a Trino query
	@$(REGAUGE) demo

# The fast tests keep a core idle when run one at a time (each is a Python driver
# and a JVM taking turns), so they run in two workers, a file per worker at a time
# (a module's fixtures stay in one process). The integration tests share one stack
# and run one at a time; `make test` runs the Spark fast tests beside them, at the
# lowest priority, in the cores they leave idle (infra/run-tests.sh says how).
FAST := $(PYTEST) tests -m "not integration" -n 2 --dist loadfile

# When make began (read once, as the Makefile is parsed): `make test` ends by saying
# how long it took from there, setup and lint included, beside its budget.
STARTED := $(shell date +%s)
TEST_BUDGET_MIN := 30

test: setup lint  ## every test: fast ones, then integration against the real services and the one-box cluster's smoke test, with Spark's fast tests beside them
	@bash infra/run-tests.sh $(PYTEST) $(STARTED) $(TEST_BUDGET_MIN)

test-fast: setup  ## only the tests that need no services
	@$(FAST)

cluster-up: setup  ## start the one-box cluster (Spark standalone, S3Proxy, 3 Kafka brokers, Trino over HTTPS, Airflow)
	@$(REGAUGE) cluster up

cluster-down:  ## stop the one-box cluster (its data stays in .state/cluster)
	@if [ -x $(REGAUGE) ]; then $(REGAUGE) cluster down; else echo "nothing installed, nothing to stop"; fi

test-cluster: setup  ## the tests of the cluster profile, on the one-box cluster (started if need be)
	@$(PYTEST) tests/cluster

# mypy's cache lives beside the download cache, outside the checkout: a fresh clone
# (CI's) then checks only what changed, about 3 s instead of 25. mypy compares
# each cached file's hash, so a cache from another clone or commit is never wrong,
# only less useful.
lint:  ## ruff, mypy, the layer contracts (import-linter), sqlfluff on the dbt models, the sources' contracts, and what the docs name
	@.venv/bin/ruff check spark_jobs warehouse tests dags
	@.venv/bin/ruff format --check --quiet spark_jobs warehouse tests dags
	@MYPY_CACHE_DIR="$${REGAUGE_CACHE_DIR:-$$HOME/.cache/regauge}/mypy" .venv/bin/mypy
	@.venv/bin/lint-imports --no-cache
	@.venv/bin/sqlfluff lint dbt/models
	@.venv/bin/regauge sources check
	@.venv/bin/regauge docs check

format:  ## rewrite the code as `make lint` wants it (ruff format and import order, sqlfluff fix)
	@.venv/bin/ruff check --fix --quiet spark_jobs warehouse tests dags
	@.venv/bin/ruff format --quiet spark_jobs warehouse tests dags
	@.venv/bin/sqlfluff fix dbt/models

bench: up  ## speed and memory, each beside a baseline from the same run (15-17 min); BENCH_ARGS="--events N ..."
	@$(REGAUGE) bench $(BENCH_ARGS)

soak: up  ## two hours of steady traffic with maintenance every 10 minutes: do file counts and latencies stay flat? SOAK_ARGS="--minutes N ..."
	@$(REGAUGE) soak $(SOAK_ARGS)

chaos: up  ## faults injected into the running pipeline (200k events, 5 kill -9s...); prints a table
	@$(REGAUGE) chaos $(CHAOS_ARGS)

clean: down cluster-down  ## remove local state and the lake, the one-box cluster's too (keeps the download cache)
	@for pg in .state/postgres .state/cluster/postgres; do \
	  if [ -L $$pg ]; then rm -rf "$$(readlink -f $$pg)"; fi; done
	@rm -rf .state warehouse/data
	@echo "removed .state and warehouse/data; the download cache stays in ~/.cache/regauge"
