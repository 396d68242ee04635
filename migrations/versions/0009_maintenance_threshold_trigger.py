"""Maintenance runs triggered by a threshold: a commit took a table past its snapshot bound.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25

maintenance_runs.trigger may also be 'threshold'. A looser constraint only: a release before this one keeps
working beside it.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only adds: code at 0006 runs on it


def upgrade() -> None:
    op.drop_constraint("maintenance_trigger_known", "maintenance_runs", type_="check")
    op.create_check_constraint(
        "maintenance_trigger_known", "maintenance_runs", "trigger IN ('schedule', 'threshold', 'operator')"
    )


def downgrade() -> None:
    op.execute("UPDATE maintenance_runs SET trigger = 'schedule' WHERE trigger = 'threshold'")
    op.drop_constraint("maintenance_trigger_known", "maintenance_runs", type_="check")
    op.create_check_constraint("maintenance_trigger_known", "maintenance_runs", "trigger IN ('schedule', 'operator')")
