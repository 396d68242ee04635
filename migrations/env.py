"""Alembic environment: run by coordinator_service.schema with an open connection."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from coordinator_service.models import Base

connection: Connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
