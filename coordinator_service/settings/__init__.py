"""Every knob of the coordinator, read from SINK_COORDINATOR_* variables and the matching flags: one group a module
(serving, access, storage, commits, maintenance, verification; bounds they share), put together here with the checks
that span groups."""

from __future__ import annotations

from typing import Self

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from coordinator_service.settings.access import AccessSettings, check_token, secret_from_file
from coordinator_service.settings.bounds import ENV_PREFIX
from coordinator_service.settings.commits import CommitSettings
from coordinator_service.settings.maintenance import MaintenancePolicy
from coordinator_service.settings.serving import ServingSettings
from coordinator_service.settings.storage import StorageSettings
from coordinator_service.settings.verification import VerificationSettings


class Settings(
    BaseSettings,
    ServingSettings,
    AccessSettings,
    StorageSettings,
    CommitSettings,
    MaintenancePolicy,
    VerificationSettings,
):
    """The coordinator's configuration.

    Values come from (highest first) command-line flags, environment variables
    with the prefix SINK_COORDINATOR_, and the defaults below. Every secret can
    also be read from a file named by the matching *_FILE setting.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    @model_validator(mode="after")
    def _read_secret_files(self) -> Self:
        for name in (
            "database_url",
            "admin_token",
            "admin_token_previous",
            "writer_token",
            "writer_token_previous",
            "metrics_token",
        ):
            setattr(
                self,
                name,
                secret_from_file(f"{ENV_PREFIX}{name.upper()}", getattr(self, name), getattr(self, f"{name}_file")),
            )
        for scope_name, scope in self.writer_scopes.items():
            variable = f"{ENV_PREFIX}WRITER_SCOPES__{scope_name}__TOKEN"
            scope.token = secret_from_file(variable, scope.token, scope.token_file)
            if scope.token is None:
                raise ValueError(f"writer scope {scope_name} has no token: set {variable} (or {variable}_FILE)")
            previous = f"{ENV_PREFIX}WRITER_SCOPES__{scope_name}__PREVIOUS_TOKEN"
            scope.previous_token = secret_from_file(previous, scope.previous_token, scope.previous_token_file)
        for previous, current in (("admin_token_previous", "admin_token"), ("writer_token_previous", "writer_token")):
            if getattr(self, previous) is not None and getattr(self, current) is None:
                raise ValueError(
                    f"{ENV_PREFIX}{previous.upper()} is set without {ENV_PREFIX}{current.upper()}: a rotation replaces "
                    "a token by a new one, set both (or neither)"
                )
        names = ("admin_token", "admin_token_previous", "writer_token", "writer_token_previous", "metrics_token")
        tokens = (
            {f"{ENV_PREFIX}{name.upper()}": getattr(self, name) for name in names}
            | {f"{ENV_PREFIX}WRITER_SCOPES__{name}__TOKEN": scope.token for name, scope in self.writer_scopes.items()}
            | {
                f"{ENV_PREFIX}WRITER_SCOPES__{name}__PREVIOUS_TOKEN": scope.previous_token
                for name, scope in self.writer_scopes.items()
            }
        )
        seen: dict[str, str] = {}
        for variable, token in tokens.items():
            if token is None:
                continue
            check_token(variable, token.get_secret_value())
            other = seen.setdefault(token.get_secret_value(), variable)
            if other != variable:
                raise ValueError(
                    f"{other} and {variable} are the same token: each must be different, or one would open what "
                    "the other is for"
                )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(f"set both {ENV_PREFIX}TLS_CERT_FILE and {ENV_PREFIX}TLS_KEY_FILE, or neither")
        if self.retry_max_seconds < self.retry_initial_seconds:
            raise ValueError(
                f"{ENV_PREFIX}RETRY_MAX_SECONDS ({self.retry_max_seconds:g}) is below "
                f"{ENV_PREFIX}RETRY_INITIAL_SECONDS ({self.retry_initial_seconds:g})"
            )
        explicit = "admin_read_requires_token" in self.model_fields_set
        if explicit and self.admin_read_requires_token and self.admin_token is None:
            raise ValueError(
                f"{ENV_PREFIX}ADMIN_READ_REQUIRES_TOKEN is true but no {ENV_PREFIX}ADMIN_TOKEN is set: "
                "set the token, or the read routes would be closed to everyone"
            )
        return self
