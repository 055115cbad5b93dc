"""Storage queries the REST API relies on: GPU-seconds per study, the 'stopping' state,
trial pages as stored rows."""

from __future__ import annotations

import json

import pytest

from dse.core.records import Outcome
from dse.storage import Storage, trial_from_stored
from dse.storage._rows import TRIAL_COLUMNS


def _study(storage: Storage, name: str) -> int:
    return storage.create_study(
        name=name, space_yaml="{}", space_hash="h", direction="maximize",
        metric="tflops_per_gpu", model={}, hardware={},
    ).id  # fmt: skip


def _finish(storage: Storage, study_id: int, n: int, gpu_seconds: float | None) -> None:
    params = {"micro_batch_size": n}
    t = storage.claim_trial(
        study_id=study_id, params=params, params_key=str(n), budget=100, runner="r"
    )
    assert t is not None
    storage.start_trial(t.id, runner="r", host="h", log_path=None, metrics_path=None)
    storage.finish_trial(
        t.id, Outcome("ok", {"tflops_per_gpu": 1.0}), value=1.0, gpu_seconds=gpu_seconds
    )


def test_gpu_seconds_sums_a_study(storage: Storage) -> None:
    a, b = _study(storage, "a"), _study(storage, "b")
    assert storage.gpu_seconds(a) == 0.0
    _finish(storage, a, 1, 120.5)
    _finish(storage, a, 2, None)  # CPU trials record none
    _finish(storage, a, 3, 30.0)
    _finish(storage, b, 1, 1000.0)
    assert storage.gpu_seconds(a) == pytest.approx(150.5)
    assert storage.gpu_seconds(b) == pytest.approx(1000.0)
    assert storage.gpu_seconds(999) == 0.0


def test_stopping_is_a_study_state(storage: Storage) -> None:
    _study(storage, "s")
    storage.set_study_state("s", "running")
    storage.set_study_state("s", "stopping")
    assert storage.get_study("s").state == "stopping"


def _seed_mixed(storage: Storage) -> int:
    sid = _study(storage, "mixed")
    for n in range(12):
        params = {"micro_batch_size": n}
        t = storage.claim_trial(
            study_id=sid, params=params, params_key=str(n), budget=100, runner="r"
        )
        assert t is not None
        if n % 4 == 3:
            continue  # stays queued: no value
        storage.start_trial(t.id, runner="r", host="h", log_path=None, metrics_path=None)
        if n % 4 == 2:
            out = Outcome.failure("oom", "CUDA out of memory", metrics={"peak_mem_gib": 80.0})
            storage.finish_trial(t.id, out, value=None, gpu_seconds=5.0)
        else:
            value = float(n % 5)  # ties on purpose
            metrics = {"tflops_per_gpu": value, "peak_mem_gib": 10.0 + n, "step_time_s": 0.5,
                       "losses": [1.0, float("nan")]}  # fmt: skip
            storage.finish_trial(t.id, Outcome("ok", metrics), value=value, gpu_seconds=1.0)
    return sid


@pytest.mark.parametrize("order", ["number", "-number", "value", "-value"])
def test_pages_are_slices_of_the_whole_order(storage: Storage, order: str) -> None:
    sid = _seed_mixed(storage)
    whole = [t.number for t in storage.list_trials(sid, order=order)]
    assert sorted(whole) == list(range(12))
    if order in ("value", "-value"):
        values = [t.value for t in storage.list_trials(sid, order=order)]
        present = [v for v in values if v is not None]
        assert values[: len(present)] == present  # no value last
        assert present == sorted(present, reverse=order == "-value")
    for limit in (1, 5, 100):
        for offset in (0, 3, 11, 12, 50):
            page = storage.list_trials(sid, order=order, limit=limit, offset=offset)
            assert [t.number for t in page] == whole[offset : offset + limit]
    assert [t.number for t in storage.list_trials(sid, order=order, offset=4)] == whole[4:]
    oom = storage.list_trials(sid, state="infeasible", order=order, limit=2, offset=1)
    assert [t.failure_class for t in oom] == ["oom", "oom"]


