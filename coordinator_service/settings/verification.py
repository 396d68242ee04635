"""How the continuous verification reaches Kafka (the maintenance step's; off by default: without it the step checks
the log, the snapshots and the live rows only), and the rules every Kafka setting of a verification meets (the
command line's flags and the admin API's fields too)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, Self

from pydantic import BaseModel, Field, model_validator

# The consumer settings the verifier sets itself: no option may change them.
OWN_SETTINGS: Final = frozenset({"bootstrap.servers", "group.id", "enable.auto.commit", "enable.partition.eof"})
_OPTION_NAME: Final = re.compile(r"[a-z][a-z0-9._-]{0,99}")


def kafka_access_problem(servers: str, options: Mapping[str, str]) -> str | None:
    """What is wrong with these bootstrap servers and librdkafka settings, if anything."""
    if not servers.strip() or len(servers) > 2000 or any(ch.isspace() or ord(ch) < 32 for ch in servers):
        return f"bootstrap servers must be host:port[,host:port...], got {servers[:200]!r}"
    if len(options) > 50:
        return f"at most 50 Kafka options, got {len(options)}"
    for name, value in options.items():
        if not _OPTION_NAME.fullmatch(name):
            return f"Kafka option {name[:200]!r} is not a librdkafka setting name"
        if name in OWN_SETTINGS:
            return f"Kafka option {name} is the verifier's own: it cannot be set"
        if len(value) > 4000 or any(ord(ch) < 32 for ch in value):
            return f"Kafka option {name}'s value {value[:200]!r} is not a setting's value"
    return None


class VerificationSettings(BaseModel):
    verification_bootstrap_servers: str | None = Field(
        default=None,
        description="Kafka's bootstrap servers for the verification maintenance step (VERIFICATION_ENABLED): with "
        "them it also proves that every offset the topics still hold is in a live row. Unset: it does not read Kafka.",
    )
    verification_kafka_options: dict[str, str] = Field(
        default_factory=dict,
        description="librdkafka settings the verification step reaches Kafka with (VERIFICATION_KAFKA_OPTIONS__"
        "<name>=value: security.protocol, sasl.*, ...).",
    )

    @model_validator(mode="after")
    def _check_kafka(self) -> Self:
        if self.verification_bootstrap_servers is None:
            if self.verification_kafka_options:
                raise ValueError("VERIFICATION_KAFKA_OPTIONS need VERIFICATION_BOOTSTRAP_SERVERS too")
            return self
        problem = kafka_access_problem(self.verification_bootstrap_servers, self.verification_kafka_options)
        if problem is not None:
            raise ValueError(problem)
        return self
