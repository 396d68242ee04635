"""The two-phase commit log in PostgreSQL: its models and schema, the statements that read and write each record
(repository), the commit lock, the path claims and the metastore's connection."""
