"""The key index of keyed tables (issue 29): where each key lives among a table's live rows, so that a commit of row
mutations resolves an epoch's keys in O(epoch), not by scanning the table.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28

One index per table (its UUID: a table replaced under the same name is another table), shared by every sink that
writes it (docs/architecture.md, "The key index"):

* key_index_tables: the snapshot the index reflects (NULL: the table had none), the key's columns and their Iceberg
  types (a type promoted changes the key's bytes: the index is rebuilt), how many rows it holds, when it was last
  built from the table's live rows (NULL: never, or taken as wrong since; its next use rebuilds it).
* key_index_files: the table's data files the index names, numbered per index (so that each row of key_index
  carries a 4-byte number, not a path), each with its manifest description (pyiceberg's Avro encoding of the
  manifest entry's data file, under the partition type of its spec and schema) for the position delete files that
  delete from it.
* key_index: one row per live row of the table: its key's canonical bytes (coordinator_service.tables.key_encoding),
  and where it is, file_row: its file's number times 2**32 plus its position in the file, one bigint, so that a
  commit's deleted rows are removed with one `file_row = ANY(array)` looked up in the primary key (a join of
  (file, position) pairs is planned as a hash join over the whole index when the statistics are stale, as after a
  rebuild: a scan of every row), and a file's rows are a range of it. A key may be there twice (rows appended before
  the table was keyed): the key is not unique, the place is. Narrow on purpose: about 120 bytes a row with its two
  indexes' entries, for a key of a long column (a heap tuple of 48 bytes, about 35 and 30 in the btrees). No foreign
  key to key_index_files: the rebuild loads millions of rows with COPY, and a foreign key's check per row would
  double its time; the code removes a file's rows with the file.

Only additions: code at 0006 runs on it, and ignores the new tables.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None
OLDEST_COMPATIBLE_CODE = "0006"  # it only adds: code at 0006 runs on it


def upgrade() -> None:
    op.create_table(
        "key_index_tables",
        sa.Column("index_id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("table_uuid", sa.Uuid(), nullable=False, unique=True),
        sa.Column("table_identifier", sa.Text(), nullable=False),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=True),
        sa.Column("key_columns", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("key_types", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("built_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "key_index_files",
        sa.Column(
            "index_id",
            sa.Integer(),
            sa.ForeignKey("key_index_tables.index_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("file_id", sa.Integer(), primary_key=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("spec_id", sa.Integer(), nullable=False),
        sa.Column("schema_id", sa.Integer(), nullable=False),
        sa.Column("data_file", sa.LargeBinary(), nullable=False),
        sa.UniqueConstraint("index_id", "path", name="key_index_files_index_id_path_key"),
    )
    op.create_table(
        "key_index",
        # In this order, the 4-byte index_id and a short key share the 8 bytes before file_row: no padding.
        sa.Column("index_id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.LargeBinary(), nullable=False),
        sa.Column("file_row", sa.BigInteger(), primary_key=True),
    )
    op.create_index("ix_key_index_index_id_key", "key_index", ["index_id", "key"])


def downgrade() -> None:
    op.drop_table("key_index")
    op.drop_table("key_index_files")
    op.drop_table("key_index_tables")
