"""Tokens from every source (a variable, a flag, a file) are refused at start when empty, short or malformed."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError
from typer.testing import CliRunner

from coordinator_service import cli, metrics
from coordinator_service.admin.auth import AdminAuth
from coordinator_service.admin.console_session import ConsoleSessions
from coordinator_service.contract.errors import Unauthenticated
from coordinator_service.log.database import Database, normalize_url
from coordinator_service.settings import Settings
from coordinator_service.settings.access import MIN_TOKEN_CHARACTERS
from coordinator_service.writer_scopes import Credentials

GOOD = "Zq3vX9pL2mN8rT5wY7bC4dF6gH1jK0sA"  # 32 characters of the bearer-token alphabet
TOKEN_SETTINGS = ("admin_token", "writer_token", "metrics_token")
BEARER_ALPHABET = string.ascii_letters + string.digits + "-._~+/"


@pytest.mark.parametrize("name", TOKEN_SETTINGS)
@pytest.mark.parametrize(("value", "message"), [("", "is empty"), ("short-token", "at least 32 characters")])
def test_an_empty_or_short_token_is_refused(name: str, value: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**{name: SecretStr(value)})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", TOKEN_SETTINGS)
def test_an_empty_token_variable_is_refused(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An existingSecret with an empty key sets the variable to the empty string: that is no token, refused."""
    monkeypatch.setenv(f"SINK_COORDINATOR_{name.upper()}", "")
    with pytest.raises(ValidationError, match=f"SINK_COORDINATOR_{name.upper()} is empty"):
        Settings()


def test_an_empty_token_flag_is_refused() -> None:
    result = CliRunner().invoke(cli.app, ["serve", "--writer-token", ""], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "SINK_COORDINATOR_WRITER_TOKEN is empty" in " ".join(result.output.split())


def test_a_short_token_file_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with pytest.raises(ValidationError, match="at least 32 characters"):
        Settings(admin_token_file=token)


@given(st.text(max_size=MIN_TOKEN_CHARACTERS - 1))
def test_every_token_under_the_minimum_is_refused(value: str) -> None:
    with pytest.raises(ValidationError):
        Settings(writer_token=SecretStr(value))


@given(
    st.text(alphabet=BEARER_ALPHABET, min_size=MIN_TOKEN_CHARACTERS, max_size=200).filter(lambda t: len(set(t)) >= 8),
    st.sampled_from(" \t\n\x00\x7f\"',;:é\u2028"),
    st.data(),
)
def test_a_character_a_header_cannot_carry_is_refused(base: str, bad: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(base)))
    with pytest.raises(ValidationError, match="may hold only"):
        Settings(admin_token=SecretStr(base[:at] + bad + base[at:]))


@given(st.text(alphabet=BEARER_ALPHABET, min_size=MIN_TOKEN_CHARACTERS, max_size=200))
def test_a_long_token_of_the_bearer_alphabet_is_taken_when_not_monotonous(value: str) -> None:
    if len(set(value)) < 8:
        with pytest.raises(ValidationError, match="different characters"):
            Settings(admin_token=SecretStr(value))
    else:
        settings = Settings(admin_token=SecretStr(value))
        assert settings.admin_token is not None and settings.admin_token.get_secret_value() == value


def test_one_token_for_two_apis_is_refused() -> None:
    with pytest.raises(ValidationError, match="the same token"):
        Settings(admin_token=SecretStr(GOOD), writer_token=SecretStr(GOOD))
    with pytest.raises(ValidationError, match="the same token"):
        Settings(admin_token=SecretStr(GOOD), metrics_token=SecretStr(GOOD))


