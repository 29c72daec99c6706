"""`make bench`: each figure next to a baseline measured in the same run, on the same machine.

Machine noise cancels out of a ratio, so every figure is printed beside what
the simplest tool for the same job does here and now:

| figure                                   | baseline                                  |
|------------------------------------------|-------------------------------------------|
| producer events/s (regauge's producer)   | a bare confluent-kafka loop, same records |
| ingest Kafka -> bronze -> silver events/s | a bare confluent-kafka consumer            |
| replay of all views from silver events/s | DuckDB over delta-rs, revenue_hourly v1   |
| produce -> visible in serving, p50/p95   | the trigger interval                      |
| serving query through Trino, p50/p95     | `SELECT 1` through the same client        |
| Trino's CPU per serving query            | Trino's CPU per `SELECT 1`                |
| peak resident memory of the whole stack  | (the 12 GiB target)                       |

The phases run one after another, so none competes with another for the two
cores. Ingest and the view streams are stopped for the first three phases and
left as they were found at the end. What the bench sends stays in the lake as
ordinary traffic (clean generator records, and one probe order per freshness
sample in an hour of 2001 no other data uses); `make clean` starts over.
A missed target is reported, never a failure: the exit code says only
whether every phase ran.

The package, from the bottom up (no module imports one above it, nor this one):
`sizes` (what a run measures; the CLI's parser reads it), `report` (targets,
figures, the table and the BENCHMARKS.md section), `chart` (the PNG), `memory`
(the peak sampler), `context` (what the phases share), the phases `throughput`
(producer, ingest), `replay` and `latency` (freshness, serving queries), and
`runner` (the whole run and what it writes).
"""

from __future__ import annotations

from warehouse.tools.bench.report import DEFAULT_OUT, DOC, Report, table, verdicts
from warehouse.tools.bench.runner import run, save
from warehouse.tools.bench.sizes import PHASES, Sizes

__all__ = ["DEFAULT_OUT", "DOC", "PHASES", "Report", "Sizes", "run", "save", "table", "verdicts"]
