"""Randomized crash and outage runs proving exactly-once end to end (python -m tests.torture)."""
