"""`make demo DEMO_ARGS=--cdc`: a database's change stream of orders, as Debezium writes it, mirrored into a keyed
Iceberg table. Each order is created, then its status moves through its life (paid, shipped, delivered; or
cancelled, and some cancelled orders are deleted, each delete followed by its tombstone); the stream's changes of
many orders interleave. The table must hold each order that still exists once, with its last status and amount,
and no deleted order: the check compares it with the model the stream makes, and counts its rows by status."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from confluent_kafka import KafkaError, Message, Producer
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFileContent
from rich.table import Table

from coordinator_service.contract.markers import MARKER_SINK, snapshot_properties
from sink_coordinator_demo.orders import ADMIN_TIMEOUT_SECONDS, COUNTRY_CURRENCIES
from spark_writer.mutations.modes import Envelope, MutationMode, Mutations

ORDER_ROW_DDL: Final = (
    "order_id BIGINT NOT NULL, customer_id BIGINT, amount DOUBLE, currency STRING, country STRING, status STRING, "
    "updated_at TIMESTAMP"
)
MUTATIONS: Final = Mutations(MutationMode.CDC, ("order_id",), envelope=Envelope.DEBEZIUM)
# Where an order's status goes next (none: its life is over); the weights of each way.
NEXT_STATUS: Final[Mapping[str, tuple[tuple[str, ...], tuple[int, ...]]]] = {
    "created": (("paid", "cancelled"), (9, 1)),
    "paid": (("shipped", "cancelled"), (9, 1)),
    "shipped": (("delivered",), (1,)),
    "delivered": ((), ()),
    "cancelled": (("deleted", "kept"), (1, 1)),  # a cancelled order is deleted, or kept as it is
}
STATUS_ORDER: Final = ("created", "paid", "shipped", "delivered", "cancelled")
# How many orders live at once: the changes of this many orders interleave in the stream.
OPEN_ORDERS: Final = 200

# An order's row in the table: (status, amount).
Order = tuple[str, float]


@dataclass(frozen=True)
class OrderChange:
    """One change of the stream, in Kafka order: the order's new row (op c or u), or its deletion (op d)."""

    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @property
    def order_id(self) -> int:
        row = self.after if self.after is not None else self.before
        assert row is not None
        return int(row["order_id"])


def order_changes(count: int, seed: int = 29) -> Iterator[OrderChange]:
    """`count` changes of orders, about OPEN_ORDERS of them at a time in their lives; the same seed, the same
    stream."""
    rng = random.Random(seed)
    clock = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
    open_orders: dict[int, dict[str, Any]] = {}
    next_id = 1
    produced = 0
    while produced < count:
        clock += timedelta(seconds=rng.randint(1, 5))
        stamp = clock.isoformat().replace("+00:00", "Z")
        if len(open_orders) < OPEN_ORDERS or rng.random() < 0.2:
            country = rng.choice(tuple(COUNTRY_CURRENCIES))
            row = {
                "order_id": next_id,
                "customer_id": rng.randint(1, 20_000),
                "amount": round(rng.uniform(5, 900), 2),
                "currency": COUNTRY_CURRENCIES[country],
                "country": country,
                "status": "created",
                "updated_at": stamp,
            }
            open_orders[next_id] = row
            next_id += 1
            produced += 1
            yield OrderChange("c", None, row)
            continue
        order_id = rng.choice(tuple(open_orders))
        before = open_orders[order_id]
        ways, weights = NEXT_STATUS[before["status"]]
        way = rng.choices(ways, weights)[0]
        if way == "deleted":
            del open_orders[order_id]
            produced += 1
            yield OrderChange("d", before, None)
            continue
        if way == "kept":
            del open_orders[order_id]  # no more changes: a kept cancelled order stays as it is
            continue
        after = {**before, "status": way, "updated_at": stamp}
        if way == "cancelled":
            after["amount"] = 0.0  # refunded
        if not NEXT_STATUS[way][0]:
            del open_orders[order_id]
        else:
            open_orders[order_id] = after
        produced += 1
        yield OrderChange("u", before, after)


@dataclass
class OrderModel:
    """What the stream leaves: each existing order's last row; orders 1..created were ever created."""

    rows: dict[int, Order]
    created: int = 0
    deleted: int = 0  # deletes, each followed by its tombstone


