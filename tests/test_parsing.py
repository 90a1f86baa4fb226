import pytest

from exporter.core.parsing import parse_duration_or_seconds, parse_listen, parse_positive_duration


@pytest.mark.parametrize("text,seconds", [
    ("500ms", 0.5), ("2s", 2.0), ("1m", 60.0), ("1h", 3600.0), ("1m30s", 90.0), ("1.5", 1.5), ("0", 0.0),
    ("250ms", 0.25), ("1.5s", 1.5),
])
def test_durations(text, seconds):
    assert parse_duration_or_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "5x", "-1s", "1s5", "s", "nan", "inf", "1 s"])
def test_bad_durations_say_what_is_accepted(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration_or_seconds(text)


def test_zero_interval_rejected():
    with pytest.raises(ValueError, match="greater than zero"):
        parse_positive_duration("0s")


@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:9835", ("127.0.0.1", 9835)), (":9835", ("0.0.0.0", 9835)), ("[::1]:80", ("::1", 80)),
    ("localhost:0", ("localhost", 0)),
])
def test_listen(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text,match", [
    ("9835", "HOST:PORT"), ("host:abc", "invalid port"), ("h:70000", "out of range"),
])
def test_bad_listen(text, match):
    with pytest.raises(ValueError, match=match):
        parse_listen(text)
