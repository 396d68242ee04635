"""Path claims and deletion marks: epoch_files holds every path whose fate the log decides, for deletions too.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25

Claiming a path (a pre-commit, a multi-writer epoch's waiting part) and deleting it (the cleaner, the orphan
sweep, expiration) exclude each other through this table's primary key (docs/architecture.md, "Deletion is
proven, never assumed"):

* A claim no longer needs its epoch's row: the foreign key to pending_sink_state goes (a part waiting in
  epoch_parts claims its paths before the epoch has a row; the files of an epoch pruned, or of an older numbering
  dropped after a reset, wait for the cleaner without it), and one to sinks takes its place. epoch and attempt
  may be NULL: a waiting part's claim has no attempt, a claim whose epoch row is gone has no epoch.
* keep_for_rerun: discarded by a recovery abort, kept RECOVERY_FILES_KEEP_SECONDS unless the new attempt comes.
  The files of ABORTED epochs not cleaned yet are discarded since their abort (the abort now discards them).
* deleting_at, deleted_at: a deletion marked the path before it deleted it, and when it was done; the mark stays
  ORPHAN_GRACE_SECONDS after the deletion, and no claim takes a marked path.
* The paths of parts stored now are claimed.

Only additions and a looser constraint: a release before this one keeps working beside it (its prunes no longer
cascade to epoch_files; the rows it leaves behind are what the cleaner's claims are, and hold their paths).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only adds: code at 0006 runs on it


def upgrade() -> None:
    op.drop_constraint("epoch_files_sink_id_epoch_fkey", "epoch_files", type_="foreignkey")
    op.create_foreign_key("epoch_files_sink_id_fkey", "epoch_files", "sinks", ["sink_id"], ["id"], ondelete="CASCADE")
    op.alter_column("epoch_files", "epoch", nullable=True)
    op.alter_column("epoch_files", "attempt", nullable=True)
    op.add_column("epoch_files", sa.Column("keep_for_rerun", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("epoch_files", sa.Column("deleting_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("epoch_files", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint("deleted_after_marked", "epoch_files", "deleted_at IS NULL OR deleting_at IS NOT NULL")
    op.create_index(
        "ix_epoch_files_deleting", "epoch_files", ["deleting_at"], postgresql_where=sa.text("deleting_at IS NOT NULL")
    )
    op.execute(
        """
        UPDATE epoch_files f SET discarded_at = p.aborted_at, keep_for_rerun = (p.abort_cause = 'RECOVERY')
        FROM pending_sink_state p
        WHERE p.sink_id = f.sink_id AND p.epoch = f.epoch AND p.status = 'ABORTED' AND f.discarded_at IS NULL
        """
    )
    op.execute(
        """
        INSERT INTO epoch_files (path, sink_id, epoch)
        SELECT file ->> 'path', p.sink_id, p.epoch
        FROM epoch_parts p,
             jsonb_array_elements(convert_from(p.metadata, 'UTF8')::jsonb -> 'tables') AS t(document),
             jsonb_array_elements(t.document -> 'data_files') AS f(file)
        ON CONFLICT (path) DO NOTHING
        """
    )


def downgrade() -> None:
    op.execute("DELETE FROM epoch_files WHERE epoch IS NULL OR attempt IS NULL")
    op.drop_index("ix_epoch_files_deleting", table_name="epoch_files")
    op.drop_constraint("deleted_after_marked", "epoch_files", type_="check")
    op.drop_column("epoch_files", "deleted_at")
    op.drop_column("epoch_files", "deleting_at")
    op.drop_column("epoch_files", "keep_for_rerun")
    op.alter_column("epoch_files", "attempt", nullable=False)
    op.alter_column("epoch_files", "epoch", nullable=False)
    op.drop_constraint("epoch_files_sink_id_fkey", "epoch_files", type_="foreignkey")
    op.execute(
        "DELETE FROM epoch_files f WHERE NOT EXISTS (SELECT 1 FROM pending_sink_state p "
        "WHERE p.sink_id = f.sink_id AND p.epoch = f.epoch)"
    )
    op.create_foreign_key(
        "epoch_files_sink_id_epoch_fkey",
        "epoch_files",
        "pending_sink_state",
        ["sink_id", "epoch"],
        ["sink_id", "epoch"],
        ondelete="CASCADE",
    )
