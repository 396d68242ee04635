"""Upgrades and rollbacks at the process level (issue 27.1): the previous schema revision's code serving while this
release's `migrate` runs and its replicas take over, behind a stand-in for the Kubernetes Service; and the `migrate
--to` command that rolls the schema back."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.contract.client import CoordinatorClient
from coordinator_service.log import schema
from coordinator_service.log.database import normalize_url
from coordinator_service.runtime import migrate
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, table_order_ids
from tests.fixtures.postgres import columns_of, new_database, query
from tests.fixtures.service_proxy import ServiceProxy
from tests.fixtures.streaming_writer import ROWS_PER_EPOCH, StreamingWriter

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = Path("migrations") / "versions"
# How often the stand-in kubelet asks each replica whether it is ready.
PROBE_SECONDS = 0.1


def git(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args],
        input=None if stdin is None else stdin.encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )


def holding(paths: list[str]) -> list[bool]:
    """Whether each `commit:path` names a file of the repository."""
    checked = git("cat-file", "--batch-check", stdin="\n".join(paths) + "\n").stdout.decode().splitlines()
    return [not line.endswith(" missing") for line in checked]


def commit_before_the_newest_migration() -> tuple[str, str]:
    """The newest commit of the checkout's history that holds the revision before the newest migration and not the
    newest (the code of the release before: it runs on that revision), and that revision; skips the test when the
    checkout has no such history (an export, a shallow clone).

    The first commit holding the newest migration is no guide: it may have been written on a branch that started
    before the revision before it existed (0016 was, beside 0015, and chained after it at the merge), so its parent
    holds neither."""
    names = sorted(path.name for path in (ROOT / MIGRATIONS).glob("[0-9]*.py"))
    newest, previous = str(MIGRATIONS / names[-1]), str(MIGRATIONS / names[-2])
    listed = git("rev-list", "--topo-order", "HEAD")
    if listed.returncode != 0:
        pytest.skip(f"git history of the checkout is unavailable: {listed.stderr.decode().strip()}")
    commits = listed.stdout.decode().split()
    held = holding([f"{commit}:{path}" for commit in commits for path in (previous, newest)])
    for index, commit in enumerate(commits):
        if held[2 * index] and not held[2 * index + 1]:
            return commit, Path(previous).name[:4]
    pytest.skip(f"git history of the checkout does not reach the commit before {newest} (a shallow clone?)")


@pytest.fixture
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The code of the previous schema revision, as its wheel would install it, and that revision."""
    commit, revision = commit_before_the_newest_migration()
    tree = tmp_path_factory.mktemp("previous-release")
    archive = git("archive", "--format=tar", commit)
    assert archive.returncode == 0, archive.stderr.decode()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    # The wheel's layout (pyproject's package-dir): without it, this checkout's editable install would hand the old
    # code this release's migrations.
    shutil.copytree(tree / "migrations", tree / "coordinator_service" / "migrations")
    return tree, revision


