"""Indexes for reading large studies (the REST API and dashboard).

``ix_trials_study_id_state`` becomes ``(study_id, state, gpu_seconds)``: counting trials per
state and summing GPU-seconds read only the index. ``ix_trials_study_id_value`` becomes
``(study_id, value, number)``: pages ordered by value (ties by number, no value last) and the
best trial are read in index order instead of sorting every trial row of the study.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 20:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_trials_study_id_state_gpu_seconds", "trials", ["study_id", "state", "gpu_seconds"]
    )
    op.create_index("ix_trials_study_id_value_number", "trials", ["study_id", "value", "number"])
    op.drop_index("ix_trials_study_id_state", table_name="trials")
    op.drop_index("ix_trials_study_id_value", table_name="trials")


def downgrade() -> None:
    op.create_index("ix_trials_study_id_state", "trials", ["study_id", "state"])
    op.create_index("ix_trials_study_id_value", "trials", ["study_id", "value"])
    op.drop_index("ix_trials_study_id_value_number", table_name="trials")
    op.drop_index("ix_trials_study_id_state_gpu_seconds", table_name="trials")
