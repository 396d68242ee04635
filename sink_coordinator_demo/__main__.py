from sink_coordinator_demo.cli import app

app()
