"""The storage contract, run on every backend (SQLite file, SQLite memory, PostgreSQL)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import SQLAlchemyError

from dse.core.exceptions import (
    DuplicatedStudyError,
    StorageError,
    StudyFormatError,
    StudyNotFoundError,
    TrialNotFoundError,
)
from dse.core.records import Outcome, StepMetrics, StudyRecord, TrialRecord
from dse.space.searchspace import parse_space_text
from dse.storage import Storage, head_revision
from tests.conftest import EXAMPLES

TABLES = {"studies", "study_attrs", "trials", "trial_params", "trial_steps", "rejections"}


#: A real space file: an import derives the study's fields from it (the CPU demo's).
SPACE = (EXAMPLES / "tiny_gpt_cpu.yaml").read_text()
FIELDS = {k: v for k, v in parse_space_text(SPACE, "s").study_fields().items() if k != "name"}


def make_study(storage: Storage, name: str = "s") -> StudyRecord:
    return storage.create_study(name=name, space_yaml=SPACE, **FIELDS)


def key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def claim(
    storage: Storage, study_id: int, tp: int, *, budget: int = 100, **kw: Any
) -> TrialRecord | None:
    params = {"tp": tp, "mbs": 1}
    return storage.claim_trial(
        study_id=study_id, params=params, params_key=key(params), budget=budget, **kw
    )


def steps(n: int, loss0: float = 10.0) -> tuple[StepMetrics, ...]:
    return tuple(
        StepMetrics(
            step=i,
            step_time_s=1.0 + i / 10,
            tflops_per_gpu=400.0 + i,
            peak_mem_gib=60.0,
            peak_reserved_gib=64.0,
            loss=loss0 - i,
            grad_norm=None if i == 0 else 1.5,
        )
        for i in range(n)
    )


def ok(value: float, n_steps: int = 3) -> Outcome:
    return Outcome("ok", {"tflops_per_gpu": value, "losses": [1.0, 0.5]}, steps=steps(n_steps))


# --- schema ------------------------------------------------------------------------------


def test_open_applies_migrations(storage: Storage) -> None:
    assert storage.revision == head_revision()
    with storage._engine.connect() as conn:
        assert TABLES <= set(inspect(conn).get_table_names())
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == (
            head_revision()
        )


# --- studies -----------------------------------------------------------------------------


def test_create_get_list_studies(storage: Storage) -> None:
    a = make_study(storage, "a")
    b = make_study(storage, "b")
    assert a.state == "created" and a.model == FIELDS["model"]
    assert storage.get_study("a") == a
    assert storage.get_study_by_id(b.id) == b
    assert [s.name for s in storage.list_studies()] == ["a", "b"]
    with pytest.raises(DuplicatedStudyError):
        make_study(storage, "a")
    with pytest.raises(StudyNotFoundError):
        storage.get_study("nope")
    with pytest.raises(StudyNotFoundError):
        storage.get_study_by_id(999_999)


def test_get_or_create_study(storage: Storage) -> None:
    kw: dict[str, Any] = {
        "name": "s",
        "space_yaml": "x",
        "direction": "minimize",
        "metric": "step_time_s",
        "model": {},
        "hardware": {},
    }
    first, created = storage.get_or_create_study(space_hash="h1", **kw)
    assert created
    again, created = storage.get_or_create_study(space_hash="h1", **kw)
    assert not created and again == first
    with pytest.raises(DuplicatedStudyError, match="'h1'.*'h2'"):
        storage.get_or_create_study(space_hash="h2", **kw)
    with pytest.raises(ValueError, match="direction"):
        storage.get_or_create_study(**{**kw, "name": "t", "direction": "up"}, space_hash="h")


def test_study_state_and_attrs(storage: Storage) -> None:
    s = make_study(storage)
    storage.set_study_state("s", "running")
    assert storage.get_study("s").state == "running"
    with pytest.raises(ValueError, match="study state"):
        storage.set_study_state("s", "exploded")
    with pytest.raises(StudyNotFoundError):
        storage.set_study_state("nope", "running")
    assert storage.get_study_attrs(s.id) == {}
    storage.set_study_attr(s.id, "costmodel", {"scale": 1.1, "n": [1, 2]})
    storage.set_study_attr(s.id, "agent", "tpe")
    storage.set_study_attr(s.id, "agent", {"name": "gp"})
    assert storage.get_study_attrs(s.id) == {
        "agent": {"name": "gp"},
        "costmodel": {"scale": 1.1, "n": [1, 2]},
    }
    with pytest.raises(ValueError, match="JSON"):
        storage.set_study_attr(s.id, "bad", object())
    with pytest.raises(StudyNotFoundError):
        storage.set_study_attr(999_999, "k", 1)


def test_delete_study_cascades(storage: Storage) -> None:
    s = make_study(storage)
    t = claim(storage, s.id, 1)
    assert t is not None
    storage.finish_trial(t.id, ok(1.0), value=1.0)
    storage.add_rejection(
        study_id=s.id, params={}, params_key="{}", kind="invalid", rule="r", reason="x", values={}
    )
    storage.set_study_attr(s.id, "k", 1)
    storage.delete_study("s")
    with pytest.raises(StudyNotFoundError):
        storage.get_study("s")
    with pytest.raises(TrialNotFoundError):
        storage.get_trial(t.id)
    with storage._engine.connect() as conn:
        for table in ("trials", "trial_params", "trial_steps", "rejections", "study_attrs"):
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() == 0, table


# --- claiming ----------------------------------------------------------------------------


def test_claim_numbers_are_contiguous_and_per_study(storage: Storage) -> None:
    a = make_study(storage, "a")
    b = make_study(storage, "b")
    numbers_a = [claim(storage, a.id, tp).number for tp in range(5)]  # type: ignore[union-attr]
    numbers_b = [claim(storage, b.id, tp).number for tp in range(3)]  # type: ignore[union-attr]
    assert numbers_a == [0, 1, 2, 3, 4]
    assert numbers_b == [0, 1, 2]
    t = storage.get_trial_by_number(a.id, 3)
    assert t.params == {"tp": 3, "mbs": 1} and t.state == "queued"
    assert t.queued_at is not None and t.heartbeat_at is not None


def test_claim_respects_budget(storage: Storage) -> None:
    s = make_study(storage)
    got = [claim(storage, s.id, tp, budget=3) for tp in range(6)]
    assert [t is not None for t in got] == [True, True, True, False, False, False]
    assert storage.count_trials(s.id)["total"] == 3
    # failed trials count against the budget too (every trial row does)
    first = got[0]
    assert first is not None
    storage.finish_trial(first.id, Outcome.failure("error", "boom"), value=None)
    assert claim(storage, s.id, 99, budget=3) is None


def test_claim_refuses_duplicates_unless_allowed(storage: Storage) -> None:
    s = make_study(storage)
    t = claim(storage, s.id, 2, runner="ctl-a")
    assert t is not None and t.runner == "ctl-a"
    assert claim(storage, s.id, 2) is None  # queued
    storage.start_trial(t.id, runner="ctl-a", host="n1", log_path=None, metrics_path=None)
    assert claim(storage, s.id, 2) is None  # running
    storage.finish_trial(t.id, ok(5.0), value=5.0)
    assert claim(storage, s.id, 2) is None  # complete
    again = claim(storage, s.id, 2, allow_repeat=True)
    assert again is not None and again.number == 1
    # an infeasible configuration is taken, a failed one may be retried
    inf = claim(storage, s.id, 4)
    assert inf is not None
    storage.finish_trial(inf.id, Outcome.failure("oom", "CUDA out of memory"), value=None)
    assert claim(storage, s.id, 4) is None
    bad = claim(storage, s.id, 8)
    assert bad is not None
    storage.finish_trial(bad.id, Outcome.failure("error", "segfault"), value=None)
    retry = claim(storage, s.id, 8)
    assert retry is not None and retry.number == 4


def test_claim_unknown_study(storage: Storage) -> None:
    with pytest.raises(StudyNotFoundError):
        claim(storage, 999_999, 1)


# --- running and finishing ---------------------------------------------------------------


def test_start_and_finish(storage: Storage) -> None:
    s = make_study(storage)
    t = claim(storage, s.id, 1)
    assert t is not None
    r = storage.start_trial(
        t.id, runner="ctl", host="node-7", log_path="/runs/t0/log.txt", metrics_path="/m.jsonl"
    )
    assert r.state == "running" and r.host == "node-7" and r.started_at is not None
    assert r.log_path == "/runs/t0/log.txt" and r.metrics_path == "/m.jsonl"
    assert storage.gpu_seconds(s.id) == 0.0
    f = storage.finish_trial(t.id, ok(512.5, n_steps=4), value=512.5, gpu_seconds=80.0)
    assert storage.gpu_seconds(s.id) == 80.0
    assert f.state == "complete" and f.value == 512.5 and f.gpu_seconds == 80.0
    assert f.source == "measured" and f.finished_at is not None and f.finished_at >= r.started_at
    assert f.steps == steps(4)
    got = storage.get_trial(t.id)
    assert got == f
    assert storage.get_trial(t.id, with_steps=False).steps == ()
    assert storage.get_trial_by_number(s.id, 0) == f


def test_finish_failure_classes(storage: Storage) -> None:
    s = make_study(storage)
    a, b = claim(storage, s.id, 1), claim(storage, s.id, 2)
    assert a is not None and b is not None
    fa = storage.finish_trial(
        a.id,
        Outcome.failure("oom", "CUDA OOM", metrics={"peak_mem_gib": 141.0}, source="replay"),
        value=None,
    )
    assert (fa.state, fa.failure_class, fa.reason, fa.source) == (
        "infeasible",
        "oom",
        "CUDA OOM",
        "replay",
    )
    assert fa.metrics == {"peak_mem_gib": 141.0}
    fb = storage.finish_trial(b.id, Outcome.failure("hang", "no step for 600 s"), value=None)
    assert fb.state == "failed" and fb.failure_class == "hang"


def test_finish_records_where_a_cluster_trial_ran(storage: Storage) -> None:
    s = make_study(storage)
    t = claim(storage, s.id, 1)
    assert t is not None
    storage.start_trial(t.id, runner="ctl", host="login-1", log_path=None, metrics_path=None)
    where = "node-3:gpu0,1,2,3,node-4:gpu0,1,2,3"
    f = storage.finish_trial(
        t.id, Outcome.failure("node_fail", "NODE_FAIL"), value=None, host=where
    )
    assert f.host == where and storage.get_trial(t.id).host == where
    assert f.failure_class == "node_fail" and f.state == "failed"


def test_finish_is_idempotent(storage: Storage) -> None:
    s = make_study(storage)
    t = claim(storage, s.id, 1)
    assert t is not None
    first = storage.finish_trial(t.id, ok(100.0, n_steps=3), value=100.0)
    again = storage.finish_trial(t.id, ok(200.0, n_steps=5), value=200.0)
    assert again == first
    failed = storage.finish_trial(t.id, Outcome.failure("error", "late"), value=None)
    assert failed == first
    assert storage.get_trial(t.id) == first
    assert len(storage.get_trial(t.id).steps) == 3
    assert storage.count_trials(s.id)["complete"] == 1


def pruned(value: float) -> Outcome:
    """An ok outcome of a trial that stopped as dominated (dse.stats.measure)."""
    m = {"mode": "adaptive", "warmup_steps": 1, "measured_steps": 4, "stop_reason": "dominated"}
    return Outcome("ok", {"tflops_per_gpu": value, "measurement": m}, steps=steps(5))


def test_a_pruned_trial_keeps_its_figures_and_is_never_best(storage: Storage) -> None:
    s = make_study(storage)
    a, b = claim(storage, s.id, 1), claim(storage, s.id, 2)
    assert a is not None and b is not None
    storage.finish_trial(a.id, ok(100.0), value=100.0)
    # a higher value than the complete trial's: still never the best (it stopped early)
    rec = storage.finish_trial(b.id, pruned(150.0), value=150.0)
    assert rec.state == "pruned" and rec.value == 150.0 and len(rec.steps) == 5
    assert rec.metrics["measurement"]["stop_reason"] == "dominated"
    best = storage.best_trial(s.id, "maximize")
    assert best is not None and best.number == a.number
    assert storage.count_trials(s.id)["pruned"] == 1
    assert [t.number for t in storage.list_trials(s.id, state="pruned")] == [b.number]
    # answered and taken: a duplicate proposal is answered from it, never run again
    found = storage.find_trial(s.id, b.params_key)
    assert found is not None and found.state == "pruned"
    assert claim(storage, s.id, 2) is None
    # finished for good, like a complete trial
    assert storage.finish_trial(b.id, ok(90.0), value=90.0).state == "pruned"
    assert storage.finish_trial(b.id, Outcome.failure("error", "late"), value=None).value == 150


def test_late_result_replaces_failure_and_its_steps(storage: Storage) -> None:
    s = make_study(storage)
    t = claim(storage, s.id, 1)
    assert t is not None
    storage.finish_trial(
        t.id, Outcome.failure("timeout", "ran past 900 s", steps=steps(2)), value=None
    )
    # a second failure does not overwrite the first
    same = storage.finish_trial(t.id, Outcome.failure("error", "other"), value=None)
    assert same.failure_class == "timeout" and len(same.steps) == 2
    done = storage.finish_trial(t.id, ok(300.0, n_steps=4), value=300.0)
    assert done.state == "complete" and done.failure_class is None
    assert storage.get_trial(t.id).steps == steps(4)


def test_nan_loss_round_trips(storage: Storage) -> None:
    s = make_study(storage)
    t = claim(storage, s.id, 1)
    assert t is not None
    bad = (StepMetrics(0, 1.0, 2.0, 3.0, 4.0, math.nan, math.inf),)
    out = Outcome.failure("nan", "loss is NaN", metrics={"loss": math.nan}, steps=bad)
    storage.finish_trial(t.id, out, value=None)
    got = storage.get_trial(t.id)
    assert math.isnan(got.steps[0].loss) and math.isnan(got.metrics["loss"])


def test_requeue_and_acquire(storage: Storage) -> None:
    s = make_study(storage)
    t = claim(storage, s.id, 1, runner="ctl-a")
    assert t is not None
    storage.start_trial(t.id, runner="ctl-a", host="n1", log_path="/l", metrics_path="/m")
    r = storage.requeue_trial(t.id, reason="interrupted: controller died")
    assert r.state == "queued" and r.number == t.number and r.attempts == 1
    assert r.started_at is None and r.heartbeat_at is None and r.runner is None
    assert r.host is None
    (h,) = r.history
    assert h["reason"] == "interrupted: controller died"
    assert (h["state"], h["runner"], h["host"], h["log_path"]) == ("running", "ctl-a", "n1", "/l")
    # an ownerless queued trial is acquired once
    got = storage.acquire_queued_trial(s.id, runner="ctl-b")
    assert got is not None and got.id == t.id and got.runner == "ctl-b"
    assert storage.acquire_queued_trial(s.id, runner="ctl-c") is None
    # ... unless its owner's heartbeat is stale
    time.sleep(0.05)
    stolen = storage.acquire_queued_trial(s.id, runner="ctl-c", older_than_s=0.01)
    assert stolen is not None and stolen.runner == "ctl-c"
    storage.start_trial(t.id, runner="ctl-c", host="n2", log_path=None, metrics_path=None)
    storage.requeue_trial(t.id, reason="stopped by the user")
    storage.start_trial(t.id, runner="ctl-c", host="n2", log_path=None, metrics_path=None)
    done = storage.finish_trial(t.id, ok(1.0), value=1.0)
    assert done.attempts == 2 and len(done.history) == 2
    # requeueing (or starting) a finished trial changes nothing: the result is kept
    assert storage.requeue_trial(t.id, reason="racing reconciler") == done
    assert (
        storage.start_trial(t.id, runner="x", host="y", log_path=None, metrics_path=None) == done
    )
    with pytest.raises(TrialNotFoundError):
        storage.requeue_trial(999_999, reason="x")


def test_heartbeat_and_stale_trials(storage: Storage) -> None:
    s = make_study(storage)
    a, b, c = (claim(storage, s.id, tp) for tp in (1, 2, 3))
    assert a is not None and b is not None and c is not None
    for t in (a, b):
        storage.start_trial(t.id, runner="ctl", host="h", log_path=None, metrics_path=None)
    time.sleep(0.2)
    assert [t.id for t in storage.stale_trials(s.id, older_than_s=0.1)] == [a.id, b.id]
    assert storage.stale_trials(s.id, older_than_s=60) == []
    stale_queued = storage.stale_trials(s.id, older_than_s=0.1, states=["queued"])
    assert [t.id for t in stale_queued] == [c.id]
    before = storage.get_trial(a.id).heartbeat_at
    time.sleep(0.8)  # b's heartbeat is now at least 1 s older than a's next one
    beat = time.monotonic()
    storage.heartbeat([a.id])
    storage.heartbeat([])
    after = storage.get_trial(a.id).heartbeat_at
    assert before is not None and after is not None and after > before
    # a threshold half a second above a's age: a is fresh, b (1 s older) stale, however long
    # a loaded machine took to get here
    between = time.monotonic() - beat + 0.5
    assert [t.id for t in storage.stale_trials(s.id, older_than_s=between)] == [b.id]
    with pytest.raises(ValueError, match="trial states"):
        storage.stale_trials(s.id, older_than_s=1, states=["zombie"])


# --- reads -------------------------------------------------------------------------------


def _populated(storage: Storage) -> StudyRecord:
    s = make_study(storage)
    values = {0: 10.0, 1: 30.0, 2: None, 3: 20.0, 4: None}
    for tp, v in values.items():
        t = claim(storage, s.id, tp)
        assert t is not None
        if tp == 2:
            storage.finish_trial(t.id, Outcome.failure("oom", "OOM"), value=None)
        elif v is not None:
            storage.finish_trial(t.id, ok(v), value=v)
    return s


def test_list_count_find_best(storage: Storage) -> None:
    s = _populated(storage)
    assert [t.number for t in storage.list_trials(s.id)] == [0, 1, 2, 3, 4]
    assert [t.number for t in storage.list_trials(s.id, order="-number")] == [4, 3, 2, 1, 0]
    assert [t.number for t in storage.list_trials(s.id, order="value")] == [0, 3, 1, 2, 4]
    assert [t.number for t in storage.list_trials(s.id, order="-value")] == [1, 3, 0, 2, 4]
    assert [t.number for t in storage.list_trials(s.id, limit=2, offset=1)] == [1, 2]
    assert [t.number for t in storage.list_trials(s.id, state="queued")] == [4]
    assert all(t.steps == () for t in storage.list_trials(s.id))
    with_steps = storage.list_trials(s.id, state="complete", with_steps=True)
    assert [len(t.steps) for t in with_steps] == [3, 3, 3]
    with pytest.raises(ValueError, match="order"):
        storage.list_trials(s.id, order="random")
    with pytest.raises(ValueError, match="state"):
        storage.list_trials(s.id, state="zombie")
    counts = storage.count_trials(s.id)
    assert counts == {
        "queued": 1,
        "running": 0,
        "complete": 3,
        "failed": 0,
        "infeasible": 1,
        "pruned": 0,
        "total": 5,
    }
    best_max = storage.best_trial(s.id, "maximize")
    best_min = storage.best_trial(s.id, "minimize")
    assert best_max is not None and best_max.number == 1
    assert best_min is not None and best_min.number == 0
    assert storage.best_trial(make_study(storage, "empty").id, "maximize") is None
    found = storage.find_trial(s.id, key({"tp": 2, "mbs": 1}))
    assert found is not None and found.state == "infeasible"
    assert storage.find_trial(s.id, key({"tp": 4, "mbs": 1})) is None  # queued, not finished
    assert storage.find_trial(s.id, "nope") is None


def test_rejections(storage: Storage) -> None:
    s = make_study(storage)
    r = storage.add_rejection(
        study_id=s.id,
        params={"tp": 3},
        params_key=key({"tp": 3}),
        kind="invalid",
        rule="tp_divides_heads",
        reason="32 heads % tp=3 != 0",
        values={"heads": 32, "tp": 3},
    )
    assert r.kind == "invalid" and r.values == {"heads": 32, "tp": 3} and r.created_at
    for _ in range(2):
        storage.add_rejection(
            study_id=s.id,
            params={"tp": 1},
            params_key=key({"tp": 1}),
            kind="predicted_oom",
            rule="costmodel",
            reason="predicted 150 GiB > 141 GiB",
            values={"predicted_peak_mem_gib": 150.0},
        )
    assert [x.kind for x in storage.list_rejections(s.id)] == ["invalid"] + ["predicted_oom"] * 2
    assert len(storage.list_rejections(s.id, limit=1)) == 1
    assert storage.count_rejections(s.id) == {"invalid": 1, "predicted_oom": 2}
    assert storage.count_rejections(s.id, by="rule") == {"costmodel": 2, "tp_divides_heads": 1}
    with pytest.raises(StudyNotFoundError):
        storage.add_rejection(
            study_id=999_999,
            params={},
            params_key="",
            kind="invalid",
            rule="",
            reason="",
            values={},
        )


def test_records_are_frozen_snapshots(storage: Storage) -> None:
    s = make_study(storage)
    t = claim(storage, s.id, 1)
    assert t is not None
    f = storage.finish_trial(t.id, ok(1.0), value=1.0)
    r = storage.add_rejection(
        study_id=s.id, params={}, params_key="{}", kind="invalid", rule="r", reason="x", values={}
    )
    for rec, attr in ((s, "name"), (f, "state"), (f.steps[0], "loss"), (r, "reason")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(rec, attr, "changed")
    # a record read earlier never changes, and mutating its dicts does not reach storage
    f.params["tp"] = 99
    assert storage.get_trial(t.id).params == {"tp": 1, "mbs": 1}
    storage.requeue_trial(t.id, reason="no-op on a finished trial")
    assert t.state == "queued"


def test_trial_not_found(storage: Storage) -> None:
    with pytest.raises(TrialNotFoundError):
        storage.get_trial(999_999)
    with pytest.raises(TrialNotFoundError):
        storage.get_trial_by_number(1, 0)
    with pytest.raises(TrialNotFoundError):
        storage.finish_trial(999_999, ok(1.0), value=1.0)
    with pytest.raises(TrialNotFoundError):
        storage.start_trial(999_999, runner="r", host="h", log_path=None, metrics_path=None)


def test_params_are_queryable_per_knob(storage: Storage) -> None:
    s = make_study(storage)
    for tp in (1, 2, 4):
        claim(storage, s.id, tp)
    with storage._engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT t.number, p.value_json FROM trial_params p JOIN trials t "
                "ON t.id = p.trial_id WHERE t.study_id = :s AND p.name = 'tp' ORDER BY t.number"
            ),
            {"s": s.id},
        ).all()
    assert [(n, json.loads(v)) for n, v in rows] == [(0, 1), (1, 2), (2, 4)]


# --- export / import ---------------------------------------------------------------------


def _rich_study(storage: Storage) -> StudyRecord:
    s = _populated(storage)
    storage.set_study_state("s", "stopped")
    storage.set_study_attr(s.id, "costmodel", {"scale": 1.07})
    t = claim(storage, s.id, 7)
    assert t is not None
    storage.start_trial(t.id, runner="ctl", host="n3", log_path="/l7", metrics_path="/m7")
    storage.requeue_trial(t.id, reason="interrupted: controller died")
    u = claim(storage, s.id, 8)
    assert u is not None
    storage.start_trial(u.id, runner="ctl", host="n3", log_path="/l8", metrics_path="/m8")
    storage.add_rejection(
        study_id=s.id,
        params={"tp": 3},
        params_key=key({"tp": 3}),
        kind="invalid",
        rule="tp_divides_heads",
        reason="32 % 3 != 0",
        values={"heads": 32},
    )
    return storage.get_study("s")


def _strip_ids(t: TrialRecord) -> TrialRecord:
    return dataclasses.replace(t, id=0, study_id=0)


def test_export_import_round_trip(storage: Storage) -> None:
    s = _rich_study(storage)
    exported = storage.export_study("s")
    assert exported["format"] == "dse-study" and exported["format_version"] == 1
    assert exported["schema_revision"] == head_revision()
    data = json.loads(json.dumps(exported))  # the file format is JSON
    copy = storage.import_study(data, name="s-copy", trials_of_space=False)
    assert dataclasses.replace(copy, id=s.id, name="s") == s
    again = storage.export_study("s-copy")
    # an import is marked: its run settings came from elsewhere (dse.results.run_settings)
    assert again["attrs"].pop("imported") is True
    for doc in (exported, again):
        doc.pop("exported_at")
        doc["study"].pop("name")
    assert again == exported
    original = [_strip_ids(t) for t in storage.list_trials(s.id, with_steps=True)]
    imported = [_strip_ids(t) for t in storage.list_trials(copy.id, with_steps=True)]
    assert imported == original
    assert storage.get_study_attrs(copy.id) == {
        **storage.get_study_attrs(s.id),
        "imported": True,
    }
    assert storage.count_rejections(copy.id) == storage.count_rejections(s.id)
    # the imported study keeps working: numbering continues, duplicates are still refused
    nxt = claim(storage, copy.id, 99)
    assert nxt is not None and nxt.number == len(original)
    assert claim(storage, copy.id, 0) is None


def test_database_passwords_in_a_space_file_are_not_kept(storage: Storage) -> None:
    """A space file's ``storage:`` URL may name the database password; the study keeps the
    text with it masked (every API reader sees the text and every export carries it), on
    create, on import of an export that has one, and when read or exported (rows stored
    before)."""
    secret = "hunter2-db"
    doc = SPACE.replace(
        "storage: sqlite:///dse.db", f"storage: postgresql+psycopg://dse:{secret}@db:5432/dse"
    )
    assert secret in doc
    s = storage.create_study(name="s", space_yaml=doc, **FIELDS)
    masked = "storage: postgresql+psycopg://dse:***@db:5432/dse\n"
    assert s.space_yaml.endswith(masked) and storage.get_study("s").space_yaml.endswith(masked)
    with storage._engine.begin() as conn:
        raw = conn.execute(text("SELECT space_yaml FROM studies")).scalars().all()
    assert raw and not any(secret in r for r in raw)
    exported = storage.export_study("s")
    assert secret not in json.dumps(exported)
    exported["study"]["space_yaml"] = doc  # an export made elsewhere, with the password
    storage.import_study(exported, name="s2", trials_of_space=False)
    assert secret not in json.dumps(storage.export_study("s2"))
    with storage._engine.begin() as conn:
        conn.execute(text("UPDATE studies SET space_yaml = :t"), {"t": doc})  # stored before
    assert secret not in storage.get_study("s").space_yaml
    assert secret not in json.dumps(storage.export_study("s"))
    assert storage.get_study("s").space_hash == FIELDS["space_hash"]


def test_failure_reasons_take_any_text(storage: Storage) -> None:
    """A failure reason quotes a trial's last log line, which may hold a NUL (PostgreSQL
    refused it: the controller died with a storage error) or a lone surrogate: stored escaped,
    on every backend, and exported and imported again."""
    s = make_study(storage)
    t = claim(storage, s.id, 1)
    assert t is not None
    storage.start_trial(t.id, runner="ctl", host="n1", log_path="/l", metrics_path="/m")
    storage.finish_trial(
        t.id, Outcome.failure("error", "exited: bad\x00bytes \ud800 end"), value=None
    )
    assert [x.reason for x in storage.list_trials(s.id)] == ["exited: bad\\x00bytes \\ud800 end"]
    storage.add_rejection(
        study_id=s.id, params={"tp": 3}, params_key=key({"tp": 3}), kind="invalid",
        rule="r", reason="value \x00", values={},
    )  # fmt: skip
    exported = storage.export_study("s")
    assert exported["rejections"][0]["reason"] == "value \\x00"
    storage.import_study(json.loads(json.dumps(exported)), name="s2", trials_of_space=False)
    assert storage.export_study("s2")["trials"] == exported["trials"]


def test_import_refuses_duplicates_and_bad_files(storage: Storage) -> None:
    _rich_study(storage)
    data = storage.export_study("s")
    with pytest.raises(DuplicatedStudyError):
        storage.import_study(data, trials_of_space=False)
    bad_docs: list[Any] = [
        [],
        {**data, "format": "optuna"},
        {**data, "format_version": 99},
        {**data, "surprise": 1},
        {**data, "trials": data["trials"] + data["trials"][:1]},
        {**data, "trials": [{**data["trials"][0], "state": "zombie"}]},
    ]
    for bad in bad_docs:
        with pytest.raises(StudyFormatError):
            storage.import_study(bad, name="other", trials_of_space=False)
    with pytest.raises(StudyNotFoundError):
        storage.get_study("other")
    with pytest.raises(StudyNotFoundError):
        storage.export_study("nope")


# --- errors ------------------------------------------------------------------------------


def test_database_errors_are_translated(storage: Storage) -> None:
    s = make_study(storage)
    with storage._engine.begin() as conn:
        conn.execute(text("ALTER TABLE rejections RENAME TO rejections_away"))
    try:
        with pytest.raises(StorageError) as info:
            storage.list_rejections(s.id)
        assert isinstance(info.value.__cause__, SQLAlchemyError)
        assert "list rejections" in str(info.value)
    finally:
        with storage._engine.begin() as conn:
            conn.execute(text("ALTER TABLE rejections_away RENAME TO rejections"))
    assert storage.list_rejections(s.id) == []
