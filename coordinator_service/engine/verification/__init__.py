"""Verification: proof, from outside the writer, that a sink's tables hold exactly what its topics held in the
committed range (findings.py: what it finds; ranges.py: the shallow check of the log's offset ranges and the
snapshots; positions.py: the deep check of the live rows' Kafka positions and keys; topic_offsets.py: the offsets a
topic still has; verifier.py: a sink verified, whole or from where it was verified last)."""