def test_the_console_never_signs_in_an_empty_token() -> None:
    with pytest.raises(ValueError, match="empty"):
        AdminAuth(SecretStr(""), read_requires_token=False)
    unused = Database(normalize_url("postgresql://127.0.0.1:1/unused"))  # signing in reads no metastore
    for configured in (None, SecretStr(GOOD)):
        sessions = ConsoleSessions(AdminAuth(configured, read_requires_token=False), unused)
        assert sessions.sign_in("") is None


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        (["evil host"], "is not a host name"),
        (["coordinator:8080"], "is not a host name"),
        (["a/b"], "is not a host name"),
        (["localhost\n"], "is not a host name"),
        (["*.example.com"], "is not a host name"),
        ("a,b c", "is not a host name"),
    ],
)
def test_an_allowed_host_that_is_no_host_name_is_refused(hosts: str | list[str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(allowed_hosts=hosts)  # type: ignore[arg-type]


def test_hosts_and_proxies_are_comma_separated_in_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINK_COORDINATOR_ALLOWED_HOSTS", "Coordinator.Example, [::1],localhost")
    monkeypatch.setenv("SINK_COORDINATOR_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.7")
    settings = Settings()
    assert settings.allowed_hosts == ["coordinator.example", "::1", "localhost"]
    assert settings.trusted_proxies == ["10.0.0.0/8", "192.168.1.7"]
    assert Settings().allowed_hosts == ["coordinator.example", "::1", "localhost"]


@pytest.mark.parametrize("proxy", ["proxy.example", "10.0.0.0/33", "300.1.1.1", "*"])
def test_a_trusted_proxy_that_is_no_address_or_network_is_refused(proxy: str) -> None:
    with pytest.raises(ValidationError, match="is not an IP address or network"):
        Settings(trusted_proxies=[proxy])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("grpc_max_concurrent_rpcs", 0),
        ("grpc_max_concurrent_rpcs", 10**9),
        ("grpc_max_streams_per_connection", 0),
        ("grpc_max_streams_per_connection", -5),
        ("grpc_max_connection_age_seconds", 0.5),
        ("grpc_max_connection_age_seconds", float("inf")),
        ("grpc_max_connection_age_seconds", float("nan")),
        ("metrics_cache_seconds", -1.0),
        ("metrics_cache_seconds", 1e9),
        ("metrics_cache_seconds", float("nan")),
    ],
)
def test_the_bounds_of_the_security_settings(name: str, value: float) -> None:
    with pytest.raises(ValidationError, match=name):
        Settings(**{name: value})  # type: ignore[arg-type]


@given(st.text(max_size=300))
def test_the_console_shows_no_notice_it_did_not_sign(sent: str) -> None:
    unused = Database(normalize_url("postgresql://127.0.0.1:1/unused"))
    sessions = ConsoleSessions(AdminAuth(SecretStr(GOOD), read_requires_token=False), unused)
    assert sessions.notice_text(sent) == ""
    assert sessions.notice_text(sessions.notice(sent)) == sent


NEW = "Hq7vX2pL9mN4rT1wYc5dF8gJ3kL6sZ0a"  # the token a rotation brings in, beside GOOD


@pytest.mark.parametrize("name", ["admin_token", "writer_token"])
def test_a_previous_token_is_taken_beside_a_new_one_and_checked_like_it(name: str) -> None:
    """On-call review: no rotation without an outage, since one token was accepted at a time."""
    settings = Settings(**{name: NEW, f"{name}_previous": GOOD})
    assert getattr(settings, f"{name}_previous").get_secret_value() == GOOD
    with pytest.raises(ValidationError, match=f"{name.upper()}_PREVIOUS is set without"):
        Settings(**{f"{name}_previous": GOOD})
    with pytest.raises(ValidationError, match="are the same token"):
        Settings(**{name: GOOD, f"{name}_previous": GOOD})
    with pytest.raises(ValidationError, match="characters"):
        Settings(**{name: NEW, f"{name}_previous": "short"})


def test_both_tokens_of_a_rotation_open_the_same_writer_scope() -> None:
    credentials = Credentials(SecretStr(NEW), {}, SecretStr(GOOD))
    assert credentials.scope_of(NEW) == credentials.scope_of(GOOD) is not None
    assert credentials.scope_of(GOOD + "x") is None


def test_an_action_with_the_previous_admin_token_is_recorded_as_such() -> None:
    auth = AdminAuth(SecretStr(NEW), read_requires_token=True, previous_token=SecretStr(GOOD))
    request = Request({"type": "http", "client": ("10.0.0.1", 5000), "headers": []})
    now = auth.operator(request, HTTPAuthorizationCredentials(scheme="Bearer", credentials=NEW))
    old = auth.operator(request, HTTPAuthorizationCredentials(scheme="Bearer", credentials=GOOD))
    assert (now.identity, old.identity) == ("admin", "admin (previous token)")
    failures = metrics.AUTHENTICATION_FAILURES.labels("http")._value.get()  # type: ignore[attr-defined]
    with pytest.raises(Unauthenticated):
        auth.operator(request, HTTPAuthorizationCredentials(scheme="Bearer", credentials=GOOD + "x"))
    assert metrics.AUTHENTICATION_FAILURES.labels("http")._value.get() == failures + 1  # type: ignore[attr-defined]
