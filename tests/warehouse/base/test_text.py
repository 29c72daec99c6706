from warehouse.base.text import first_line


def test_first_line_of_an_error_or_its_text():
    assert first_line(RuntimeError("boom\n\tat org.apache.spark.Foo")) == "boom"
    assert first_line("  \n  Kafka is away\nmore") == "Kafka is away"
    assert first_line("x" * 400) == "x" * 300
    assert first_line("x" * 400, limit=10) == "x" * 10


def test_an_error_without_a_message_is_named_by_its_type_and_empty_text_stays_empty():
    assert first_line(TimeoutError()) == "TimeoutError"
    assert first_line("  ") == ""
