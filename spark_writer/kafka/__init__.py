"""The Kafka source: a Python Data Source Spark drives (offsets, options, data loss, the driver's look-ups), the
executors reading their ranges as Arrow batches, and where a batch ended."""
