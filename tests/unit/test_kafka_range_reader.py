"""The consumer an executor reads a range with (spark_writer.kafka.range_reader); reading itself is tested
against a broker in tests/integration/test_kafka_source.py."""

from __future__ import annotations

from spark_writer.kafka.options import parse_options
from spark_writer.kafka.range_reader import consumer_config


def test_the_consumer_reads_committed_records_and_commits_nothing() -> None:
    options = parse_options({"kafka.bootstrap.servers": "k:9092", "subscribe": "a", "kafka.security.protocol": "SSL"})
    config = consumer_config(options)
    assert config["security.protocol"] == "SSL"
    assert config["isolation.level"] == "read_committed"
    assert config["enable.auto.commit"] is False
    assert config["auto.offset.reset"] == "error"
    assert consumer_config(options)["group.id"] != config["group.id"], "a group shared by tasks"
