"""Alembic environment: run by coordinator_service.log.schema with an open connection."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, text

from coordinator_service.log.models import Base

connection: Connection = context.config.attributes["connection"]
# Every migration waits at most this long for a lock, then fails (and is retried by the operator): the pods of the
# release being replaced keep serving while it runs, and a migration queued behind one of their transactions would
# queue every later statement of theirs behind itself.
lock_timeout_ms = max(1, int(float(context.config.attributes.get("lock_timeout_seconds", 10.0)) * 1000))
connection.execute(text(f"SET lock_timeout = {lock_timeout_ms}"))
context.configure(connection=connection, target_metadata=Base.metadata, transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
