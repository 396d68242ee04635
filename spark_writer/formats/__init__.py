"""Kafka records into table rows: JSON, and the registry formats (Avro, Protobuf, JSON Schema) through Confluent's
wire format; the records that do not fit, for the dead-letter topic."""
