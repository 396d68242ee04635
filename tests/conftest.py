from hypothesis import Phase, settings

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.coordinator",
    "tests.fixtures.kafka_broker",
    "tests.fixtures.spark",
    "tests.fixtures.admin",
    "tests.fixtures.object_store",
    "tests.fixtures.spark_cluster",
    "tests.fixtures.schema_registry",
    "tests.fixtures.writer_cli",
    "tests.fixtures.hang_report",
    "tests.fixtures.logging_state",
]

# Hypothesis traces every example it runs after a failure (sys.settrace, for its explain phase). On Python 3.11 that
# slowed the shrinking of the key index's state machine past pytest's 300 s timeout in CI, and the timeout's report
# (a FlakyStrategyDefinition) replaced the failing example. The examples are still shrunk; only the explanation goes.
settings.register_profile("sink-coordinator", phases=[phase for phase in Phase if phase is not Phase.explain])
settings.load_profile("sink-coordinator")
