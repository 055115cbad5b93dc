"""The pure parts of the decision views (dse.report.plots): GPU slots from the runners' records,
lanes of the timeline (recorded, placed, or inferred from overlaps: as few as the overlaps
need), idle gaps, host names hidden for readers without the token, and model identity."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dse.core.records import TrialRecord
from dse.report.plots import STATE_COLORS, model_differences, parse_placement, timeline


def _t(
    number: int,
    start: float | None,
    end: float | None,
    *,
    state: str = "complete",
    host: str | None = "box",
    history: tuple[dict[str, Any], ...] = (),
    **metrics: Any,
) -> TrialRecord:
    return TrialRecord(
        id=number + 1, study_id=1, number=number, state=state,  # type: ignore[arg-type]
        params={}, params_key="{}", metrics=metrics, host=host, started_at=start,
        finished_at=end, history=history,
    )  # fmt: skip


def test_parse_placement_of_the_cluster_runners() -> None:
    assert parse_placement("node-1:gpu0,1,node-2:gpu0,1") == [
        ("node-1", "0"), ("node-1", "1"), ("node-2", "0"), ("node-2", "1"),
    ]  # fmt: skip
    assert parse_placement("n7:gpu3") == [("n7", "3")]
    assert parse_placement("a:gpu0,b") == [("a", "0"), ("b", "")]  # a node without GPUs
    # a plain host name (the local runner) or nothing: no placement
    assert parse_placement("box") is None
    assert parse_placement(None) is None
    assert parse_placement("") is None
    assert parse_placement("a:gpu0,b:c") is None  # not a placement: no guess


def test_lanes_from_recorded_gpu_slots() -> None:
    tl = timeline(
        [
            _t(0, 100.0, 200.0, gpu_slots=["h:0", "h:1"]),
            _t(1, 100.0, 150.0, gpu_slots=["h:2", "h:3"]),
            _t(2, 210.0, 260.0, state="pruned", gpu_slots=["h:0", "h:1"]),
            _t(3, None, None, state="queued"),  # never started: no bar
        ],
        now=1000.0,
    )
    assert [x["label"] for x in tl["lanes"]] == ["h:0", "h:1", "h:2", "h:3"]
    assert len(tl["bars"]) == 6
    assert tl["slots_from"] == ["gpu_slots"]
    assert tl["t0"] == 100.0 and tl["span_s"] == 160.0 and tl["unit"] == "s"
    # idle gaps: 200..210 on h:0 and h:1 (nothing after the last bar of a lane)
    assert [(g["lane"], g["start"], g["end"]) for g in tl["gaps"]] == [
        ("h:0", 100.0, 110.0), ("h:1", 100.0, 110.0),
    ]  # fmt: skip
    assert tl["lanes"][0]["busy_s"] == 150.0
    assert tl["lanes"][2]["busy_fraction"] == pytest.approx(50 / 160)
    assert tl["busy_fraction"] == pytest.approx((150 + 150 + 50 + 50) / (160 * 4))
    assert {b["state"] for b in tl["bars"]} == {"complete", "pruned"}
    assert tl["colors"] == STATE_COLORS and "pruned" in STATE_COLORS


def test_lanes_from_a_cluster_placement_and_hidden_host_names() -> None:
    trials = [
        _t(0, 0.0, 60.0, host="node-b:gpu0,1,node-a:gpu0,1"),
        _t(1, 70.0, 90.0, host="node-a:gpu0,1,node-b:gpu0,1", state="failed"),
    ]
    tl = timeline(trials, now=100.0)
    assert [x["label"] for x in tl["lanes"]] == ["node-a:0", "node-a:1", "node-b:0", "node-b:1"]
    assert len(tl["bars"]) == 8 and tl["slots_from"] == ["placement"]
    hidden = timeline(trials, now=100.0, redact_hosts=True)
    assert [x["label"] for x in hidden["lanes"]] == [
        "node 1:0",
        "node 1:1",
        "node 2:0",
        "node 2:1",
    ]
    assert "node-a" not in str(hidden) and "node-b" not in str(hidden)


def test_lanes_inferred_from_overlaps_with_a_running_trial_and_an_interrupted_attempt() -> None:
    lost = {"at": 40.0, "reason": "controller lost", "state": "running", "host": "box",
            "started_at": 20.0}  # fmt: skip
    trials = [
        _t(0, 0.0, 50.0),
        _t(1, 10.0, 70.0),
        _t(2, 55.0, 90.0, state="failed"),
        _t(3, 60.0, None, state="running", history=(lost,)),
    ]
    tl = timeline(trials, now=100.0)
    # 0..50, 10..70 and the attempt 20..40 overlap: three lanes; 55.. reuses lane 1 and 60..
    # (running until now) lane 3
    assert [x["label"] for x in tl["lanes"]] == ["box · slot 1", "box · slot 2", "box · slot 3"]
    lanes = {(b["trial"], b["state"]): b["lane"] for b in tl["bars"]}
    assert lanes == {
        (0, "complete"): "box · slot 1", (1, "complete"): "box · slot 2",
        (3, "interrupted"): "box · slot 3", (2, "failed"): "box · slot 1",
        (3, "running"): "box · slot 3",
    }  # fmt: skip
    running = next(b for b in tl["bars"] if b["state"] == "running")
    assert running["end"] == 100.0 and running["open"] is True
    assert tl["slots_from"] == ["overlap"]
    assert "inferred" in tl["label"]


def test_an_empty_timeline() -> None:
    tl = timeline([_t(0, None, None, state="queued")], now=5.0)
    assert tl["lanes"] == [] and tl["bars"] == [] and tl["busy_fraction"] is None
    assert tl["label"] == "no trial has started yet"


def test_trials_shown_and_ran() -> None:
    lost = {"at": 2.0, "reason": "node lost", "host": "box", "started_at": 1.0}
    trials = [_t(i, float(i), float(i) + 0.5) for i in range(3)]
    trials.append(_t(3, None, None, state="queued", history=(lost,)))  # re-queued, waiting
    tl = timeline(trials, now=20.0)
    assert tl["trials_shown"] == tl["trials_ran"] == 4 and tl["runs"] == 4
    assert timeline(trials, now=20.0, trials_ran=10)["trials_ran"] == 10


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 30)), min_size=1, max_size=25))
def test_inferred_lanes_are_as_few_as_the_overlaps_need(spans: list[tuple[int, int]]) -> None:
    trials = [_t(i, float(a), float(a + d)) for i, (a, d) in enumerate(spans)]
    tl = timeline(trials, now=1000.0)
    # the most trials running at one moment (a run ending when another starts does not overlap)
    events = sorted([(a, 1) for a, _ in spans] + [(a + d, -1) for a, d in spans],
                    key=lambda e: (e[0], e[1]))  # fmt: skip
    depth = peak = 0
    for _, step in events:
        depth += step
        peak = max(peak, depth)
    assert len(tl["lanes"]) == peak
    # no two runs overlap in one lane
    for lane in tl["lanes"]:
        runs = sorted((b["start"], b["end"]) for b in tl["bars"] if b["lane"] == lane["label"])
        assert all(b0 <= a1 for (_, b0), (a1, _) in zip(runs, runs[1:], strict=False))


def test_model_differences() -> None:
    a = {"num_layers": 4, "hidden_size": 64, "seq_length": 64}
    assert model_differences(a, {**a, "seq_length": 4096}) == []  # a training setting
    assert model_differences(a, {**a, "num_layers": 8}) == ["num_layers 4 vs 8"]
    assert model_differences(a, {"num_layers": 4, "hidden_size": 64, "num_moe_experts": 8}) == [
        "num_moe_experts None vs 8"
    ]
