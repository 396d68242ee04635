"""The exactly-once sink: each task's Kafka records decoded and written as data files by the executors, the batch
pre-committed by the driver (one table or several), checkpoints reported."""
