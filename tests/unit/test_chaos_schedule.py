"""The chaos command's fault schedule (``benchmarks/chaos.py``): a pure function of the seed, the length and the gap;
and the check of its Kafka branch (what a read_committed consumer of the output sees against the input)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import chaos_app
from benchmarks.chaos import BASE_KINDS, KAFKA_KILL_POINTS, KINDS, _parse_gap, check_kafka, main, make_schedule


@pytest.mark.parametrize("kinds", [KINDS, BASE_KINDS], ids=["with-kafka", "without-kafka"])
@pytest.mark.parametrize(("minutes", "gap", "bounds"), [
    (2, None, (14.0, 20.0)),  # the short schedule's default gaps
    (30, None, (22.0, 40.0)),  # the long one's
    (1.5, (9.0, 13.0), (9.0, 13.0)),  # the CI test's dense one
])
def test_faults_come_a_gap_apart_and_every_kind_in_each_round(minutes, gap, bounds, kinds):
    schedule = make_schedule(7, minutes, kinds, gap=gap)
    assert schedule == make_schedule(7, minutes, kinds, gap=gap)  # the same seed, the same schedule
    assert schedule != make_schedule(8, minutes, kinds, gap=gap)
    spacing = [b.at_s - a.at_s for a, b in zip(schedule, schedule[1:], strict=False)]
    assert all(bounds[0] - 0.1 <= s <= bounds[1] + 0.1 for s in spacing), spacing
    assert bounds[0] / 2 - 0.1 <= schedule[0].at_s <= bounds[1] / 2 + 0.1
    # faults until the span is over, and at least one of each kind
    assert len(schedule) == len(kinds) or schedule[-2].at_s < minutes * 60 <= schedule[-1].at_s + bounds[1] + 0.1
    for start in range(0, len(schedule) - len(kinds) + 1, len(kinds)):
        assert sorted(f.kind for f in schedule[start:start + len(kinds)]) == sorted(kinds)


def test_the_ci_schedule_has_one_fault_of_each_kind():
    schedule = make_schedule(7, 1.5, gap=(9.0, 13.0))  # tests/fault/test_chaos.py: every kind, Kafka's too
    assert sorted(f.kind for f in schedule) == sorted(KINDS)
    assert schedule[-1].at_s < 120
    kafka_kill = next(f for f in schedule if f.kind == "kafka-kill")
    assert kafka_kill.params["point"] in KAFKA_KILL_POINTS
    restart = next(f for f in schedule if f.kind == "kafka-restart")
    assert restart.params["signal"] in ("TERM", "KILL") and 0 <= restart.params["down_s"] <= 5


def test_without_kafka_the_schedules_are_those_of_before():
    # The runs recorded in benchmarks/results/ (and the CI test before the Kafka kinds) keep their schedules.
    assert [(f.at_s, f.kind) for f in make_schedule(7, 1.5, BASE_KINDS, gap=(9.0, 13.0))] == [
        (5.1, "driver-term"), (17.8, "executor-kill"), (26.9, "redis-drop"), (36.3, "driver-kill"),
        (48.6, "user-fail"), (61.4, "redis-restart"), (72.0, "driver-kill-in-output"), (81.2, "gateway-down"),
        (91.3, "postgres-restart")]


@pytest.mark.parametrize("text", ["9", "9,13,15", "a,b", "13,9", "0,5", "-1,5"])
def test_a_wrong_gap_is_refused_with_the_form_it_takes(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"LO,HI|0 < LO <= HI"):
        _parse_gap(text)
    assert _parse_gap("9,13") == (9.0, 13.0) and _parse_gap("5,5") == (5.0, 5.0)


@pytest.mark.parametrize("argv", [["--kinds", "kafka-restart"], ["--kinds", "kafka-kill"],
                                  ["--kafka", "127.0.0.1:9192", "--kinds", "kafka-restart"]])
def test_kafka_kinds_need_a_kafka_branch(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "need --kafka own" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- the Kafka check
def _input(*keyed: tuple[str, str]) -> list[tuple[int, int, str, str]]:
    """Input records (partition by key, offsets in order) from ``(key, tag)`` pairs: value ``key:tag:0``."""
    offsets: dict[int, int] = {}
    out = []
    for key, tag in keyed:
        p = int(key[1:]) % 3
        offsets[p] = offsets.get(p, -1) + 2  # every other offset: the gaps of markers
        out.append((p, offsets[p], key, f"{key}:{tag}:0"))
    return sorted(out)


def _output(inp: list[tuple[int, int, str, str]]) -> list[tuple[int, int, str, str]]:
    """What a fault-free run writes: per key, its records in input order with the counts 1, 2, 3, ..."""
    counts: dict[str, int] = {}
    out = []
    for i, (_p, _o, key, value) in enumerate(inp):
        counts[key] = counts.get(key, 0) + 1
        out.append((int(key[1:]) % 2, i, key, f"{counts[key]} {value}"))
    return out


def _swap_first_two_of_k0(out: list[tuple[int, int, str, str]]) -> list[tuple[int, int, str, str]]:
    """k0's first two input records written in the wrong order, with the counts 1, 2 still."""
    i, j = [n for n, r in enumerate(out) if r[2] == "k0"][:2]
    out = list(out)
    (pi, oi, _k, vi), (pj, oj, _k, vj) = out[i], out[j]
    out[i], out[j] = (pi, oi, "k0", "1 " + vj.split(" ", 1)[1]), (pj, oj, "k0", "2 " + vi.split(" ", 1)[1])
    return out


