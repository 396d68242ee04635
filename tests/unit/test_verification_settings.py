"""The Kafka settings of a verification are refused alike wherever they come in: the coordinator's settings (the
continuous step's), the admin API's fields and the command line's flags (KafkaAccess), with nothing kept."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from coordinator_service.contract.errors import InvalidArgument
from coordinator_service.engine.verification.topic_offsets import KafkaAccess
from coordinator_service.settings import Settings
from coordinator_service.settings.verification import OWN_SETTINGS

NAMES = st.one_of(st.sampled_from(sorted(OWN_SETTINGS | {"security.protocol", "sasl.mechanism"})), st.text(max_size=8))


@given(servers=st.text(max_size=20), options=st.dictionaries(NAMES, st.text(max_size=8), max_size=3))
def test_the_settings_refuse_what_a_verification_refuses(servers: str, options: dict[str, str]) -> None:
    try:
        KafkaAccess(servers, options)
    except InvalidArgument:
        refused = True
    else:
        refused = False
    try:
        Settings(verification_bootstrap_servers=servers, verification_kafka_options=options)
    except ValidationError:
        assert refused, (servers, options)
    else:
        assert not refused, (servers, options)


@pytest.mark.parametrize(
    ("servers", "options"),
    [
        (None, {"security.protocol": "SSL"}),
        ("", {}),
        ("kafka:9092 other:9092", {}),
        ("kafka:9092", {"group.id": "theirs"}),
        ("kafka:9092", {"enable.auto.commit": "true"}),
        ("kafka:9092", {"Security.Protocol": "SSL"}),
        ("kafka:9092", {"sasl.password": "a\x00b"}),
    ],
)
def test_hostile_kafka_settings_are_refused(servers: str | None, options: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match=r"Kafka|bootstrap|VERIFICATION"):
        Settings(verification_bootstrap_servers=servers, verification_kafka_options=options)


def test_the_continuous_step_is_off_and_reads_no_kafka_by_default() -> None:
    settings = Settings()
    assert not settings.verification_enabled and settings.verification_bootstrap_servers is None