def produce_order_changes(bootstrap: str, topic: str, count: int, on_delivered: Callable[[int], None]) -> OrderModel:
    """Produce `count` changes as Debezium's JSON envelopes (key: {"order_id": N}; a tombstone after each delete),
    calling `on_delivered(n)` as they are acknowledged; return the model."""
    errors: list[str] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(str(error))
        elif message.value() is not None:
            on_delivered(1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    model = OrderModel({})
    for position, change in enumerate(order_changes(count)):
        envelope = {
            "before": change.before,
            "after": change.after,
            "op": change.op,
            "ts_ms": 1_764_000_000_000 + position,
            "source": {"connector": "postgresql", "db": "shop", "schema": "public", "table": "orders"},
        }
        key = json.dumps({"order_id": change.order_id}).encode()
        values: list[bytes | None] = [json.dumps(envelope, separators=(",", ":")).encode()]
        model.created = max(model.created, change.order_id)
        if change.after is None:
            model.rows.pop(change.order_id, None)
            model.deleted += 1
            values.append(None)  # Debezium's tombstone, for log compaction
        else:
            model.rows[change.order_id] = (change.after["status"], change.after["amount"])
        for value in values:
            while True:
                try:  # the key picks the partition: Kafka keeps an order's changes in order
                    producer.produce(topic, key=key, value=value, on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
        producer.poll(0)
    undelivered = producer.flush(ADMIN_TIMEOUT_SECONDS)
    if undelivered or errors:
        raise RuntimeError(f"{undelivered} changes not delivered; errors: {errors[:5]}")
    return model


@dataclass(frozen=True)
class ChangeCheck:
    """The table against the model: the rows of the orders that exist, by status, and every difference."""

    rows: int
    orders: int  # the orders that exist (the model's)
    duplicates: int  # order ids in more than one row
    missing: int  # existing orders not in the table
    deleted_present: int  # deleted orders still in the table
    stale: int  # orders whose row is not their last change
    by_status: Counter[str]
    model_by_status: Counter[str]
    snapshots: int
    delete_files: int
    location: str

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.missing or self.deleted_present or self.stale) and self.rows == self.orders


def check_changes(catalog: Catalog, table: str, sink: str, model: OrderModel) -> ChangeCheck:
    """Read the table (pyiceberg, its position deletes applied) and compare it with the model."""
    loaded = catalog.load_table(table)
    rows = loaded.scan(selected_fields=("order_id", "status", "amount")).to_arrow().to_pylist()
    ids = Counter(row["order_id"] for row in rows)
    read = {row["order_id"]: (row["status"], row["amount"]) for row in rows}
    deleted = set(range(1, model.created + 1)) - set(model.rows)
    return ChangeCheck(
        rows=len(rows),
        orders=len(model.rows),
        duplicates=sum(1 for count in ids.values() if count > 1),
        missing=len(set(model.rows) - set(read)),
        deleted_present=len(deleted & set(read)),
        stale=sum(1 for order_id, order in model.rows.items() if order_id in read and read[order_id] != order),
        by_status=Counter(status for status, _ in read.values()),
        model_by_status=Counter(status for status, _ in model.rows.values()),
        snapshots=sum(1 for s in loaded.snapshots() if snapshot_properties(s).get(MARKER_SINK) == sink),
        delete_files=sum(
            1
            for content in loaded.inspect.files().column("content").to_pylist()
            if content == DataFileContent.POSITION_DELETES
        ),
        location=str(loaded.location()),
    )


def change_results(changes: int, check: ChangeCheck, committed_epochs: int) -> Table:
    """The check's table: the table against the model, then the orders by status."""
    results = Table(
        title="the table mirrors the orders?" + (" [green]yes[/green]" if check.ok else " [red]NO[/red]"),
        show_header=False,
    )
    results.add_column(style="bold")
    results.add_column(justify="right")
    for label, value, bad in [
        ("changes produced (Debezium envelopes; a tombstone after each delete)", changes, False),
        ("orders that exist (the model: each order's last change)", check.orders, False),
        ("rows in the Iceberg table", check.rows, check.rows != check.orders),
        ("duplicates (orders in more than one row)", check.duplicates, True),
        ("missing (existing orders not in the table)", check.missing, True),
        ("deleted orders still in the table", check.deleted_present, True),
        ("rows not at their order's last change", check.stale, True),
        ("epochs (Spark micro-batches) committed", committed_epochs, False),
        ("Iceberg snapshots written by the sink", check.snapshots, False),
        ("position delete files (the old rows of changed orders)", check.delete_files, False),
    ]:
        style = "red" if bad and value else ""
        results.add_row(label, f"[{style}]{value:,}[/{style}]" if style else f"{value:,}")
    results.add_section()
    for status in STATUS_ORDER:
        table_count, model_count = check.by_status[status], check.model_by_status[status]
        shown = (
            f"{table_count:,}" if table_count == model_count else f"[red]{table_count:,} (model {model_count:,})[/red]"
        )
        results.add_row(f"orders {status}", shown)
    return results
