"""A study's GPU-time totals from the trials' columns (``Storage.gpu_totals``, schema 0006)
are the fold over its trial records (``dse.results.gpu_usage``), on every backend: for trials
finished through the storage API, imported, and back-filled by the migration; and the
figures built from them are those of the fold used before (``tests/gpu_reference.py``).
Sums may differ in the last bits (the database adds in its own order); counts, the median
and the maximum first step are the same values."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from alembic import command
from sqlalchemy import event, text

from dse.core.records import Outcome
from dse.results.gpu_usage import gpu_totals, usage_of_totals
from dse.stats.gpu_figures import TRIAL_GPU_FIGURES, trial_gpu_figures
from dse.storage import Storage, open_storage
from dse.storage._engine import alembic_config
from tests.gpu_reference import (
    GRID,
    random_attrs,
    random_gpu_seconds,
    random_metrics,
    random_source,
    reference_usage,
)
from tests.storage.test_storage_contract import key, make_study

#: Figures that are chosen, not added up: equal to the last bit.
EXACT = {"first_step_s_median", "first_step_s_max"}


def same(got: Any, want: Any) -> None:
    """Equal figures: counts, texts, None and chosen values exactly, sums to 1e-12."""
    if isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            if k in EXACT:
                assert got[k] == want[k], k
            else:
                same(got[k], want[k])
    elif isinstance(want, float) and not isinstance(got, bool):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-9)
    else:
        assert got == want and type(got) is type(want)


def totals_dict(t: Any) -> dict[str, Any]:
    return {k: getattr(t, k) for k in t.__dataclass_fields__}


def check_study(storage: Storage, study_id: int, rng: random.Random) -> None:
    """The storage's totals and figures of a study against the folds over its records."""
    records = storage.list_trials(study_id)
    same(totals_dict(storage.gpu_totals(study_id)), totals_dict(gpu_totals(records)))
    for device in ("cuda", "cpu"):
        attrs = random_attrs(rng)
        grid = rng.choice([GRID, None])
        got = usage_of_totals(storage.gpu_totals(study_id), attrs, device=device, grid=grid)
        same(got, reference_usage(records, attrs, device=device, grid=grid))


def finish_random(storage: Storage, study_id: int, rng: random.Random, n: int) -> None:
    """``n`` trials through claim, start and finish, as a controller writes them: some left
    queued or running, failures replaced by a later result, loss-parity verdicts set."""
    for i in range(n):
        params = {"tp": i, "mbs": 1}
        t = storage.claim_trial(study_id=study_id, params=params, params_key=key(params),
                                budget=10**6, allow_repeat=True)  # fmt: skip
        assert t is not None
        r = rng.random()
        if r < 0.05:
            continue  # queued
        storage.start_trial(t.id, runner="r", host="h", log_path=None, metrics_path=None)
        if r < 0.1:
            continue  # running
        source = rng.choice(["measured"] * 6 + ["estimate", "replay"])
        if r < 0.25:  # failed first, a result found later replaces it
            failed = Outcome("failed", random_metrics(rng), failure_class="error", reason="x",
                             source=source)  # fmt: skip
            storage.finish_trial(t.id, failed, value=None, gpu_seconds=random_gpu_seconds(rng))
        status = rng.choice(["ok", "ok", "ok", "failed", "infeasible"])
        out = Outcome(status, random_metrics(rng), source=source,
                      failure_class=None if status == "ok" else "oom", reason=None)  # fmt: skip
        storage.finish_trial(
            t.id, out, value=rng.uniform(1, 9), gpu_seconds=random_gpu_seconds(rng)
        )
        if rng.random() < 0.1:
            storage.set_trial_numerics(t.id, {"status": "ok"})


@pytest.mark.parametrize("seed", range(3))
def test_totals_of_finished_trials_are_the_fold(storage: Storage, seed: int) -> None:
    rng = random.Random(seed)
    a = make_study(storage, "a")
    b = make_study(storage, "b")
    empty = make_study(storage, "empty")
    finish_random(storage, a.id, rng, 150)
    finish_random(storage, b.id, rng, 20)  # another study's trials are not counted
    for sid in (a.id, b.id, empty.id):
        check_study(storage, sid, rng)
    assert storage.gpu_totals(empty.id) == gpu_totals([])


