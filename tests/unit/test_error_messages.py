"""How error messages quote client input and library errors, and how long they may get."""

import psycopg
import sqlalchemy.exc

from coordinator_service.contract.errors import MESSAGE_BYTES, InvalidArgument, cause, quote
from coordinator_service.log.database import unstorable


def test_quote_cuts_client_input_at_200_characters() -> None:
    assert quote("orders\x00") == "'orders\\x00'"
    assert quote("é" * 200) == repr("é" * 200)
    assert quote("x" * 10_000) == repr("x" * 200) + "... (10000 characters)"


def test_cause_is_the_first_line_of_the_drivers_error() -> None:
    wrapped = sqlalchemy.exc.DataError(
        "SELECT ... WHERE name = %(name)s", {"name": "secret input"}, psycopg.DataError("value too long\nDETAIL: x")
    )
    assert cause(wrapped) == "value too long"
    assert cause(OSError("y" * 500)) == "y" * 200 + "... (500 characters)"
    assert unstorable(wrapped).message == "the request holds a value that cannot be stored: value too long"


def test_messages_fit_a_grpc_trailer() -> None:
    message = InvalidArgument("┃" * 5000).message  # three bytes each, nine once percent-encoded
    assert len(message.encode()) <= MESSAGE_BYTES
    assert message.endswith(" ... (message cut)")
    assert InvalidArgument("short").message == "short"
