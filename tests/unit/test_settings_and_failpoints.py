from pathlib import Path

import pytest
from pydantic import ValidationError

from coordinator_service import failpoints
from coordinator_service.failpoints import Action, Failpoint, FailpointError
from coordinator_service.logs import LogLevel
from coordinator_service.settings import Settings


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


def test_secrets_from_files(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    settings = Settings(admin_token_file=token)
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)


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
