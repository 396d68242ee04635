"""`python -m coordinator_service.cli`: the sink-coordinator command."""

from coordinator_service.cli import app

app()
