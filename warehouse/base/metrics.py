"""The metrics regauge exports to Prometheus: every name in one place.

Prometheus' own split: the code that does the work records (ingest's progress
listener, silver's batches, a view's micro-batches, the view host's loop), and
the process that runs it serves what was recorded. Only the view host serves
(`warehouse.ops.exporter`), on `Settings.metrics_port`; in any other process
(a replay, a test, the CLI) these objects record into memory nobody reads,
which costs a dictionary update per batch.

Labels stay few and bounded: a partition, a query name, a view and its version,
a quarantine reason from the contract's list.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

INGEST_BEHIND = Gauge(
    "regauge_ingest_behind_records",
    "Records Kafka holds that bronze has not copied yet, per source and partition: from "
    "each bronze micro-batch, and from a look at Kafka every 15 s",
    ["source", "partition"],
)
INGEST_OLDEST_WAITING = Gauge(
    "regauge_ingest_oldest_waiting_seconds",
    "How long the oldest record Kafka holds that bronze has not copied has waited, "
    "per source and partition (0 when caught up); refreshed every 15 s",
    ["source", "partition"],
)
MICROBATCH = Histogram(
    "regauge_microbatch_seconds",
    "Duration of each streaming micro-batch, per query (ingest, <view>_v<n>)",
    ["query"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)
MICROBATCH_ROWS = Counter(
    "regauge_microbatch_input_rows",
    "Rows the micro-batches of each query read",
    ["query"],
)
VIEW_FRESHNESS = Gauge(
    "regauge_view_freshness_seconds",
    "A view version's last micro-batch that changed gold: seconds from the Kafka "
    "timestamp (the producer's) of the oldest new event it applied until its gold commit",
    ["view", "version"],
)
VIEW_BATCH_AT = Gauge(
    "regauge_view_last_gold_commit_timestamp_seconds",
    "When a view version's last micro-batch that changed gold committed (Unix time)",
    ["view", "version"],
)
RESTATEMENTS = Counter(
    "regauge_restatements",
    "Windows already final that a late event changed, per view version",
    ["view", "version"],
)
SILVER_ROWS = Counter(
    "regauge_silver_rows",
    "Rows ingest's batches settled into silver, by outcome: accepted, duplicate "
    "(an exact re-send) or quarantined (conflicting duplicates among them)",
    ["outcome"],
)
QUARANTINED = Counter(
    "regauge_quarantined",
    "Events silver sent to the quarantine, by the contract's reason",
    ["reason"],
)
QUERY_RUNNING = Gauge(
    "regauge_query_running",
    "1 while a query the view host was asked to run is running; 0 while it waits "
    "to be retried or for an operator",
    ["query"],
)
AUDIT_AGE = Gauge(
    "regauge_audit_age_seconds",
    "Seconds since the last `regauge audit` finished (NaN: none on record)",
)
AUDIT_PASSED = Gauge(
    "regauge_audit_passed",
    "1 if the last `regauge audit` passed, 0 if it failed (NaN: none on record)",
)

# `regauge subscribe --metrics-port`: one subscriber per process, labelled by what
# it follows, so several scraped into one Prometheus stay apart.
SUBSCRIBER_CHANGES = Counter(
    "regauge_subscriber_changes",
    "What a subscriber's copy went through, by op (reset, upsert, delete, waiting)",
    ["view", "user", "op"],
)
SUBSCRIBER_VERSION = Gauge(
    "regauge_subscriber_version",
    "The view version a subscriber follows (its user's route); 0 while none is live",
    ["view", "user"],
)
SUBSCRIBER_DELAY = Gauge(
    "regauge_subscriber_delay_seconds",
    "From the view host's publishing of the last change read (its Kafka timestamp) "
    "to the subscriber's applying it",
    ["view", "user"],
)
