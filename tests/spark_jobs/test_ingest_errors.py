"""Telling a gap in the log from other failures, however deep Spark wraps it."""

from __future__ import annotations

from spark_jobs.engine import ingest
from spark_jobs.engine.ingest import error_text, is_data_loss


class Captured(Exception):
    """Like PySpark's CapturedException: the converted JVM cause sits in `_cause`."""

    def __init__(self, desc: str, cause: BaseException | None = None) -> None:
        super().__init__(desc)
        self._cause = cause


LOSS = (
    "Some data may have been lost because they are not available in Kafka any more; "
    "Reason: Could not read records in offset [21896, 21898) for topic partition shop.events-1"
)


def test_a_gap_found_while_planning_is_data_loss():
    assert is_data_loss(error_text(Captured(f"[STREAM_FAILED] Query terminated: {LOSS}")))


def test_a_gap_found_inside_a_task_is_data_loss_too():
    wrapped = Captured(
        "[STREAM_FAILED] Query terminated with exception: [TASK_WRITE_FAILED] Task failed "
        "while writing rows to file:/lake/bronze/shop_events.",
        Captured("[TASK_WRITE_FAILED] Task failed", Captured(LOSS)),
    )
    assert not is_data_loss(str(wrapped))
    assert is_data_loss(error_text(wrapped))


def test_python_causes_are_followed_and_other_failures_are_not_data_loss():
    try:
        try:
            raise OSError("disk full")
        except OSError as inner:
            raise RuntimeError("bronze failed") from inner
    except RuntimeError as outer:
        text = error_text(outer)
    assert text == "bronze failed\ndisk full"
    assert not is_data_loss(text)
    assert error_text(None) == ""


def test_a_full_disk_is_told_apart_from_other_failures():
    text = "Job aborted.\njava.io.IOException: No space left on device"
    assert ingest.is_disk_full(text)
    assert not ingest.is_disk_full("java.io.IOException: Connection reset")
