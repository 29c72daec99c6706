"""How much one `make bench` run measures. Light on purpose: `regauge --help` reads
the defaults from here without importing Spark or Trino."""

from __future__ import annotations

from dataclasses import dataclass

# The phases of a run, in the order they run. `throughput` is the producer and
# ingest together (ingest measures the records the producer sent).
PHASES = ("throughput", "replay", "history", "small_files", "freshness", "queries")


@dataclass(frozen=True)
class Sizes:
    """What one run measures; the defaults took about 20 minutes on 2 cores."""

    events: int = 1_000_000
    chunk: int = 250_000
    load_rate: float = 200.0
    freshness_s: float = 60.0
    probe_every_s: float = 2.0
    queries: int = 30
    # One-event micro-batches over this many events of history, and this many
    # times as many (`--history-events 500000` gives the 0.5 M and 5 M).
    history_events: int = 50_000
    history_factor: int = 10
    # One-row commits to a gold-like table before Trino's p50 over it is compared
    # with its p50 after maintenance.
    small_file_commits: int = 1_000
    # A subset runs in minutes: what a change to one stage needs measured again.
    phases: tuple[str, ...] = PHASES
