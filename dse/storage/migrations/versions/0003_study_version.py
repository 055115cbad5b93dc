"""A change counter per study, and an index for trial pages ordered by value, best first.

``studies.version`` is bumped in the same transaction as every write of the study's
trials, rejections, state or attributes (not by heartbeats): a reader that sees the same
version sees the same trials, so answers built from them can be reused until it moves
(``dse.api.readcache``), across processes and backends.

``ix_trials_study_id_value_desc_number`` is ``(study_id, value DESC, number)`` with trials
without a value last: pages ordered by ``-value`` (ties by number) walk it instead of
sorting every trial of the study. SQLite puts NULLs last in a descending index and refuses
an explicit ``NULLS LAST`` there; PostgreSQL needs it (its descending default is NULLS
FIRST).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 19:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_trials_study_id_value_desc_number"


def upgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.add_column(
            sa.Column("version", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
    desc = "value DESC" if op.get_bind().dialect.name == "sqlite" else "value DESC NULLS LAST"
    op.create_index(_INDEX, "trials", ["study_id", sa.text(desc), "number"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="trials")
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("version")
