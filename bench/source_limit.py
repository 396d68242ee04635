"""The anchor of the end-to-end table: how fast this machine reads and parses the topic without Spark.

One confluent-kafka consumer reads every partition of the topic from its start, in batches of up to
10,000 messages, and pyarrow parses each batch's JSON values into the same columns the pipeline writes
(``pyarrow.json`` with the explicit schema, on its own threads): one process, nothing written. The pipeline cannot move
records faster than it can read and parse them; its rate is reported as a ratio to this one.
"""

from __future__ import annotations

import time
import uuid

import pyarrow as pa
import pyarrow.json as pj
from confluent_kafka import Consumer, TopicPartition

BATCH_MESSAGES = 10_000
ORDER_SCHEMA = pa.schema(
    [
        pa.field("order_id", pa.int64()),
        pa.field("customer", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("country", pa.string()),
    ]
)


def raw_read_rate(bootstrap: str, topic: str, partitions: int, records: int) -> float:
    """Records per second to consume and parse `records` records of `topic` (every record, from offset 0)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    options = pj.ParseOptions(explicit_schema=ORDER_SCHEMA, unexpected_field_behavior="ignore")
    try:
        consumer.assign([TopicPartition(topic, partition, 0) for partition in range(partitions)])
        started = time.monotonic()
        parsed = 0
        while parsed < records:
            messages = consumer.consume(BATCH_MESSAGES, timeout=1.0)
            values = [value for message in messages if message.error() is None and (value := message.value())]
            if values:
                table = pj.read_json(pa.BufferReader(b"\n".join(values)), parse_options=options)
                parsed += table.num_rows
        return records / (time.monotonic() - started)
    finally:
        consumer.close()
