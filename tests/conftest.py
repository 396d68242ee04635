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