def test_totals_of_imported_trials_are_the_fold(storage: Storage) -> None:
    """An import (bulk insert) writes the columns from the metrics too; the export does not
    carry them (they are derived)."""
    rng = random.Random(7)
    a = make_study(storage, "a")
    finish_random(storage, a.id, rng, 40)
    data = storage.export_study("a")
    assert not set(TRIAL_GPU_FIGURES) & set(data["trials"][0])
    for t in data["trials"]:
        t["metrics"] = random_metrics(rng, finite_only=True)
        t["source"] = random_source(rng)
        t["gpu_seconds"] = random_gpu_seconds(rng)
    b = storage.import_study(data, name="b", trials_of_space=False)  # synthetic params
    check_study(storage, b.id, rng)
    # a study of estimates only (the sim workload): no GPU time
    for t in data["trials"]:
        t["source"] = "estimate"
    c = storage.import_study(data, name="c", trials_of_space=False)
    got = storage.gpu_totals(c.id)
    assert (got.estimates, got.trials) == (len(data["trials"]), 0)
    check_study(storage, c.id, rng)


def test_non_finite_gpu_seconds_count_as_zero(storage: Storage) -> None:
    """A trial's GPU-seconds that are not a finite number are left out of the spent total,
    as the fold leaves them out (SQLite stores a NaN as NULL; PostgreSQL keeps it)."""
    rng = random.Random(3)
    a = make_study(storage, "a")
    for i, g in enumerate([10.0, math.inf, math.nan, 5.0, 0.0, None]):
        params = {"tp": i, "mbs": 1}
        t = storage.claim_trial(study_id=a.id, params=params, params_key=key(params),
                                budget=100, allow_repeat=True)  # fmt: skip
        assert t is not None
        storage.finish_trial(t.id, Outcome("ok", random_metrics(rng)), value=1.0, gpu_seconds=g)
    got = storage.gpu_totals(a.id)
    assert got.gpu_seconds == 15.0
    assert got.gpu_seconds == gpu_totals(storage.list_trials(a.id)).gpu_seconds


def test_migration_back_fills_the_columns(fresh_url: str) -> None:
    """A database of schema 0005 (trials without the columns) upgraded to 0006: every
    trial's columns are its metrics' figures, and the totals the fold's."""
    rng = random.Random(11)
    with open_storage(fresh_url) as st:
        a = make_study(st, "a")
        finish_random(st, a.id, rng, 120)
        want = gpu_totals(st.list_trials(a.id))
        with st._engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0005")
    with open_storage(fresh_url) as st:  # upgraded on open
        records = {t.id: t for t in st.list_trials(a.id)}
        with st._engine.connect() as conn:
            rows = conn.execute(
                text(f"SELECT id, {', '.join(TRIAL_GPU_FIGURES)} FROM trials")
            ).all()
        assert len(rows) == len(records) == 120
        for row_id, *figs in rows:
            assert dict(zip(TRIAL_GPU_FIGURES, figs, strict=True)) == trial_gpu_figures(
                records[row_id].metrics
            )
        same(totals_dict(st.gpu_totals(a.id)), totals_dict(want))
        check_study(st, a.id, rng)


def test_sqlite_totals_read_the_covering_index(tmp_path: Any) -> None:
    """The totals' query reads the index alone (no trial row, whatever its metrics weigh)."""
    seen: list[tuple[str, Any]] = []
    with open_storage(f"sqlite:///{tmp_path / 'plan.db'}") as st:
        a = make_study(st, "a")
        finish_random(st, a.id, random.Random(1), 30)

        @event.listens_for(st._engine, "before_cursor_execute")
        def _seen(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
            seen.append((statement, params))

        st.gpu_totals(a.id)
        event.remove(st._engine, "before_cursor_execute", _seen)
        (statement, params), *_ = [s for s in seen if "FILTER" in s[0]]
        with st._engine.connect() as conn:
            plan = "\n".join(
                str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)
            )
    assert "USING COVERING INDEX ix_trials_study_id_first_step_s_gpu" in plan, plan
    assert not any(
        line.strip().startswith("SCAN trials") and "INDEX" not in line
        for line in plan.splitlines()
    ), plan
