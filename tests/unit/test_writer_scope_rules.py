"""Writer scopes: the patterns, the settings that configure them (hostile values included), the credentials, and
that every call of the service has a scope rule."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError
from typer.testing import CliRunner

from coordinator_service import app, cli, listening
from coordinator_service.cli import flags as cli_flags
from coordinator_service.contract.errors import MESSAGE_BYTES, PermissionDenied
from coordinator_service.contract.rpc import sink_coordinator_pb2 as pb
from coordinator_service.grpc_gate import SERVICE_NAME, TARGETS
from coordinator_service.settings import Settings
from coordinator_service.writer_scopes import OPEN, UNSCOPED, Credentials, Scope, WriterScope, matches, overlap

TOKEN_A = "scope-a-token-Zq3vX9pL2mN8rT5wY7bCd"
TOKEN_B = "scope-b-token-Hq7vX2pL9mN4rT1wY6bCe"
NAME = st.text(alphabet="ab-_.x", max_size=8)
PATTERN = st.one_of(NAME.filter(bool), NAME.map(lambda prefix: prefix + "*"))


def scope(sinks: list[str], namespaces: list[str], token: str = TOKEN_A) -> dict[str, object]:
    return {"token": token, "sinks": sinks, "namespaces": namespaces}


@given(PATTERN, PATTERN, NAME)
def test_patterns_that_share_a_name_overlap(first: str, second: str, name: str) -> None:
    if matches(first, name) and matches(second, name):
        assert overlap(first, second)


@given(PATTERN, PATTERN)
def test_overlapping_patterns_share_a_name(first: str, second: str) -> None:
    if not overlap(first, second):
        return
    exact = [pattern for pattern in (first, second) if not pattern.endswith("*")]
    witness = exact[0] if exact else max(first[:-1], second[:-1], key=len)
    assert matches(first, witness) and matches(second, witness)
    assert overlap(second, first)


@given(NAME.filter(bool), st.data())
def test_patterns_that_cover_one_name_are_found_overlapping(name: str, data: st.DataObject) -> None:
    def covering() -> str:
        if data.draw(st.booleans()):
            return name
        return name[: data.draw(st.integers(0, len(name)))] + "*"

    assert overlap(covering(), covering())


@pytest.mark.parametrize("pattern", ["", "a*b", "**", "a b", "tab\there", "nul\x00", "line\n", "x" * 257, "*a"])
def test_a_pattern_that_is_no_name_or_prefix_is_refused(pattern: str) -> None:
    with pytest.raises(ValidationError, match="is not a name or a prefix"):
        WriterScope(token=SecretStr(TOKEN_A), sinks=[pattern], namespaces=["*"])


@pytest.mark.parametrize("name", ["Team", "a__b", "-a", "_a", "a" * 64, "a.b", "a b", "é", "a\n", ""])
def test_a_scope_name_that_cannot_be_part_of_a_variable_name_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="writer scope name"):
        Settings(writer_scopes={name: scope(["a-*"], ["a"])})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("scopes", "message"),
    [
        ({"a": scope(["orders-*"], ["a"]), "b": scope(["orders-eu"], ["b"], TOKEN_B)}, "both cover some sink"),
        ({"a": scope(["*"], ["a"]), "b": scope(["x"], ["b"], TOKEN_B)}, "both cover some sink"),
        ({"a": scope(["a-*"], ["a"]), "b": scope(["b-*"], ["b"])}, "are the same token"),
        ({"a": {"sinks": ["a-*"], "namespaces": ["a"]}}, "has no token"),
        ({"a": scope(["a-*"], ["a"], "short")}, "at least 32 characters"),
        ({"a": scope(["a-*"], ["a"], "")}, "is empty"),
        ({"a": scope([], ["a"])}, "at least 1 item"),
        ({"a": scope(["a-*"], [])}, "at least 1 item"),
        ({"a": {**scope(["a-*"], ["a"]), "max_sinks": -1}}, "greater than or equal to 0"),
        ({"a": {**scope(["a-*"], ["a"]), "max_tables": 10**12}}, "less than or equal to"),
        ({"a": {**scope(["a-*"], ["a"]), "quota": 3}}, "Extra inputs are not permitted"),
    ],
)
def test_bad_scopes_are_refused_at_start(scopes: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(writer_scopes=scopes)  # type: ignore[arg-type]


def test_a_scope_token_may_not_be_another_credentials() -> None:
    with pytest.raises(ValidationError, match="are the same token"):
        Settings(admin_token=SecretStr(TOKEN_A), writer_scopes={"a": scope(["a-*"], ["a"])})  # type: ignore[dict-item]


def test_scopes_from_variables_json_and_a_token_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN_B}\n")
    monkeypatch.setenv("SINK_COORDINATOR_WRITER_SCOPES", json.dumps({"team-a": scope(["a-*"], ["team_a"])}))
    monkeypatch.setenv("SINK_COORDINATOR_WRITER_SCOPES__team-b__TOKEN_FILE", str(token_file))
    monkeypatch.setenv("SINK_COORDINATOR_WRITER_SCOPES__team-b__SINKS", '["b-*"]')
    monkeypatch.setenv("SINK_COORDINATOR_WRITER_SCOPES__team-b__NAMESPACES", '["team_b", "shared*"]')
    monkeypatch.setenv("SINK_COORDINATOR_WRITER_SCOPES__team-b__MAX_SINKS", "7")
    settings = Settings()
    assert sorted(settings.writer_scopes) == ["team-a", "team-b"]
    team_b = settings.writer_scopes["team-b"]
    assert team_b.token is not None and team_b.token.get_secret_value() == TOKEN_B
    assert (team_b.sinks, team_b.namespaces, team_b.max_sinks) == (["b-*"], ["team_b", "shared*"], 7)
    assert TOKEN_A not in repr(settings) and TOKEN_B not in repr(settings)


def test_credentials_name_the_scope_of_a_token_and_nothing_else() -> None:
    settings = Settings(
        writer_token=SecretStr(TOKEN_A),
        writer_scopes={"b": scope(["b-*"], ["b"], TOKEN_B)},  # type: ignore[dict-item]
    )
    credentials = Credentials(settings.writer_token, settings.writer_scopes)
    assert credentials.required
    unscoped, team_b = credentials.scope_of(TOKEN_A), credentials.scope_of(TOKEN_B)
    assert unscoped is not None and unscoped.name == UNSCOPED and unscoped.rules.covers_sink("anything")
    assert team_b is not None and team_b.name == "b"
    for sent in (None, "", TOKEN_A + "x", TOKEN_A[:-1], TOKEN_B.upper()):
        assert credentials.scope_of(sent) is None
    open_scope = Credentials(None, {}).scope_of(None)
    assert open_scope is not None and open_scope.name == OPEN


@given(st.text(max_size=300), st.lists(st.text(max_size=300), max_size=5))
def test_a_scope_refuses_what_it_does_not_cover_saying_what_it_covers(sink: str, tables: list[str]) -> None:
    team = Scope("team-a", WriterScope(token=SecretStr(TOKEN_A), sinks=["a-*"], namespaces=["team_a", "shared*"]))
    covered = sink.startswith("a-") and all(
        table.rpartition(".")[0] == "team_a" or table.rpartition(".")[0].startswith("shared") for table in tables
    )
    if covered:
        team.authorize(sink, tables)
        return
    with pytest.raises(PermissionDenied) as refused:
        team.authorize(sink, tables)
    assert "writer scope team-a does not cover" in refused.value.message
    assert len(refused.value.message.encode()) <= MESSAGE_BYTES


def test_every_call_of_the_service_has_a_scope_rule() -> None:
    methods = pb.DESCRIPTOR.services_by_name["SinkCoordinator"].methods
    assert {f"/{SERVICE_NAME}/{method.name}" for method in methods} == set(TARGETS)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--writer-scopes", json.dumps({"a": scope(["a b"], ["a"])})], "is not a name or a prefix"),
        (["--writer-scopes", json.dumps({"a": scope(["a-*"], ["a"], TOKEN_A[:20])})], "has 20 characters"),
        (["--writer-scopes", "{not json"], "not JSON"),
        (["--writer-scopes", "[]"], "not a JSON object"),
    ],
)
def test_a_bad_scope_flag_is_refused_without_showing_its_token(flags: list[str], message: str) -> None:
    result = CliRunner().invoke(cli.app, ["serve", *flags], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()), result.output
    assert TOKEN_A[:20] not in result.output


def test_scopes_from_a_flag() -> None:
    taken: list[Settings] = []

    async def serve(settings: Settings, *, process: object) -> None:  # the Settings serve's flags made, not serving
        taken.append(settings)

    with (
        mock.patch.object(app, "serve", serve),
        mock.patch.object(cli_flags, "configure_logging"),
        mock.patch.object(listening, "check_free"),  # nothing is served: the machine's default ports do not matter
    ):
        flag = json.dumps({"team-a": scope(["a-*"], ["team_a"])})
        result = CliRunner().invoke(
            cli.app, ["serve", "--processes", "1", "--writer-scopes", flag], env={"COLUMNS": "300"}
        )
    assert result.exit_code == 0, result.output
    (settings,) = taken
    assert settings.writer_scopes["team-a"].sinks == ["a-*"]
