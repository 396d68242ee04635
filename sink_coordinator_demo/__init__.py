"""The demo (`make demo`, `python -m sink_coordinator_demo`): Kafka -> Spark -> coordinator -> Iceberg on one machine.

It starts the coordinator and, without --bootstrap-servers, a local Kafka-protocol broker (noida-db), so it
needs both roles' dependencies (`pip install 'sink-coordinator[all]' noida-db`). The writer (spark_writer)
never imports it; the tests and benchmarks take their ports from it (ports.py).
"""
