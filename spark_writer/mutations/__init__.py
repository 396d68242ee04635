"""Row mutations: upsert and change streams (`--mode upsert|cdc`) written as the rows that survive an epoch and the keys
it touched, for the coordinator to resolve to position deletes at commit (docs/spark-writer.md, "Upsert and change
streams")."""
