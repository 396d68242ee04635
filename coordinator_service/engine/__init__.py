"""The coordinator's work: the writers' protocol, the committer and settlement, the cleaner, maintenance, the
operators' actions, the metastore checks and every deletion (file_deletion)."""
