"""Which releases' code runs on the schema: rolling upgrades and rollbacks without an outage.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25

schema_compatibility holds one row, oldest_compatible_code: the oldest release head whose code runs on the schema
as migrated (coordinator_service.log.schema.oldest_compatible_code, from what each migration declares). A release whose
head is older than the database's revision stays ready as long as its head is at or above that value, so the pods
of the release being replaced stay in service while the new release's expanding migrations run.

Migrations 0007 to 0011 only add (columns, nullable or with defaults; a table; a looser constraint): code at 0006
runs on them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"


def upgrade() -> None:
    op.create_table("schema_compatibility", sa.Column("oldest_compatible_code", sa.Text(), nullable=False))


def downgrade() -> None:
    op.drop_table("schema_compatibility")
