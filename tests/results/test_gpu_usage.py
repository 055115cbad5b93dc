"""GPU time of trials and studies (dse.results.gpu_usage): the start-up / measure split of a trial,
a study's held time and busy fraction, and the saving against the whole grid."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest

from dse.core.records import StepMetrics, StudyRecord, TrialRecord
from dse.loop.study import _slots_of
from dse.model.rules import check_space
from dse.results.gpu_usage import (
    HELD_ATTR_PREFIX,
    GridCount,
    count_grid,
    grid_attr,
    grid_of_study,
    held_record,
    study_gpu_usage,
    trial_timing,
)
from dse.space.searchspace import load_space
from tests.conftest import EXAMPLES


def _steps(*times: float) -> tuple[StepMetrics, ...]:
    return tuple(StepMetrics(i, t, 100.0, 1.0, 1.0, 10.0) for i, t in enumerate(times))


def test_trial_timing_splits_the_wall_time() -> None:
    m = trial_timing(wall_s=10.0, devices=2, device="cuda", steps=_steps(1.0, 0.5, 0.5),
                     measured=True, gpu_slots=["h:0", "h:1"])  # fmt: skip
    assert m["timing"] == {"device": "cuda", "devices": 2, "wall_s": 10.0, "startup_s": 8.0,
                           "measure_s": 2.0}  # fmt: skip
    assert m["gpu_seconds_measure"] == 4.0 and m["gpu_seconds_startup"] == 16.0
    assert m["gpu_seconds_measure"] + m["gpu_seconds_startup"] == 10.0 * 2  # = gpu_seconds
    assert m["gpu_slots"] == ["h:0", "h:1"]
    # CPU: wall seconds only; a replay's step times are not this trial's; steps never
    # exceed the wall time
    cpu = trial_timing(wall_s=3.0, devices=1, device="cpu", steps=_steps(1.0), measured=True)
    assert set(cpu) == {"timing"} and cpu["timing"]["measure_s"] == 1.0
    replay = trial_timing(wall_s=3.0, devices=1, device="cuda", steps=_steps(9.0),
                          measured=False)  # fmt: skip
    assert replay["gpu_seconds_measure"] == 0.0 and replay["gpu_seconds_startup"] == 3.0
    short = trial_timing(wall_s=1.0, devices=1, device="cuda", steps=_steps(5.0), measured=True)
    assert short["timing"]["measure_s"] == 1.0 and short["timing"]["startup_s"] == 0.0


def _trial(n: int, wall: float, measure: float, devices: int = 1, device: str = "cuda",
           **kw: Any) -> TrialRecord:  # fmt: skip
    metrics = trial_timing(wall_s=wall, devices=devices, device=device,
                           steps=_steps(measure), measured=True)  # fmt: skip
    gpu_s = wall * devices if device == "cuda" else None
    return TrialRecord(id=n, study_id=1, number=n, state="complete", params={}, params_key="",
                       metrics=metrics, gpu_seconds=gpu_s, **kw)  # fmt: skip


def test_study_usage_held_by_the_controller() -> None:
    trials = [_trial(0, 20.0, 5.0), _trial(1, 10.0, 8.0), _trial(2, 6.0, 5.0)]
    attrs = {
        HELD_ATTR_PREFIX + "a:1:x": held_record(1000.0, 2, "cuda", last=1020.0),  # 40 s
        HELD_ATTR_PREFIX + "b:2:y": held_record(2000.0, 2, "cuda", last=2005.0),  # 10 s
        "run_settings": {"not": "held"},
    }
    g = study_gpu_usage(trials, attrs, device="cuda", grid=GridCount(10, 10, True))
    assert g["held_basis"] == "controller" and g["device_seconds_held"] == 50.0
    assert g["device_seconds_measure"] == 18.0 and g["device_seconds_startup"] == 18.0
    assert g["busy_fraction"] == pytest.approx(18.0 / 50.0)
    assert g["gpu_hours"] == pytest.approx(36.0 / 3600)
    assert g["gpu_hours_measure"] == pytest.approx(18.0 / 3600)
    assert g["gpu_hours_startup"] == pytest.approx(18.0 / 3600)
    assert g["held_gpu_hours"] == pytest.approx(50.0 / 3600)
    # the grid: 10 configurations at the mean 12 GPU-seconds per trial (estimates)
    assert g["mean_gpu_seconds_per_trial"] == pytest.approx(12.0)
    assert g["grid_gpu_hours"] == pytest.approx(120.0 / 3600)
    assert g["saved_gpu_hours"] == pytest.approx(84.0 / 3600)
    assert g["saved_fraction"] == pytest.approx(0.7)
    assert "estimate" in g["label"]


def test_study_usage_per_trial_runners_and_cpu() -> None:
    trials = [_trial(0, 20.0, 5.0, devices=4), _trial(1, 10.0, 8.0, devices=4)]
    # a runner that takes devices per trial (devices None): held = the trials' own time
    attrs = {HELD_ATTR_PREFIX + "c:1:z": held_record(0.0, None, "cuda", last=500.0)}
    g = study_gpu_usage(trials, attrs, device="cuda", grid=None)
    assert g["held_basis"] == "trials" and g["device_seconds_held"] == 120.0
    assert g["busy_fraction"] == pytest.approx(52.0 / 120.0)
    assert g["grid_configurations"] is None and g["saved_gpu_hours"] is None
    # CPU: a busy fraction of CPU ranks, no GPU figures
    cpu = [_trial(0, 4.0, 1.0, device="cpu")]
    attrs = {HELD_ATTR_PREFIX + "d:1:w": held_record(0.0, 1, "cpu", last=8.0)}
    g = study_gpu_usage(cpu, attrs, device="cpu", grid=GridCount(3, 3, True))
    assert g["busy_fraction"] == pytest.approx(1.0 / 8.0)
    assert g["gpu_hours"] == 0.0 and g["held_gpu_hours"] is None
    assert g["gpu_hours_measure"] is None and g["grid_gpu_hours"] is None
    # nothing timed yet
    empty = study_gpu_usage([], {}, device="cuda", grid=None)
    assert empty["busy_fraction"] is None and empty["held_basis"] is None
    assert empty["gpu_hours"] == 0.0 and empty["trials_run"] == 0


def test_grid_is_the_space_checks_count() -> None:
    space = load_space(EXAMPLES / "llama_1b_h200.yaml")
    g = count_grid(space)
    got = check_space(space, "x")
    assert (g.looked_at, g.configurations) == (got.looked_at, got.valid)
    assert g.complete and g.configurations < space.size()  # rules and duplicates removed
    # a study's stored count is used when it is for its space; else it is counted
    study = StudyRecord(id=1, name=space.study, space_yaml=(EXAMPLES / "llama_1b_h200.yaml")
                        .read_text(), space_hash="h1", state="complete", direction="maximize",
                        metric="tflops_per_gpu", created_at=0.0)  # fmt: skip
    stored = {"grid": grid_attr(GridCount(7, 9, False), "h1")}
    assert grid_of_study(study, stored) == GridCount(7, 9, False)
    assert grid_of_study(study, {"grid": grid_attr(GridCount(7, 9, False), "other")}) == g
    assert grid_of_study(study, {}) == g


def test_gpu_slots_of_a_cluster_placement() -> None:
    assert _slots_of("node1:gpu0,1,node2:gpu0,1") == ("node1:0", "node1:1", "node2:0", "node2:1")
    assert _slots_of("n7:gpu3") == ("n7:3",)
    assert _slots_of(None) == () and _slots_of("cpu-node") == ()


def test_grid_of_a_large_space_is_estimated_from_a_bounded_sample() -> None:
    """The Bridge-style example (590,000 combinations): the count looks at no more than the
    cap (it used to check 100,000 configurations, 18 s of CPU, in `dse status` and in each
    API process), and the figure is an estimate for the whole space, not the valid ones among
    the first combinations in enumeration order (62,496 of 100,000 there)."""
    from dse.model.rules import CHECK_SPACE_CAP

    space = load_space(EXAMPLES / "bridge_moe_sim.yaml")
    g = count_grid(space)
    assert not g.complete and g.looked_at <= CHECK_SPACE_CAP
    # the whole count (238,464: check_space with CHECK_SPACE_CAP above the space, 3.5 min)
    assert abs(g.configurations - 238_464) < 0.05 * 238_464, g


def test_measured_share_leaves_out_builds_first_and_warmup_steps() -> None:
    """The headline study's question: how much of the held GPU time went into the steps its
    figures come from (not the first step's compilation, the warm-up or the model build)."""

    def trial(n: int, build: float, times: tuple[float, ...], warmup: int) -> TrialRecord:
        metrics = trial_timing(wall_s=30.0, devices=1, device="cuda", steps=_steps(*times),
                               measured=True)  # fmt: skip
        metrics.update(build_s=build, first_step_s=times[0],
                       warmup_steps_s=sum(times[:warmup]),
                       measured_steps_s=sum(times[warmup:]))  # fmt: skip
        return TrialRecord(id=n, study_id=1, number=n, state="complete", params={},
                           params_key="", metrics=metrics, gpu_seconds=30.0)  # fmt: skip

    # a first step of 12 s (compilation), one warm-up step of 1 s, four measured of 1 s
    trials = [trial(0, 3.0, (12.0, 1.0, 1.0, 1.0, 1.0, 1.0), 2), trial(1, 1.0, (2.0,) * 6, 2)]
    attrs = {HELD_ATTR_PREFIX + "a:1:x": held_record(0.0, 1, "cuda", last=80.0)}
    g = study_gpu_usage(trials, attrs, device="cuda", grid=None)
    assert g["busy_fraction"] == pytest.approx((17.0 + 12.0) / 80.0)  # every step
    assert g["measured_fraction"] == pytest.approx((4.0 + 8.0) / 80.0)
    assert g["kernel_fraction"] == pytest.approx((17.0 + 3.0 + 12.0 + 1.0) / 80.0)
    assert g["device_seconds_first_step"] == pytest.approx(14.0)
    assert g["first_step_s_max"] == 12.0 and g["trials_without_split"] == 0
    # a trial without the split (another workload): its steps count as measured
    old = _trial(2, 10.0, 5.0)
    g = study_gpu_usage([old], attrs, device="cuda", grid=None)
    assert g["measured_fraction"] == pytest.approx(5.0 / 80.0)
    assert g["trials_without_split"] == 1 and g["first_step_s_median"] is None


def test_accounting_splits_the_held_time_into_parts_that_add_up() -> None:
    """Issue 36: every held GPU-second in one part (build, first step, warm-up, measured, the
    rest of the trial, between trials), as seconds, shares and seconds per trial."""

    def trial(n: int, build: float, times: tuple[float, ...], warmup: int) -> TrialRecord:
        metrics = trial_timing(wall_s=30.0, devices=1, device="cuda", steps=_steps(*times),
                               measured=True)  # fmt: skip
        metrics.update(build_s=build, first_step_s=times[0],
                       warmup_steps_s=sum(times[:warmup]),
                       measured_steps_s=sum(times[warmup:]))  # fmt: skip
        return TrialRecord(id=n, study_id=1, number=n, state="complete", params={},
                           params_key="", metrics=metrics, gpu_seconds=30.0)  # fmt: skip

    # trial 0: build 3, first step 12, one warm-up step 1, four measured 1 s each (wall 30);
    # trial 1: build 1, first 2, one warm-up 2, four measured 2 (wall 30); held 80 s
    trials = [trial(0, 3.0, (12.0, 1.0, 1.0, 1.0, 1.0, 1.0), 2), trial(1, 1.0, (2.0,) * 6, 2)]
    attrs = {HELD_ATTR_PREFIX + "a:1:x": held_record(0.0, 1, "cuda", last=80.0)}
    acc = study_gpu_usage(trials, attrs, device="cuda", grid=None)["accounting"]
    sec = acc["seconds"]
    assert sec == pytest.approx({"build": 4.0, "first_step": 14.0, "warmup": 3.0,
                                 "measured": 12.0, "in_trial_other": 60.0 - 33.0,
                                 "between_trials": 20.0})  # fmt: skip
    assert sum(sec.values()) == pytest.approx(acc["held_s"]) and acc["held_s"] == 80.0
    assert acc["shares"]["measured"] == pytest.approx(12.0 / 80.0)
    assert sum(acc["shares"].values()) == pytest.approx(1.0)
    assert acc["per_trial_s"]["first_step"] == pytest.approx(7.0)
    # the same figure as busy_shares' measured share
    g = study_gpu_usage(trials, attrs, device="cuda", grid=None)
    assert acc["shares"]["measured"] == pytest.approx(g["measured_fraction"])
    # no held time known: no accounting
    assert study_gpu_usage([], {}, device="cuda", grid=None)["accounting"] is None


@pytest.mark.parametrize("seed", range(8))
def test_usage_of_records_is_the_reference_fold(seed: int) -> None:
    """study_gpu_usage (per-trial figures added up, then one builder shared with the
    storage's totals) gives exactly what the fold over every trial's metrics gave before
    (tests/gpu_reference.py), on random trials: estimates, trials without timing or split,
    values that are not numbers, ties and zeros among the first steps."""
    from tests.gpu_reference import GRID, random_attrs, random_trials, reference_usage

    rng = random.Random(seed)
    trials = random_trials(rng, rng.choice([0, 1, 2, 7, 60, 301]))
    for device in ("cuda", "cpu"):
        attrs = random_attrs(rng)
        grid = rng.choice([GRID, None])
        got = study_gpu_usage(trials, attrs, device=device, grid=grid)
        assert got == reference_usage(trials, attrs, device=device, grid=grid)
        acc = got["accounting"]
        if acc is not None:
            assert all(v >= 0 for v in acc["seconds"].values())
            assert sum(acc["shares"].values()) == pytest.approx(1.0)
    # all estimates: no GPU time
    est = [dataclasses.replace(t, source="estimate") for t in trials[:3]]
    if est:
        got = study_gpu_usage(est, {}, device="cuda", grid=GRID)
        assert got["accounting"] is None
        assert got == reference_usage(est, {}, device="cuda", grid=GRID)


def test_trial_gpu_figures() -> None:
    """One trial's part of its study's GPU time (the storage's columns): finite numbers or
    None, whatever its metrics hold."""
    from dse.stats.gpu_figures import TRIAL_GPU_FIGURES, trial_gpu_figures

    assert trial_gpu_figures({}) == dict.fromkeys(TRIAL_GPU_FIGURES)
    m = trial_timing(wall_s=10.0, devices=2, device="cuda", steps=_steps(1.0, 3.0),
                     measured=True)  # fmt: skip
    f = trial_gpu_figures(m)
    assert f == {"gpu_seconds_startup": 12.0, "gpu_seconds_measure": 8.0, "device_seconds": 20.0,
                 "device_seconds_measure": 8.0, "device_seconds_measured": 8.0,
                 "device_seconds_kernel": 8.0, "device_seconds_first_step": None,
                 "first_step_s": None}  # fmt: skip
    m.update(build_s=2.0, first_step_s=1.0, measured_steps_s=2.5)
    f = trial_gpu_figures(m)
    assert (f["device_seconds_measured"], f["device_seconds_kernel"]) == (5.0, 12.0)
    assert (f["device_seconds_first_step"], f["first_step_s"]) == (2.0, 1.0)
    # not numbers count as 0, a product beyond a float too; a first step is never -0.0
    huge = {"timing": {"devices": 1e200, "wall_s": 1e200, "measure_s": "x"},
            "measured_steps_s": 1.0, "first_step_s": -0.0,
            "gpu_seconds_startup": float("nan")}  # fmt: skip
    f = trial_gpu_figures(huge)
    assert f["device_seconds"] == 0.0 and f["gpu_seconds_startup"] is None
    assert f["device_seconds_measure"] == 0.0 and math.copysign(1.0, f["first_step_s"]) == 1.0


def test_status_and_report_show_the_held_time_by_part() -> None:
    """dse status's text and the report's GPU rows carry every part of the accounting."""
    from dse.cli.main import _busy_shares_text
    from dse.report.page import _busy_rows
    from dse.results.gpu_usage import ACCOUNT_PARTS

    def trial(n: int) -> TrialRecord:
        metrics = trial_timing(wall_s=30.0, devices=1, device="cuda",
                               steps=_steps(12.0, 1.0, 1.0, 1.0), measured=True)  # fmt: skip
        metrics.update(build_s=3.0, first_step_s=12.0, warmup_steps_s=13.0, measured_steps_s=2.0)
        return TrialRecord(id=n, study_id=1, number=n, state="complete", params={},
                           params_key="", metrics=metrics, gpu_seconds=30.0)  # fmt: skip

    attrs = {HELD_ATTR_PREFIX + "a:1:x": held_record(0.0, 1, "cuda", last=80.0)}
    g = study_gpu_usage([trial(0), trial(1)], attrs, device="cuda", grid=None)
    text = _busy_shares_text(g)
    assert "held time by part (80.00 device-s)" in text
    assert "measured 4.000 s (5%; 2.000 s/trial)" in text
    assert "between trials 20.00 s (25%; 10.00 s/trial)" in text
    rows = {r[0]: r[2] for r in _busy_rows(g)}
    assert {f"held-{k.replace('_', '-')}" for k, _ in ACCOUNT_PARTS} <= set(rows)
    assert rows["held-first-step"] == "24.00 s, 30.0%, 12.00 s per trial"
