pytest_plugins = ["tests.fixtures.kafka_broker", "tests.fixtures.spark"]