INPUT = _input(("k0", "1"), ("k1", "1"), ("k0", "2"), ("k3", "c1"), ("k1", "3"), ("k0", "4"), ("k3", "5"))


def test_the_kafka_check_passes_a_fault_free_output():
    result = check_kafka(INPUT, _output(INPUT))
    assert result["ok"], result
    assert result["input_records"] == result["output_records"] == 7 and result["keys"] == 3


@pytest.mark.parametrize(("change", "finding"), [
    (lambda out: out[:-1], "lost"),  # the last record of k3 missing
    (lambda out: out + [out[2]], "duplicated"),  # written twice
    (lambda out: out + [(0, 99, "k0", "4 k0:a7:0")], "unexpected"),  # an aborted input record
    (lambda out: _swap_first_two_of_k0(out), "keys_differ"),  # k0's first two records in the wrong order
    (lambda out: [(p, o, k, ("9" + v[1:]) if i == 0 else v) for i, (p, o, k, v) in enumerate(out)], "bad_counts"),
    (lambda out: out[:1] + [(0, 9, "k0", "x")] + out[1:], "malformed"),
])
def test_the_kafka_check_finds_what_is_wrong(change, finding):
    result = check_kafka(INPUT, change(_output(INPUT)))
    assert not result["ok"]
    assert result[finding], result
    if finding == "keys_differ":
        assert result["keys_differ"] == ["k0"] and not result["bad_counts"] and not result["lost"]


def _ranges(inp: list[tuple[int, int, str, str]], upto: dict[int, int]) -> dict[int, list[list[object]]]:
    """Two batches' ranges reading each partition ``p`` up to offset ``upto[p]`` (exclusive), split in the middle."""
    ranges: dict[int, list[list[object]]] = {2000: [], 4000: []}
    for p in sorted({r[0] for r in inp}):
        end = upto.get(p, 0)
        ranges[2000].append(["in", p, 0, end // 2])
        ranges[4000].append(["in", p, end // 2, end])
    return ranges


def test_the_kafka_check_expects_the_input_of_the_ranges_read():
    ends = {p: max(o for q, o, _k, _v in INPUT if q == p) + 1 for p in {r[0] for r in INPUT}}
    read = [r for r in INPUT if r[1] < 3]  # every partition read up to offset 3: the stream was behind
    upto = {p: 3 for p in ends}
    result = check_kafka(INPUT, _output(read), _ranges(INPUT, upto))
    assert result["ok"], result
    assert result["expected_records"] == len(read) and result["not_read"] == len(INPUT) - len(read) > 0
    # A record of the ranges read is missing: lost (not "not read").
    result = check_kafka(INPUT, _output(read)[1:], _ranges(INPUT, upto))
    assert not result["ok"] and result["lost"] == 1
    # A batch cut by the final stop: its Kafka output committed, its ranges not written.
    result = check_kafka(INPUT, _output(INPUT), _ranges(INPUT, upto))
    assert result["ok"] and result["beyond_ranges"] == len(INPUT) - len(read), result
    # ... of which only some output partitions committed: k0's records are all there, k3's (same input partition,
    # another output partition) not at all; a record of k0 missing in between is lost.
    cut = read + [r for r in INPUT if r[2] == "k0" and r[1] >= 3]
    result = check_kafka(INPUT, _output(sorted(cut)), _ranges(INPUT, upto))
    assert result["ok"] and result["beyond_ranges"] == 2, result
    result = check_kafka(INPUT, _output(sorted(cut[:-2] + cut[-1:])), _ranges(INPUT, upto))
    assert not result["ok"] and result["lost"] == 1, result
    # Ranges that do not follow one another: a gap (or an overlap) between two batches.
    gap = _ranges(INPUT, upto)
    gap[4000][0][2] += 1
    result = check_kafka(INPUT, _output(read), gap)
    assert not result["ok"] and result["range_gaps"][0]["batch_ms"] == 4000, result
    assert check_kafka(INPUT, _output(INPUT), _ranges(INPUT, ends))["ok"]


def test_the_kafka_branch_counts_each_key_on_in_offset_order():
    state = chaos_app.update_running([(2, 7, "k1:b:0"), (2, 5, "k1:a:0")], None)
    assert state == (2, [(1, "k1:a:0"), (2, "k1:b:0")])
    state = chaos_app.update_running([(2, 9, "k1:c:0")], state)
    assert state == (3, [(3, "k1:c:0")])
    assert chaos_app.update_running([], state) == (3, [])  # a batch without the key: nothing written
    assert chaos_app.running_records(("k1", state)) == [("k1", "3 k1:c:0")]
