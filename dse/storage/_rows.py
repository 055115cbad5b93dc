"""Rows to records and back: the one place that maps ORM rows of :mod:`dse.storage._models`
to the frozen records of :mod:`dse.core.records` (used by the repository and the exporter)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from dse.core.records import RejectionRecord, StepMetrics, StudyRecord, TrialRecord
from dse.storage._engine import redact_passwords
from dse.storage._models import (
    JSONText,
    RejectionModel,
    StudyModel,
    TrialModel,
    TrialStepModel,
    json_value,
)

__all__ = [
    "param_rows",
    "step_rows",
    "steps_of",
    "step_record",
    "study_record",
    "trial_record",
    "trial_from_row",
    "trial_from_stored",
    "StoredTrialRow",
    "TRIAL_COLUMNS",
    "steps_of_conn",
    "rejection_record",
]


def param_rows(params: dict[str, Any]) -> list[tuple[str, str]]:
    return [(str(k), json.dumps(v, sort_keys=True)) for k, v in params.items()]


def step_rows(trial_id: int, steps: Iterable[StepMetrics]) -> list[TrialStepModel]:
    return [
        TrialStepModel(
            trial_id=trial_id,
            step=st.step,
            step_time_s=st.step_time_s,
            tflops_per_gpu=st.tflops_per_gpu,
            peak_mem_gib=st.peak_mem_gib,
            peak_reserved_gib=st.peak_reserved_gib,
            loss=st.loss,
            grad_norm=st.grad_norm,
        )
        for st in steps
    ]


def steps_of(s: Session, trial_ids: list[int]) -> dict[int, tuple[StepMetrics, ...]]:
    out: dict[int, list[StepMetrics]] = {}
    for chunk_start in range(0, len(trial_ids), 500):
        chunk = trial_ids[chunk_start : chunk_start + 500]
        # plain rows, not ORM objects (same attribute names): a fraction of the CPU
        rows = s.execute(
            select(*TrialStepModel.__table__.c)
            .where(TrialStepModel.trial_id.in_(chunk))
            .order_by(TrialStepModel.trial_id, TrialStepModel.step, TrialStepModel.id)
        ).all()
        for r in rows:
            out.setdefault(r.trial_id, []).append(step_record(cast(TrialStepModel, r)))
    return {k: tuple(v) for k, v in out.items()}


def steps_of_conn(conn: Connection, trial_ids: list[int]) -> dict[int, tuple[StepMetrics, ...]]:
    """:func:`steps_of` on a plain connection."""
    out: dict[int, list[StepMetrics]] = {}
    t = TrialStepModel
    cols = (t.trial_id, t.step, t.step_time_s, t.tflops_per_gpu, t.peak_mem_gib,
            t.peak_reserved_gib, t.loss, t.grad_norm)  # fmt: skip
    for chunk_start in range(0, len(trial_ids), 500):
        chunk = trial_ids[chunk_start : chunk_start + 500]
        rows = conn.execute(
            select(*cols).where(t.trial_id.in_(chunk)).order_by(t.trial_id, t.step, t.id)
        )
        for tid, step, st, tf, pm, pr, loss, gn in rows:
            out.setdefault(tid, []).append(
                StepMetrics(
                    step=step,
                    step_time_s=_nan_if_none(st),
                    tflops_per_gpu=_nan_if_none(tf),
                    peak_mem_gib=_nan_if_none(pm),
                    peak_reserved_gib=_nan_if_none(pr),
                    loss=_nan_if_none(loss),
                    grad_norm=gn,
                )  # fmt: skip
            )
    return {k: tuple(v) for k, v in out.items()}


def _nan_if_none(x: float | None) -> float:
    # SQLite stores NaN as NULL: a missing required number reads back as NaN.
    return math.nan if x is None else x


def step_record(r: TrialStepModel) -> StepMetrics:
    return StepMetrics(
        step=r.step,
        step_time_s=_nan_if_none(r.step_time_s),
        tflops_per_gpu=_nan_if_none(r.tflops_per_gpu),
        peak_mem_gib=_nan_if_none(r.peak_mem_gib),
        peak_reserved_gib=_nan_if_none(r.peak_reserved_gib),
        loss=_nan_if_none(r.loss),
        grad_norm=r.grad_norm,
    )


def study_record(r: StudyModel) -> StudyRecord:
    return StudyRecord(
        id=r.id,
        name=r.name,
        space_yaml=redact_passwords(r.space_yaml),
        space_hash=r.space_hash,
        state=r.state,
        direction=r.direction,
        metric=r.metric,
        created_at=r.created_at,
        model=dict(r.model or {}),
        hardware=dict(r.hardware or {}),
        version=r.version or 0,
    )


def trial_record(r: TrialModel, steps: tuple[StepMetrics, ...] = ()) -> TrialRecord:
    return trial_from_row([getattr(r, c) for c in TRIAL_COLUMNS], steps)


#: The columns :func:`trial_from_row` reads, in its order (the one list of a trial's fields
#: read from storage: ORM objects and plain rows both go through it).
TRIAL_COLUMNS = (
    "id", "study_id", "number", "state", "params", "params_key", "metrics", "value",
    "failure_class", "reason", "source", "runner", "host", "log_path", "metrics_path",
    "queued_at", "started_at", "finished_at", "heartbeat_at", "gpu_seconds", "attempts",
    "history", "remeasure_of",
)  # fmt: skip


def trial_from_row(row: Sequence[Any], steps: tuple[StepMetrics, ...] = ()) -> TrialRecord:
    """The record of a row of :data:`TRIAL_COLUMNS` (unpacked by position: a page of plain
    rows costs a fraction of ORM objects)."""
    (id_, study_id, number, state, params, params_key, metrics, value, failure_class, reason,
     source, runner, host, log_path, metrics_path, queued_at, started_at, finished_at,
     heartbeat_at, gpu_seconds, attempts, history, remeasure_of) = row  # fmt: skip
    return TrialRecord(
        id=id_, study_id=study_id, number=number, state=state, params=dict(params or {}),
        params_key=params_key, metrics=dict(metrics or {}), value=value,
        failure_class=failure_class, reason=reason, source=source, runner=runner, host=host,
        log_path=log_path, metrics_path=metrics_path, queued_at=queued_at,
        started_at=started_at, finished_at=finished_at, heartbeat_at=heartbeat_at,
        gpu_seconds=gpu_seconds, steps=steps, attempts=attempts or 0,
        history=tuple(dict(h) for h in (history or ())), remeasure_of=remeasure_of,
    )  # fmt: skip


#: A trial row as stored (:data:`TRIAL_COLUMNS`, JSON columns as their text, not decoded):
#: two stored rows are equal exactly when every field of the trial is (see
#: :meth:`dse.storage.Storage.trial_page`).
StoredTrialRow = tuple[Any, ...]

#: Positions of the JSON columns in :data:`TRIAL_COLUMNS`.
_JSON_AT = tuple(
    i for i, c in enumerate(TRIAL_COLUMNS) if isinstance(TrialModel.__table__.c[c].type, JSONText)
)


def trial_from_stored(row: StoredTrialRow) -> TrialRecord:
    """The record of a stored row (its JSON columns decoded as :class:`JSONText` does)."""
    values = list(row)
    for i in _JSON_AT:
        values[i] = json_value(values[i])
    return trial_from_row(values)


def rejection_record(r: RejectionModel) -> RejectionRecord:
    return RejectionRecord(
        id=r.id,
        study_id=r.study_id,
        params=dict(r.params or {}),
        params_key=r.params_key,
        kind=r.kind,
        rule=r.rule,
        reason=r.reason,
        values=dict(r.values or {}),
        created_at=r.created_at,
    )
