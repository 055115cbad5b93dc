"""Initial schema: studies, attributes, trials, their parameters and steps, rejections.

JSON values are stored as TEXT (see ``dse.storage._models.JSONText``); times are float
epoch seconds. This file is frozen: later schema changes go in new revisions.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 19:33:19
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("space_yaml", sa.Text(), nullable=False),
        sa.Column("space_hash", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("direction", sa.String(length=16), nullable=False),
        sa.Column("metric", sa.String(length=128), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("hardware", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_studies")),
        sa.UniqueConstraint("name", name=op.f("uq_studies_name")),
    )
    op.create_table(
        "study_attrs",
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["studies.id"],
            name=op.f("fk_study_attrs_study_id_studies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("study_id", "key", name=op.f("pk_study_attrs")),
    )
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("params_key", sa.Text(), nullable=False),
        sa.Column("metrics", sa.Text(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("failure_class", sa.String(length=32), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=True),
        sa.Column("runner", sa.String(length=255), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("log_path", sa.Text(), nullable=True),
        sa.Column("metrics_path", sa.Text(), nullable=True),
        sa.Column("queued_at", sa.Float(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("heartbeat_at", sa.Float(), nullable=True),
        sa.Column("gpu_seconds", sa.Float(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("history", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["studies.id"],
            name=op.f("fk_trials_study_id_studies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trials")),
        sa.UniqueConstraint("study_id", "number", name=op.f("uq_trials_study_id_number")),
    )
    op.create_index("ix_trials_study_id_state", "trials", ["study_id", "state"])
    op.create_index("ix_trials_study_id_value", "trials", ["study_id", "value"])
    op.create_index("ix_trials_study_id_params_key", "trials", ["study_id", "params_key"])
    op.create_table(
        "trial_params",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("value_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["trials.id"],
            name=op.f("fk_trial_params_trial_id_trials"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("trial_id", "name", name=op.f("pk_trial_params")),
    )
    op.create_table(
        "trial_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=True),
        sa.Column("tflops_per_gpu", sa.Float(), nullable=True),
        sa.Column("peak_mem_gib", sa.Float(), nullable=True),
        sa.Column("peak_reserved_gib", sa.Float(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("grad_norm", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["trials.id"],
            name=op.f("fk_trial_steps_trial_id_trials"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trial_steps")),
    )
    op.create_index("ix_trial_steps_trial_id_step", "trial_steps", ["trial_id", "step"])
    op.create_table(
        "rejections",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("params_key", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("rule", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("values", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["studies.id"],
            name=op.f("fk_rejections_study_id_studies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rejections")),
    )
    op.create_index("ix_rejections_study_id_kind", "rejections", ["study_id", "kind"])


def downgrade() -> None:
    op.drop_index("ix_rejections_study_id_kind", table_name="rejections")
    op.drop_table("rejections")
    op.drop_index("ix_trial_steps_trial_id_step", table_name="trial_steps")
    op.drop_table("trial_steps")
    op.drop_table("trial_params")
    op.drop_index("ix_trials_study_id_params_key", table_name="trials")
    op.drop_index("ix_trials_study_id_value", table_name="trials")
    op.drop_index("ix_trials_study_id_state", table_name="trials")
    op.drop_table("trials")
    op.drop_table("study_attrs")
    op.drop_table("studies")
