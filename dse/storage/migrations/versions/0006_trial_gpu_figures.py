"""Trials: their part of the study's GPU time as columns, back-filled from their metrics.

A study's GPU-time figures (``dse.results.gpu_usage``: GPU-hours and their start-up / measure
split,
held time, busy fraction, measured and all-kernel shares, first steps) were a fold over every
trial's metrics in Python: the API's study list read and parsed each study's every trial
after each write (8.2 s at 100,000 trials). Each trial now keeps its part as numbers
(``dse.results.gpu_usage.trial_gpu_figures`` of its metrics, written with them by the storage):
``gpu_seconds_startup``, ``gpu_seconds_measure``, ``device_seconds``,
``device_seconds_measure``, ``device_seconds_measured``, ``device_seconds_kernel``,
``device_seconds_first_step`` and ``first_step_s`` (NULL: the trial has no such figure), and a
study's totals are one aggregate query (``Storage.gpu_totals``) over the covering index
``(study_id, first_step_s, source, gpu_seconds, ...)``, whose order also gives the median
first step.

Existing trials are back-filled here from their metrics (those whose metrics text names a
``timing`` record or a ``gpu_seconds_`` figure; the others have none), in batches by id.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

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


def _backfill(conn: sa.Connection) -> None:
    from dse.results.gpu_usage import trial_gpu_figures
    from dse.storage._models import json_value

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
            m = json_value(text)
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
