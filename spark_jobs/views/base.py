"""What a view version is: a name, a version, its key and schema, and a pure function.

The function takes the silver DataFrame (any subset of it that holds every
event the output rows depend on) and returns the gold rows. It never decides
how it runs: the runner makes it a live stream, a replay or a batch, and owns
checkpoints, triggers and writes (CONTRACT.md §3, DESIGN.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

DEFAULT_ALLOWED_LATENESS = timedelta(hours=2)


@dataclass(frozen=True)
class View:
    name: str
    version: int
    # The gold table's key: one row per distinct key.
    key: tuple[str, ...]
    schema: StructType
    compute: Callable[[DataFrame], DataFrame]
    # The columns a change is scoped by: the runner recomputes, and replaces,
    # every gold row whose scope a changed silver event touches.
    scope: tuple[str, ...]
    # The silver events this view reads (by event_type).
    event_types: tuple[str, ...]
    # (changed silver rows, all of silver) -> the scopes (rows of `scope`
    # columns) whose gold rows the change can alter.
    scopes_of: Callable[[DataFrame, DataFrame], DataFrame]
    # (all of silver, scopes) -> the silver rows that decide those scopes' gold rows.
    restrict: Callable[[DataFrame, DataFrame], DataFrame]
    # (events that landed, all of silver, gold) -> where each landed: event_id,
    # event_time, window_start, window_end, window_key (the key besides time).
    lands_in: Callable[[DataFrame, DataFrame, DataFrame], DataFrame]
    allowed_lateness: timedelta = DEFAULT_ALLOWED_LATENESS
    description: str = ""
    # What this version must share with an earlier one, checked before it goes
    # live: {earlier version: {column here: column there}}, row by row on the key.
    agrees_with: dict[int, dict[str, str]] = field(default_factory=dict)

    @property
    def table_name(self) -> str:
        return f"{self.name}_v{self.version}"
