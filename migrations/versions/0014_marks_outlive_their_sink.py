"""A deletion's mark outlives the sink that made it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28

Every deletion keeps its mark on a path ORPHAN_GRACE_SECONDS after it deleted the file, so that a pre-commit that
read the file before cannot claim it afterwards (docs/architecture.md, "Deletion is proven, never assumed"). An
operator's deletion of a sink deletes files (those its epochs gave up, those of the tables it drops) and then the
sink's rows, whose cascade took those marks with them at once. epoch_files.sink_id is now set to NULL when its sink
is deleted (it was deleted with it): the sink's deletion deletes its other rows itself (sink_rows.delete_sink), and
the cleaner forgets the marks left without a sink once their grace is over, and any other row left without one
(path_claims.expire_marks).

Only a looser constraint: a release before this one keeps working beside it (the rows its deletion of a sink leaves
without a sink are forgotten by this release's cleaner).
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only loosens: code at 0006 runs on it


def upgrade() -> None:
    op.alter_column("epoch_files", "sink_id", nullable=True)
    op.drop_constraint("epoch_files_sink_id_fkey", "epoch_files", type_="foreignkey")
    op.create_foreign_key("epoch_files_sink_id_fkey", "epoch_files", "sinks", ["sink_id"], ["id"], ondelete="SET NULL")


def downgrade() -> None:
    op.execute("DELETE FROM epoch_files WHERE sink_id IS NULL")
    op.drop_constraint("epoch_files_sink_id_fkey", "epoch_files", type_="foreignkey")
    op.create_foreign_key("epoch_files_sink_id_fkey", "epoch_files", "sinks", ["sink_id"], ["id"], ondelete="CASCADE")
    op.alter_column("epoch_files", "sink_id", nullable=False)
