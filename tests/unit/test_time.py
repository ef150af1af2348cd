import datetime as dt

import pytest

from dstreams.time import BatchTime, Duration, parse_duration


@pytest.mark.parametrize(
    "value, ms",
    [(1, 1000), (0.5, 500), (2.0, 2000), ("500ms", 500), ("1s", 1000), ("2min", 120_000), ("1h", 3_600_000),
     (" 30 s", 30_000), ("1.5s", 1500), (Duration(250), 250), (dt.timedelta(seconds=3), 3000)],
)
def test_parse_duration_accepts_pyspark_numbers_and_strings(value, ms):
    assert parse_duration(value) == Duration(ms)


@pytest.mark.parametrize("value", ["", "1", "1 parsec", "s", "-1s", "1.0001ms", "1e3s"])
def test_malformed_duration_string_is_a_clear_error(value):
    with pytest.raises(ValueError, match="(malformed|milliseconds|positive)"):
        parse_duration(value, "windowDuration")


@pytest.mark.parametrize("value", [0, -1, float("nan"), 0.0001])
def test_bad_numeric_duration(value):
    with pytest.raises(ValueError):
        parse_duration(value)


def test_wrong_type_duration():
    with pytest.raises(TypeError, match="seconds"):
        parse_duration(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        parse_duration(True)  # type: ignore[arg-type]


def test_batch_time_grid():
    zero = BatchTime(0)
    assert BatchTime(2500).floor(Duration(1000), zero) == BatchTime(2000)
    assert BatchTime(3000).is_aligned(Duration(1000), zero)
    assert BatchTime(1000).to(BatchTime(3000), Duration(1000)) == [BatchTime(1000), BatchTime(2000), BatchTime(3000)]
    assert BatchTime(1000).until(BatchTime(3000), Duration(1000)) == [BatchTime(1000), BatchTime(2000)]
    assert (BatchTime(5000) - BatchTime(2000)) == Duration(3000)
    assert Duration(3000).is_multiple_of(Duration(1000))
    assert not Duration(3000).is_multiple_of(Duration(2000))


def test_the_first_batch_is_the_next_boundary_after_the_clock():
    from dstreams.clock import ManualClock
    from dstreams.scheduler import first_batch_time

    assert first_batch_time(ManualClock(0), Duration(1000)) == BatchTime(1000)
    assert first_batch_time(ManualClock(999), Duration(1000)) == BatchTime(1000)
    assert first_batch_time(ManualClock(1000), Duration(1000)) == BatchTime(2000)
    assert first_batch_time(ManualClock(1250), Duration(500)) == BatchTime(1500)
