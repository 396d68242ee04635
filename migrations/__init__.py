"""Alembic migrations of the metastore; shipped as coordinator_service.migrations."""