def command(code: Path, database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`sink-coordinator ARGS` of the code under `code`, on the metastore at `database_url` (run from there: `python
    -m` puts the working directory before PYTHONPATH)."""
    return subprocess.run(
        [sys.executable, "-m", "coordinator_service.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=code,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
            "PYTHONPATH": str(code),
            "SINK_COORDINATOR_DATABASE_URL": database_url,
        },
    )


def ready(replica: CoordinatorProcess) -> bool:
    try:
        with urllib.request.urlopen(f"{replica.http_url}/readyz", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Kubelet:
    """Probes /readyz of every replica every PROBE_SECONDS, as the kubelet does, and keeps the Service's endpoints
    to the ready replicas that are not terminating; records each probe round in which no replica was ready, once one
    has been."""

    service: ServiceProxy
    replicas: dict[str, CoordinatorProcess] = field(default_factory=dict)
    terminating: set[str] = field(default_factory=set)
    ready: set[str] = field(default_factory=set)
    rounds: int = 0
    # Whether a replica has been ready; then, when a round found none ready.
    served: bool = False
    none_ready: list[float] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Kubelet:
        self._thread = threading.Thread(target=self._probe_forever, daemon=True)
        self._thread.start()
        return self

    def _probe_forever(self) -> None:
        while not self._stop.wait(PROBE_SECONDS):
            with self._changed:
                serving = {name: replica for name, replica in self.replicas.items() if name not in self.terminating}
            now_ready = {name for name, replica in serving.items() if ready(replica)}
            self.service.set_endpoints(sorted(serving[name].grpc_port for name in now_ready))
            with self._changed:
                self.served = self.served or bool(now_ready)
                if self.served and not now_ready:
                    self.none_ready.append(time.monotonic())
                self.ready, self.rounds = now_ready, self.rounds + 1
                self._changed.notify_all()

    def add(self, name: str, replica: CoordinatorProcess) -> None:
        with self._changed:
            self.replicas[name] = replica

    def wait_ready(self, *names: str, timeout: float = 60.0) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: set(names) <= self.ready, timeout), (names, self.ready)

    def terminate(self, name: str) -> None:
        """Out of the endpoints first, then SIGTERM, as Kubernetes does with a pod it replaces."""
        with self._changed:
            self.terminating.add(name)
            rounds = self.rounds
            # The endpoints change at the next round.
            assert self._changed.wait_for(lambda: self.rounds > rounds, 10)
        self.replicas[name].stop()

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)


@pytest.fixture
def service() -> Iterator[ServiceProxy]:
    proxy = ServiceProxy()
    yield proxy
    proxy.close()


def start_replicas(code: Path, database_url: str, data_dir: Path, count: int) -> list[CoordinatorProcess]:
    replicas = [
        CoordinatorProcess(database_url=database_url, data_dir=data_dir).start(
            code, wait_serving=False, PYTHONPATH=str(code)
        )
        for _ in range(count)
    ]
    for replica in replicas:
        replica.wait_serving()
    return replicas


def test_a_rolling_upgrade_from_the_previous_schema_revision_keeps_a_replica_ready_and_the_writer_served(
    previous_release: tuple[Path, str],
    service: ServiceProxy,
    database_url: str,
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    """Issue 27.1's goal: the previous revision's code serves as two replicas with a writer streaming through them,
    this release's `migrate` runs while they serve (the pre-upgrade hook), two replicas of this release start and
    the old ones are stopped (a rolling update): at no probe is no replica ready, and no writer call fails."""
    old_code, old_revision = previous_release
    migrated = command(old_code, database_url, "migrate")
    assert migrated.returncode == 0 and f"metastore at revision {old_revision}" in migrated.stderr, migrated.stderr
    data_dir = tmp_path / "coordinator"
    replicas: list[CoordinatorProcess] = []
    kubelet = Kubelet(service).start()
    try:
        replicas += start_replicas(old_code, database_url, data_dir, 2)
        for name, replica in zip(("old-a", "old-b"), replicas, strict=True):
            kubelet.add(name, replica)
        kubelet.wait_ready("old-a", "old-b")
        with CoordinatorClient(f"127.0.0.1:{service.port}") as client:
            writer = StreamingWriter(client).start()

            def epochs_more(count: int) -> Callable[[StreamingWriter], bool]:
                target = writer.epochs + count
                return lambda w: w.epochs >= target

            writer.wait_for(epochs_more(3), "epochs through the previous release")
            upgraded = command(ROOT, database_url, "migrate")
            assert upgraded.returncode == 0, upgraded.stderr
            assert f"metastore at revision {schema.head_revision()}" in upgraded.stderr
            writer.wait_for(epochs_more(3), "epochs through the previous release on the new schema")
            new = start_replicas(ROOT, database_url, data_dir, 2)
            replicas += new
            for name, replica in zip(("new-a", "new-b"), new, strict=True):
                kubelet.add(name, replica)
            kubelet.wait_ready("new-a", "new-b")
            for name in ("old-a", "old-b"):
                kubelet.terminate(name)
            writer.wait_for(epochs_more(3), "epochs through this release alone")
            epochs = writer.stop()
            last = client.commit_checkpoint("orders", epochs - 1, writer.writer_term, wait=True)
        assert writer.failure is None, writer.failure
        assert [call for call in writer.calls if call.code is not None] == []
        assert kubelet.none_ready == [], f"no replica ready at {len(kubelet.none_ready)} probes"
        assert [replica.process.returncode for replica in replicas[:2] if replica.process] == [0, 0]
        assert last.committed_epoch == epochs - 1
        assert table_order_ids(catalog.load_table("db.orders")) == list(range(epochs * ROWS_PER_EPOCH))
    finally:
        kubelet.stop()
        for replica in replicas:
            replica.stop()


# Writer calls at once while a replica stops (each in a thread of its own, on one client as a Spark driver's).
CONCURRENT_CALLS = 16


def test_a_replica_stopped_under_a_writers_calls_fails_none_of_them(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    """A rolling update's SIGTERM reaches a replica while a writer's calls arrive: gRPC answers a call that had not
    reached a handler when the server began to stop CANCELLED (grpc/grpc#41785; about one call per stop here), which
    the client did not retry, so the writer's call failed. The client repeats it, and the other replica answers."""
    first, second = coordinator_factory(), coordinator_factory()
    with first.client() as registering:
        registering.register_writer("orders", "db.orders", -1, arrow_schema=ORDERS.serialize().to_pybytes())
    answered: list[int] = []
    failures: list[BaseException] = []
    changed = threading.Condition()
    stop = threading.Event()
    # Either replica: the channel connects to the first and, once it is gone, to the second.
    with CoordinatorClient(f"ipv4:127.0.0.1:{first.grpc_port},127.0.0.1:{second.grpc_port}") as client:

        def call_again_and_again() -> None:
            while not stop.is_set():
                try:
                    client.sink_state("orders")
                except BaseException as error:
                    failures.append(error)
                    raise
                with changed:
                    answered.append(1)
                    changed.notify_all()

        def answered_more(count: int) -> None:
            with changed:
                target = len(answered) + count
                assert changed.wait_for(lambda: len(answered) >= target or bool(failures), 60), failures

        callers = [threading.Thread(target=call_again_and_again) for _ in range(CONCURRENT_CALLS)]
        for caller in callers:
            caller.start()
        try:
            answered_more(200)
            first.stop()
            answered_more(200)
        finally:
            stop.set()
            for caller in callers:
                caller.join(timeout=60)
    assert first.process is not None and first.process.returncode == 0
    assert failures == []


def test_the_migrate_command_rolls_the_schema_back_to_a_revision(database_url: str, postgres_url: str) -> None:
    """The rollback's first step (docs/operations.md, 'Upgrades and rollbacks'): `migrate --to` the revision before
    leaves that revision's schema exactly, the sinks kept; a revision this release does not know is refused with
    nothing changed."""
    head = schema.head_revision()
    # The revision before head in the chain (numbers may skip one another branch holds until its merge).
    previous = sorted(schema.known_revisions())[-2]
    upgraded = command(ROOT, database_url, "migrate")
    assert upgraded.returncode == 0 and f"metastore at revision {head}" in upgraded.stderr, upgraded.stderr
    query(database_url, "INSERT INTO sinks (name, table_identifier, catalog) VALUES ('orders', 'db.orders', 'default')")

    unknown = command(ROOT, database_url, "migrate", "--to", "")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("cannot migrate: this release knows no schema revision ''"), unknown.stderr
    assert query(database_url, "SELECT version_num FROM alembic_version") == [(head,)]

    rolled = command(ROOT, database_url, "migrate", "--to", previous)

    assert rolled.returncode == 0 and f"metastore at revision {previous}" in rolled.stderr, rolled.stderr
    assert query(database_url, "SELECT version_num FROM alembic_version") == [(previous,)]
    with new_database(postgres_url) as fresh:
        migrate(normalize_url(fresh), previous)
        assert columns_of(database_url) == columns_of(fresh)
    assert query(database_url, "SELECT name FROM sinks") == [("orders",)]
