"""A stream of realistic order events for the demo: JSON values keyed by order id."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

ORDER_SCHEMA_DDL: Final = (
    "order_id BIGINT, customer_id BIGINT, "
    "items ARRAY<STRUCT<sku: STRING, quantity: INT, unit_price: DOUBLE>>, "
    "amount DOUBLE, currency STRING, country STRING, status STRING, created_at TIMESTAMP"
)
COUNTRY_CURRENCIES: Final = {"DE": "EUR", "FR": "EUR", "ES": "EUR", "GB": "GBP", "US": "USD", "JP": "JPY"}
STATUSES: Final = ("created", "paid", "shipped", "delivered", "cancelled")
SKUS: Final = tuple(f"SKU-{n:05d}" for n in range(1, 501))
ADMIN_TIMEOUT_SECONDS: Final = 30.0


def order_events(count: int, seed: int = 7) -> Iterator[dict[str, Any]]:
    """`count` orders with ids 1..count, placed over the last week; the same seed gives the same stream."""
    rng = random.Random(seed)
    now = datetime.now(UTC).replace(microsecond=0)
    for order_id in range(1, count + 1):
        country = rng.choice(tuple(COUNTRY_CURRENCIES))
        lines = [(rng.choice(SKUS), rng.randint(1, 4), round(rng.uniform(2, 250), 2)) for _ in range(rng.randint(1, 5))]
        yield {
            "order_id": order_id,
            "customer_id": rng.randint(1, 20_000),
            "items": [{"sku": sku, "quantity": quantity, "unit_price": price} for sku, quantity, price in lines],
            "amount": round(sum(quantity * price for _, quantity, price in lines), 2),
            "currency": COUNTRY_CURRENCIES[country],
            "country": country,
            "status": rng.choices(STATUSES, weights=(10, 40, 25, 20, 5))[0],
            "created_at": (now - timedelta(seconds=rng.randint(0, 7 * 24 * 3600))).isoformat().replace("+00:00", "Z"),
        }


def create_topic(bootstrap: str, topic: str, partitions: int, replication_factor: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)])
    futures[topic].result(timeout=ADMIN_TIMEOUT_SECONDS)


def produce_orders(bootstrap: str, topic: str, count: int, on_delivered: Callable[[int], None]) -> None:
    """Produce the orders (key: order id), calling `on_delivered(n)` as batches of them are acknowledged."""
    errors: list[str] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(str(error))
        else:
            on_delivered(1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for event in order_events(count):
        value = json.dumps(event, separators=(",", ":")).encode()
        while True:
            try:
                producer.produce(topic, key=str(event["order_id"]).encode(), value=value, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)
    undelivered = producer.flush(ADMIN_TIMEOUT_SECONDS)
    if undelivered or errors:
        raise RuntimeError(f"{undelivered} orders not delivered; errors: {errors[:5]}")
