"""Trials: their part of the study's GPU time as columns, back-filled from their metrics.

A study's GPU-time figures (GPU-hours and their start-up / measure
split,
held time, busy fraction, measured and all-kernel shares, first steps) were a fold over every
trial's metrics in Python: the API's study list read and parsed each study's every trial
after each write (8.2 s at 100,000 trials). Each trial now keeps its part as numbers
(``trial_gpu_figures`` of its metrics, written with them by the storage):
``gpu_seconds_startup``, ``gpu_seconds_measure``, ``device_seconds``,
``device_seconds_measure``, ``device_seconds_measured``, ``device_seconds_kernel``,
``device_seconds_first_step`` and ``first_step_s`` (NULL: the trial has no such figure), and a
study's totals are one aggregate query (``Storage.gpu_totals``) over the covering index
``(study_id, first_step_s, source, gpu_seconds, ...)``, whose order also gives the median
first step.

Existing trials are back-filled here from their metrics (those whose metrics text names a
``timing`` record or a ``gpu_seconds_`` figure; the others have none), in batches by id. The
figures are computed by this revision's own copy of the rule (as dse had it when the columns
were added), so the migration does the same whatever the live code becomes.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 04:00:00
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    "gpu_seconds_startup",
    "gpu_seconds_measure",
    "device_seconds",
    "device_seconds_measure",
    "device_seconds_measured",
    "device_seconds_kernel",
    "device_seconds_first_step",
    "first_step_s",
)
_INDEX = "ix_trials_study_id_first_step_s_gpu"
_BATCH = 2000


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        for c in _COLUMNS:
            batch.add_column(sa.Column(c, sa.Float(), nullable=True))
    if not op.get_context().as_sql:  # no data to read when emitting SQL (alembic --sql)
        _backfill(op.get_bind())
    op.create_index(
        _INDEX, "trials", ["study_id", "first_step_s", "source", "gpu_seconds", *_COLUMNS[:-1]]
    )


def _finite(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def _num(x: Any) -> float:
    f = _finite(x)
    return 0.0 if f is None else f


def trial_gpu_figures(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """A trial's GPU-time figures (:data:`_COLUMNS`) from its metrics, as of this revision."""
    out: dict[str, float | None] = dict.fromkeys(_COLUMNS)
    out["gpu_seconds_startup"] = _finite(metrics.get("gpu_seconds_startup"))
    out["gpu_seconds_measure"] = _finite(metrics.get("gpu_seconds_measure"))
    timing = metrics.get("timing")
    if not isinstance(timing, Mapping):
        return out
    dev = _num(timing.get("devices"))
    steps = _num(timing.get("measure_s"))
    out["device_seconds"] = _num(_num(timing.get("wall_s")) * dev)
    out["device_seconds_measure"] = _num(steps * dev)
    ms = _finite(metrics.get("measured_steps_s"))
    if ms is None:  # no split: every step measured, no build
        out["device_seconds_measured"] = out["device_seconds_kernel"] = _num(steps * dev)
        return out
    f = _num(metrics.get("first_step_s")) + 0.0
    out["device_seconds_measured"] = _num(min(ms, steps or ms) * dev)
    out["device_seconds_kernel"] = _num((_num(metrics.get("build_s")) + steps) * dev)
    out["device_seconds_first_step"] = _num(f * dev)
    out["first_step_s"] = f
    return out


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _backfill(conn: sa.Connection) -> None:
    trials = sa.table("trials", sa.column("id"), sa.column("metrics"),
                      *(sa.column(c) for c in _COLUMNS))  # fmt: skip
    metrics = trials.c.metrics
    pick = (
        sa.select(trials.c.id, metrics)
        .where(
            trials.c.id > sa.bindparam("after"),
            sa.or_(metrics.like('%"timing"%'), metrics.like('%"gpu\\_seconds\\_%', escape="\\")),
        )
        .order_by(trials.c.id)
        .limit(_BATCH)
    )
    put = (
        sa.update(trials)
        .where(trials.c.id == sa.bindparam("row_id"))
        .values({c: sa.bindparam(f"v_{c}") for c in _COLUMNS})
    )
    after = -1
    while True:
        rows = conn.execute(pick, {"after": after}).all()
        if not rows:
            return
        updates = []
        for row_id, text in rows:
            m = _json(text)
            figs = trial_gpu_figures(m if isinstance(m, dict) else {})
            if any(v is not None for v in figs.values()):
                updates.append({"row_id": row_id, **{f"v_{c}": figs[c] for c in _COLUMNS}})
        if updates:
            conn.execute(put, updates)
        after = rows[-1][0]


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="trials")
    with op.batch_alter_table("trials") as batch:
        for c in reversed(_COLUMNS):
            batch.drop_column(c)
