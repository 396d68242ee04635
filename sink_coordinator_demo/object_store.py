"""S3-compatible object storage on this machine for the demo, the tests and the benchmark: moto's server.

moto (the `demo` extra) serves S3 and Glue over HTTP on 127.0.0.1; its contents live in the process that
started it and go with it. An ObjectStore describes any S3 endpoint (the tests build one from SINK_TEST_S3_*
for a real endpoint) in pyiceberg's FileIO property names, the one spelling of the coordinator's catalog and of
the writer's `--storage`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sink_coordinator_demo.ports import free_port


@dataclass(frozen=True)
class ObjectStore:
    endpoint: str
    access_key_id: str
    secret_access_key: str
    region: str
    bucket: str
    prefix: str

    @property
    def properties(self) -> dict[str, str]:
        """pyiceberg's FileIO properties for this store (the coordinator's catalog and the writer take them)."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": self.access_key_id,
            "s3.secret-access-key": self.secret_access_key,
            "s3.region": self.region,
        }

    def catalog_properties(self, kind: str, warehouse: str, database_url: str = "") -> dict[str, str]:
        """A catalog whose tables live on this store: "sql" (in the PostgreSQL `database_url`) or "glue" (the
        same endpoint's Glue, as moto serves it)."""
        if kind == "sql":
            return {"type": "sql", "uri": database_url, "warehouse": warehouse, **self.properties}
        return {
            "type": "glue",
            "glue.endpoint": self.endpoint,
            "glue.region": self.region,
            "glue.access-key-id": self.access_key_id,
            "glue.secret-access-key": self.secret_access_key,
            "warehouse": warehouse,
            **self.properties,
        }

    def uri(self, *parts: str) -> str:
        return "/".join([f"s3://{self.bucket}", *filter(None, [self.prefix, *parts])])


@contextmanager
def emulated_object_store(bucket: str, prefix: str = "") -> Iterator[ObjectStore]:
    """moto's S3 and Glue server on a free port of 127.0.0.1 with `bucket` created; stopped on exit."""
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as error:
        raise RuntimeError(
            f"the local object store needs moto ({error}): pip install 'sink-coordinator[demo]'"
        ) from None
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        store = ObjectStore(f"http://{host}:{port}", "emulated-key", "emulated-secret", "us-east-1", bucket, prefix)
        boto3.client(
            "s3",
            endpoint_url=store.endpoint,
            aws_access_key_id=store.access_key_id,
            aws_secret_access_key=store.secret_access_key,
            region_name=store.region,
        ).create_bucket(Bucket=bucket)
        yield store
    finally:
        server.stop()