def test_trial_points(storage: Storage) -> None:
    sid = _seed_mixed(storage)
    points = storage.list_trial_points(sid)
    trials = storage.list_trials(sid)
    assert [p.number for p in points] == [t.number for t in trials]
    for p, t in zip(points, trials, strict=True):
        assert (p.id, p.state, p.params, p.value) == (t.id, t.state, t.params, t.value)
        assert (p.failure_class, p.reason, p.gpu_seconds) == (
            t.failure_class, t.reason, t.gpu_seconds,
        )  # fmt: skip
        assert p.tflops_per_gpu == t.metrics.get("tflops_per_gpu")
        assert p.peak_mem_gib == t.metrics.get("peak_mem_gib")
        assert p.step_time_s == t.metrics.get("step_time_s")
    oom = next(p for p in points if p.failure_class == "oom")
    assert oom.peak_mem_gib == 80.0 and oom.tflops_per_gpu is None
    assert storage.list_trial_points(999) == []


def test_trial_runs_are_the_latest_starts_in_narrow_rows(storage: Storage) -> None:
    """``list_trial_runs`` (the timeline's read): trials that started or were re-queued after
    starting, the latest ``last`` starts, oldest first; with the GPU slots they recorded."""
    sid = _study(storage, "runs")
    ids = []
    for n in range(5):
        t = storage.claim_trial(study_id=sid, params={"n": n}, params_key=str(n), budget=9)
        assert t is not None
        ids.append(t.id)
    for n in range(3):
        storage.start_trial(ids[n], runner="r", host=f"h{n}", log_path=None, metrics_path=None)
    metrics = {"tflops_per_gpu": 1.0, "gpu_slots": ["h0:0", "h0:1"]}
    storage.finish_trial(ids[0], Outcome("ok", metrics), value=1.0)
    storage.requeue_trial(ids[2], reason="controller lost")  # ran, back in the queue
    # trial 3 and 4 never started: not runs
    runs = storage.list_trial_runs(sid)
    assert [r.number for r in runs][-2:] == [0, 1] and {r.number for r in runs} == {0, 1, 2}
    first = next(r for r in runs if r.number == 0)
    assert first.state == "complete" and first.gpu_slots == ("h0:0", "h0:1")
    assert first.started_at is not None and first.finished_at is not None
    back = next(r for r in runs if r.number == 2)
    assert back.state == "queued" and back.started_at is None
    assert back.history[0]["host"] == "h2" and back.history[0]["started_at"] is not None
    assert storage.count_trial_runs(sid) == 3
    # the latest start only (a waiting re-queued trial has none: it comes last)
    assert [r.number for r in storage.list_trial_runs(sid, last=1)] == [1]


@pytest.mark.parametrize("order", ["number", "-number", "value", "-value"])
def test_trial_page_is_a_page_of_list_trials_as_stored_rows(storage: Storage, order: str) -> None:
    """``trial_page`` (one query, JSON columns as their stored text) holds the trials of the
    same page of ``list_trials``, in its order, every field equal once decoded."""
    sid = _seed_mixed(storage)
    for state in (None, "complete", "infeasible", "queued"):
        for limit, offset in ((1, 0), (5, 3), (100, 0), (4, 11), (3, 12), (2, 50)):
            stored = storage.trial_page(sid, state=state, limit=limit, offset=offset, order=order)
            page = storage.list_trials(sid, state=state, limit=limit, offset=offset, order=order)
            assert [trial_from_stored(r) for r in stored] == page
    row = storage.trial_page(sid, limit=1, order="number")[0]
    assert isinstance(row[TRIAL_COLUMNS.index("params")], str)  # not decoded
    assert json.loads(row[TRIAL_COLUMNS.index("params")]) == {"micro_batch_size": 0}


def test_a_stored_row_changes_when_its_trial_does(storage: Storage) -> None:
    """Equal stored rows mean an unchanged trial: finishing one changes its row only."""
    sid = _seed_mixed(storage)
    before = storage.trial_page(sid, limit=100, order="number")
    queued = storage.list_trials(sid, state="queued")[0]
    storage.start_trial(queued.id, runner="r", host="h2", log_path=None, metrics_path=None)
    after = storage.trial_page(sid, limit=100, order="number")
    changed = [b[0] for b, a in zip(before, after, strict=True) if a != b]
    assert changed == [queued.id]


def test_trial_page_refuses_bad_arguments(storage: Storage) -> None:
    sid = _study(storage, "s")
    with pytest.raises(ValueError, match="order must be one of"):
        storage.trial_page(sid, order="value; DROP")
    with pytest.raises(ValueError, match="trial state must be one of"):
        storage.trial_page(sid, state="done")
    with pytest.raises(ValueError, match="limit >= 1"):
        storage.trial_page(sid, limit=0)
    assert storage.trial_page(sid) == []
