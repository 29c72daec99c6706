"""The engine room: everything that runs what authors declare.

The contract compiler, ingest (bronze, the ledger, silver), the view runner with its
change feeds and restatements, the erasure, re-admission, the audit and maintenance.
Authors' rooms (`warehouse/sources/` for sources, `spark_jobs/views/` for view versions)
never import this package; `make lint` holds that (import-linter).
"""
