"""Trials: the loss-parity status and re-measurements.

``numerics`` holds the status of the trial's ``metrics["numerics"]`` verdict (``ok``,
``changed``, ``unchecked``, ``baseline``; NULL while unjudged), written together with it by
the storage, so the best trial leaves out ``changed`` ones and a study's summary counts them
from the index ``(study_id, numerics)``. ``remeasure_of`` is the number of the trial whose
configuration a re-measurement runs again (NULL for a trial the agent proposed).

``ix_trials_study_id_params_key`` becomes ``(study_id, params_key, state, numerics, value,
number)``: the noise-aware best aggregates the trials of its candidate configurations (count,
mean value) from the index alone, however many trials a configuration has; the duplicate
lookups keep their prefix.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("numerics", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("remeasure_of", sa.Integer(), nullable=True))
    op.create_index("ix_trials_study_id_numerics", "trials", ["study_id", "numerics"])
    op.create_index(
        "ix_trials_study_id_params_key_state_value",
        "trials",
        ["study_id", "params_key", "state", "numerics", "value", "number"],
    )
    op.drop_index("ix_trials_study_id_params_key", table_name="trials")


def downgrade() -> None:
    op.create_index("ix_trials_study_id_params_key", "trials", ["study_id", "params_key"])
    op.drop_index("ix_trials_study_id_params_key_state_value", table_name="trials")
    op.drop_index("ix_trials_study_id_numerics", table_name="trials")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("remeasure_of")
        batch.drop_column("numerics")
