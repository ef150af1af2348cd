"""The chaos command's fault schedule (``benchmarks/chaos.py``): a pure function of the seed, the length and the gap."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.chaos import KINDS, _parse_gap, make_schedule


@pytest.mark.parametrize(("minutes", "gap", "bounds"), [
    (2, None, (14.0, 20.0)),  # the short schedule's default gaps
    (30, None, (22.0, 40.0)),  # the long one's
    (1.5, (9.0, 13.0), (9.0, 13.0)),  # the CI test's dense one
])
def test_faults_come_a_gap_apart_and_every_kind_in_each_round(minutes, gap, bounds):
    schedule = make_schedule(7, minutes, gap=gap)
    assert schedule == make_schedule(7, minutes, gap=gap)  # the same seed, the same schedule
    assert schedule != make_schedule(8, minutes, gap=gap)
    spacing = [b.at_s - a.at_s for a, b in zip(schedule, schedule[1:], strict=False)]
    assert all(bounds[0] - 0.1 <= s <= bounds[1] + 0.1 for s in spacing), spacing
    assert bounds[0] / 2 - 0.1 <= schedule[0].at_s <= bounds[1] / 2 + 0.1
    # faults until the span is over, and at least one of each kind
    assert len(schedule) == len(KINDS) or schedule[-2].at_s < minutes * 60 <= schedule[-1].at_s + bounds[1] + 0.1
    for start in range(0, len(schedule) - len(KINDS) + 1, len(KINDS)):
        assert sorted(f.kind for f in schedule[start:start + len(KINDS)]) == sorted(KINDS)


def test_the_ci_schedule_has_one_fault_of_each_kind():
    schedule = make_schedule(7, 1.5, gap=(9.0, 13.0))
    assert sorted(f.kind for f in schedule) == sorted(KINDS)
    assert schedule[-1].at_s < 100


@pytest.mark.parametrize("text", ["9", "9,13,15", "a,b", "13,9", "0,5", "-1,5"])
def test_a_wrong_gap_is_refused_with_the_form_it_takes(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"LO,HI|0 < LO <= HI"):
        _parse_gap(text)
    assert _parse_gap("9,13") == (9.0, 13.0) and _parse_gap("5,5") == (5.0, 5.0)
