"""The two-phase commit log in PostgreSQL: its models and schema, the statements on each record by what it stores
(sinks, their tables, epochs read and changed, parts, maintenance runs, path claims), the commit lock, the metadata
encoding and the metastore's connection. Only this package writes SQL."""
