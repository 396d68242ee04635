"""The console over HTTP: who sees and who acts, the session cookie, CSRF, and actions recorded as the API's.

The same runtime and app as the admin API's tests; what a browser does with the pages is tests/e2e/test_console.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from coordinator_service.admin import console_routes
from coordinator_service.admin.console_session import COOKIE
from coordinator_service.engine.writer_requests import PreCommitRequest, TableRequest
from tests.fixtures.admin import CLIENT_ADDRESS, AdminApp, AdminFactory, eventually, sink_id_of
from tests.fixtures.coordinator import ORDERS, orders, write_parquet
from tests.fixtures.postgres import query

TOKEN = "console-test-token-Zq3vX9pL2mN8rT5wY7bC"


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


@pytest.fixture
async def browser_of() -> AsyncIterator[list[httpx.AsyncClient]]:
    """httpx clients that keep cookies over https, as a browser does (the console's cookie is Secure)."""
    opened: list[httpx.AsyncClient] = []
    yield opened
    for client in opened:
        await client.aclose()


def browser(admin: AdminApp, opened: list[httpx.AsyncClient]) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=admin.app, client=CLIENT_ADDRESS)
    client = httpx.AsyncClient(transport=transport, base_url="https://coordinator")
    opened.append(client)
    return client


async def sink_with_pending_epochs(admin: AdminApp) -> None:
    registration = await admin.register("orders")
    await admin.pre_commit("orders", registration, 0, 0)
    await admin.checkpoint("orders", registration, 0)
    await admin.pre_commit("orders", registration, 1, 10)
    await admin.pre_commit("orders", registration, 2, 20)


async def test_reads_are_open_where_the_api_reads_are_and_acting_needs_the_token(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient], database_url: str
) -> None:
    admin = await admin_factory(admin_token=TOKEN, admin_read_requires_token=False)
    await sink_with_pending_epochs(admin)
    client = browser(admin, browser_of)

    listing = await client.get("/console")
    assert listing.status_code == 200
    assert 'data-sink="orders"' in listing.text and "read-only" in listing.text
    page = await client.get("/console/sinks/orders")
    assert page.status_code == 200 and 'id="abort-form"' not in page.text and 'id="read-only"' in page.text

    refused = await client.post("/console/sinks/orders/abort", data={"epoch": "2", "reason": "x", "force": "true"})
    assert refused.status_code == 303 and refused.headers["location"].startswith("/console/login")
    assert query(database_url, "SELECT status FROM pending_sink_state WHERE epoch = 2") == [("PENDING",)]


async def test_signing_in_makes_an_operator_whose_abort_is_recorded_as_the_apis(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient], database_url: str
) -> None:
    admin = await admin_factory(admin_token=TOKEN)
    await sink_with_pending_epochs(admin)
    client = browser(admin, browser_of)

    wrong = await client.post("/console/login", data={"token": "guess", "next": "/console/sinks/orders"})
    assert wrong.status_code == 401 and "not the admin token" in wrong.text
    signed = await client.post("/console/login", data={"token": TOKEN, "next": "/console/sinks/orders"})
    assert signed.status_code == 303 and signed.headers["location"] == "/console/sinks/orders"
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and TOKEN not in cookie
    assert {"HttpOnly", "Secure", "SameSite=strict"} <= {part.strip() for part in cookie.split(";")}

    page = await client.get("/console/sinks/orders")
    assert 'id="abort-form"' in page.text
    without_force = await client.post(
        "/console/sinks/orders/abort", data={"epoch": "2", "reason": "poison", "csrf": csrf_of(page)}
    )
    assert without_force.status_code == 409 and "force" in without_force.text
    done = await client.post(
        "/console/sinks/orders/abort",
        data={"epoch": "2", "reason": "poison", "force": "true", "csrf": csrf_of(page)},
    )
    assert done.status_code == 303
    assert "epoch 2 aborted" in (await client.get(done.headers["location"])).text
    [(status, reason, cause)] = query(
        database_url, "SELECT status, reason, abort_cause FROM pending_sink_state WHERE epoch = 2"
    )
    assert (status, cause) == ("ABORTED", "OPERATOR")
    assert "poison" in reason and f"admin from {CLIENT_ADDRESS[0]}" in reason


async def test_an_action_without_the_sessions_csrf_token_changes_nothing(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient], database_url: str
) -> None:
    admin = await admin_factory()  # no admin token: everyone is an operator, as with the API
    await sink_with_pending_epochs(admin)
    client = browser(admin, browser_of)
    await client.get("/console/sinks/orders")  # a session with its own CSRF token

    for sent in ({}, {"csrf": "forged"}):
        refused = await client.post("/console/sinks/orders/reset", data={"confirm": "orders", "reason": "x", **sent})
        assert refused.status_code == 403 and "CSRF" in refused.text
    assert query(database_url, "SELECT generation FROM sinks WHERE name = 'orders'") == [(0,)]


async def test_a_reset_needs_the_typed_name_and_says_what_it_did(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient], database_url: str
) -> None:
    admin = await admin_factory()
    await sink_with_pending_epochs(admin)
    client = browser(admin, browser_of)
    page = await client.get("/console/sinks/orders")

    reasonless = await client.post(
        "/console/sinks/orders/reset", data={"confirm": "orders", "reason": "  ", "csrf": csrf_of(page)}
    )
    assert reasonless.status_code == 422 and "give the reason for the reset" in reasonless.text
    mistyped = await client.post(
        "/console/sinks/orders/reset", data={"confirm": "order", "reason": "lost", "csrf": csrf_of(page)}
    )
    assert mistyped.status_code == 422 and "confirm must repeat the sink name" in mistyped.text
    assert query(database_url, "SELECT generation FROM sinks WHERE name = 'orders'") == [(0,)]
    done = await client.post(
        "/console/sinks/orders/reset", data={"confirm": "orders", "reason": "lost", "csrf": csrf_of(page)}
    )
    assert done.status_code == 303
    assert "sink reset (generation 1)" in (await client.get(done.headers["location"])).text
    assert query(database_url, "SELECT generation FROM sinks WHERE name = 'orders'") == [(1,)]


async def test_with_reads_closed_the_console_asks_to_sign_in_first(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient]
) -> None:
    admin = await admin_factory(admin_token=TOKEN)  # reads need the token by default
    client = browser(admin, browser_of)

    listing = await client.get("/console")
    assert listing.status_code == 303 and listing.headers["location"].startswith("/console/login")
    assert (await client.get("/console/sinks-table")).status_code == 401
    assert (await client.get("/console/sinks/orders")).status_code == 303
    # A sign-in never sends the browser off the console.
    signed = await client.post("/console/login", data={"token": TOKEN, "next": "https://elsewhere.example/x"})
    assert signed.headers["location"] == "/console"


async def test_the_list_sorts_and_filters(admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient]) -> None:
    admin = await admin_factory()
    for name in ("alpha", "beta", "gamma"):
        registration = await admin.register(name, table=f"db.{name}")
        for epoch in range({"alpha": 1, "beta": 3, "gamma": 2}[name]):
            await admin.pre_commit(name, registration, epoch, epoch * 10)
    client = browser(admin, browser_of)

    def order(page: httpx.Response) -> list[str]:
        return re.findall(r'data-sink="([^"]+)"', page.text)

    assert order(await client.get("/console?sort=pending&desc=true")) == ["beta", "gamma", "alpha"]
    assert order(await client.get("/console?sort=sink&desc=true")) == ["gamma", "beta", "alpha"]
    assert order(await client.get("/console?q=MM")) == ["gamma"]
    assert order(await client.get("/console/sinks-table?state=lagging&sort=sink")) == ["alpha", "beta", "gamma"]
    assert order(await client.get("/console?state=stuck")) == []


async def test_the_list_is_paged_after_sorting_and_filtering_all_sinks(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = await admin_factory()
    for name in ("a", "b", "c", "d", "e"):
        await admin.register(name, table=f"db.{name}")
    monkeypatch.setattr(console_routes, "PAGE_ROWS", 2)
    client = browser(admin, browser_of)

    def shown(page: httpx.Response) -> list[str]:
        return re.findall(r'data-sink="([^"]+)"', page.text)

    first = await client.get("/console?sort=sink&desc=true")
    assert shown(first) == ["e", "d"] and "sinks 1 to 2 of 5" in first.text and 'rel="next"' in first.text
    last = await client.get("/console?sort=sink&desc=true&page=3")
    assert shown(last) == ["a"] and "sinks 5 to 5 of 5" in last.text and 'rel="next"' not in last.text
    # The refresh redraws the page it was loaded for.
    assert "page=3" in re.findall(r'hx-get="([^"]+)"', last.text)[0]
    assert shown(await client.get("/console/sinks-table?sort=sink&desc=true&page=2")) == ["c", "b"]
    assert shown(await client.get("/console?page=99")) == ["e"]  # beyond the last page: the last page


async def test_a_fan_out_sinks_tables_are_listed_with_their_state(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient]
) -> None:
    admin = await admin_factory()
    registration = await admin.register("orders")
    schema = ORDERS.serialize().to_pybytes()
    await admin.runtime.coordinator.ensure_tables(
        "orders", registration.writer_term, [TableRequest("db.eu", schema), TableRequest("db.us", schema)]
    )
    client = browser(admin, browser_of)

    listing = await client.get("/console")
    assert re.search(r'db\.orders <span class="muted" title="db\.eu db\.us ">\+2 tables</span>', listing.text)
    page = await client.get("/console/sinks/orders")
    assert re.findall(r'data-table="([^"]+)"', page.text) == ["db.orders", "db.eu", "db.us"]


async def test_the_done_banner_shows_only_what_an_action_said(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient]
) -> None:
    admin = await admin_factory()
    await sink_with_pending_epochs(admin)
    client = browser(admin, browser_of)

    forged = await client.get("/console/sinks/orders", params={"done": "Sink verified. Call +1 555 0100 now"})
    assert forged.status_code == 200
    assert "555 0100" not in forged.text and 'class="flash ok"' not in forged.text
    done = await client.post(
        "/console/sinks/orders/abort",
        data={"epoch": "2", "reason": "poison", "force": "true", "csrf": csrf_of(forged)},
    )
    assert done.status_code == 303
    shown = await client.get(done.headers["location"])
    assert '<p class="flash ok" role="status">epoch 2 aborted' in shown.text


async def test_signing_out_ends_the_session_for_every_copy_of_its_cookie(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient], database_url: str
) -> None:
    admin = await admin_factory(admin_token=TOKEN, admin_read_requires_token=False)
    await sink_with_pending_epochs(admin)
    client = browser(admin, browser_of)
    signed = await client.post("/console/login", data={"token": TOKEN, "next": "/console/sinks/orders"})
    assert signed.status_code == 303
    page = await client.get("/console/sinks/orders")
    assert 'id="abort-form"' in page.text
    copied_cookie, csrf = client.cookies[COOKIE], csrf_of(page)

    signed_out = await client.post("/console/logout", data={"csrf": csrf})
    assert signed_out.status_code == 303

    replayed = browser(admin, browser_of)  # the cookie as it was, from another browser (or a stolen copy)
    copy = {"Cookie": f"{COOKIE}={copied_cookie}"}
    again = await replayed.get("/console/sinks/orders", headers=copy)
    assert again.status_code == 200 and 'id="abort-form"' not in again.text
    refused = await replayed.post(
        "/console/sinks/orders/abort",
        data={"epoch": "2", "reason": "after sign-out", "force": "true", "csrf": csrf},
        headers=copy,
    )
    assert refused.status_code == 303 and refused.headers["location"].startswith("/console/login")
    assert query(database_url, "SELECT status FROM pending_sink_state WHERE epoch = 2") == [("PENDING",)]


def row_of(page: httpx.Response, sink: str) -> str:
    found = re.search(rf'<tr [^>]*data-sink="{re.escape(sink)}">(.*?)</tr>', page.text, re.DOTALL)
    assert found is not None, f"no row of {sink}"
    return found.group(1)


async def test_the_list_shows_liveness_stalls_last_commits_and_shared_tables(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient], database_url: str
) -> None:
    """Issue 26.5: every row was a green 'healthy' even with its writer dead, and the last commit a dash on every
    replica but the one that made it. Issue 26.4: nothing said that two sinks write one table. Issue 26.12: -1 for
    none, numbers misaligned under their headers."""
    first = await admin_factory()
    await sink_with_pending_epochs(first)  # orders: epoch 0 committed, 1 and 2 pending
    narrower = pa.schema([pa.field("order_id", pa.int64(), nullable=False)]).serialize().to_pybytes()
    await first.runtime.coordinator.register_writer("orders-replay", "db.orders", -1, arrow_schema=narrower)
    query(database_url, "UPDATE sinks SET writer_last_call_at = now() - interval '42 seconds' WHERE name = 'orders'")
    query(database_url, "UPDATE pending_sink_state SET updated_at = now() - interval '1 hour' WHERE epoch = 1")
    other = await admin_factory(stalled_after_seconds=600)  # another replica: it committed nothing
    client = browser(other, browser_of)

    page = await client.get("/console")
    orders_row, replay_row = row_of(page, "orders"), row_of(page, "orders-replay")
    assert '<span class="badge stalled"' in orders_row
    assert re.search(r"term 1, 4\d s ago", orders_row)  # 42 s, as the page is drawn
    assert re.search(r"<time [^>]*>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</time>", orders_row)  # the log's last commit
    assert "shared with orders-replay" in orders_row and "shared with orders<" in replay_row
    assert ">none<" in replay_row and ">-1<" not in replay_row  # nothing checkpointed or committed yet
    assert "no call" in replay_row
    headers = re.findall(r"<th( class=\"num\")?>(?:<a [^>]*>)?([^<]+)", page.text)
    numeric = {label for css, label in headers if css}
    assert numeric == {"Checkpointed", "Committed", "Lag (epochs)", "Pending", "Oldest pending"}
    assert re.findall(r'data-sink="([^"]+)"', (await client.get("/console?state=stalled")).text) == ["orders"]

    sink_page = await client.get("/console/sinks/orders")
    assert re.search(r"epoch 1 was pre-committed 36\d\d s ago and its checkpoint has not come", sink_page.text)
    assert re.search(r"term 1, last call 4\d s ago", sink_page.text)
    assert "also written by orders-replay" in sink_page.text
    epochs_header = re.search(r'<table class="epochs">\s*<thead>(.*?)</thead>', sink_page.text, re.DOTALL)
    assert epochs_header is not None
    assert re.findall(r'<th class="num">([^<]+)</th>', epochs_header.group(1)) == ["Attempt", "Files", "Records"]
    epoch_page = await client.get("/console/sinks/orders/epochs/1")
    assert re.findall(r'<th class="num">([^<]+)</th>', epoch_page.text) == ["Records", "Bytes", "Writer"]


async def test_an_epochs_valid_through_time_is_a_time(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient]
) -> None:
    admin = await admin_factory()
    registration = await admin.register("orders")
    path = write_parquet(registration.table_location, orders(0, 10))
    properties = {"kafka.valid-through-ms": "1764081234567", "kafka.end-offsets": '{"orders": {"0": 10}}'}
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest("orders", 0, registration.writer_term, (path,), properties=properties)
    )
    page = await browser(admin, browser_of).get("/console/sinks/orders/epochs/0")
    assert "1764081234567 (2025-11-25 14:33:54.567 UTC)" in page.text


async def test_a_refused_abort_says_what_to_do_in_the_forms_words_and_keeps_the_form(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient]
) -> None:
    admin = await admin_factory()
    await sink_with_pending_epochs(admin)
    client = browser(admin, browser_of)
    page = await client.get("/console/sinks/orders")

    refused = await client.post(
        "/console/sinks/orders/abort", data={"epoch": "2", "reason": "poison <b>", "csrf": csrf_of(page)}
    )
    assert refused.status_code == 409
    assert "force=true" not in refused.text and "Tick “force: give its records up”" in refused.text
    form = re.search(r'<form [^>]*id="abort-form".*?</form>', refused.text, re.DOTALL)
    assert form is not None
    assert 'name="epoch" min="0" required value="2"' in form.group(0)
    assert 'value="poison &lt;b&gt;"' in form.group(0)


async def test_an_operator_deletes_a_sink_from_its_page(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient], database_url: str
) -> None:
    """Issue 26.10: a typo or a trial run stayed in every list and metric forever."""
    admin = await admin_factory()
    await sink_with_pending_epochs(admin)
    query(database_url, "UPDATE sinks SET writer_last_call_at = now() - interval '1 hour'")
    client = browser(admin, browser_of)
    page = await client.get("/console/sinks/orders")
    assert 'id="delete-form"' in page.text

    mistyped = await client.post(
        "/console/sinks/orders/delete", data={"confirm": "order", "reason": "trial", "csrf": csrf_of(page)}
    )
    assert mistyped.status_code == 422 and "confirm must repeat the sink name" in mistyped.text
    assert 'name="confirm" required autocomplete="off" value="order"' in mistyped.text
    assert query(database_url, "SELECT count(*) FROM sinks") == [(1,)]
    done = await client.post(
        "/console/sinks/orders/delete", data={"confirm": "orders", "reason": "trial", "csrf": csrf_of(page)}
    )
    assert done.status_code == 303 and done.headers["location"].startswith("/console?")
    listing = await client.get(done.headers["location"])
    assert '<p class="flash ok" role="status">sink orders deleted: 2 epochs given up (20 records)' in listing.text
    assert 'data-sink="orders"' not in listing.text
    assert query(database_url, "SELECT count(*) FROM sinks") == [(0,)]


async def test_a_fan_out_table_dropped_for_good_is_shown_and_removed_from_the_sinks_page(
    admin_factory: AdminFactory, browser_of: list[httpx.AsyncClient], database_url: str, catalog: Catalog
) -> None:
    """A fan-out table dropped from its catalog wedges its sink: the page says so for that table and offers the way
    out (the API's remove), typed confirmation, CSRF and sign-in as for the reset."""
    admin = await admin_factory(admin_token=TOKEN, admin_read_requires_token=False)
    registration = await admin.register("orders")
    schema = ORDERS.serialize().to_pybytes()
    ensured = await admin.runtime.coordinator.ensure_tables(
        "orders", registration.writer_term, [TableRequest("db.eu", schema)]
    )
    own = write_parquet(registration.table_location, orders(0, 10))
    routed = write_parquet(ensured.tables[0].location, orders(100, 10))
    await admin.runtime.coordinator.pre_commit(
        PreCommitRequest("orders", 0, registration.writer_term, (own, routed), file_tables={routed: "db.eu"})
    )
    catalog.drop_table("db.eu")
    await admin.checkpoint("orders", registration, 0, wait=False)
    sink_id = sink_id_of(database_url, "orders")

    async def stuck_on_eu() -> bool:
        health = admin.runtime.committer.health.get(sink_id)
        return health is not None and health.stuck is not None and "db.eu" in health.failing_tables

    await eventually(stuck_on_eu, "the committer stuck on the dropped table")
    reader = browser(admin, browser_of)
    shown = await reader.get("/console/sinks/orders")
    row = re.search(r'<tr data-table="db\.eu">.*?</tr>', shown.text, re.S)
    assert row is not None and "dropped from the catalog" in row.group(0)
    assert 'id="remove-table-form-db.eu"' not in shown.text  # read-only: no way to act
    refused = await reader.post(
        "/console/sinks/orders/tables/db.eu/remove", data={"confirm": "db.eu", "reason": "gone"}
    )
    assert refused.status_code == 303 and refused.headers["location"].startswith("/console/login")

    operator = browser(admin, browser_of)
    await operator.post("/console/login", data={"token": TOKEN, "next": "/console/sinks/orders"})
    page = await operator.get("/console/sinks/orders")
    form = re.search(r'<form[^>]*id="remove-table-form-db.eu".*?</form>', page.text, re.S)
    assert form is not None and 'action="/console/sinks/orders/tables/db.eu/remove"' in form.group(0)
    remove = "/console/sinks/orders/tables/db.eu/remove"
    forged = await operator.post(remove, data={"confirm": "db.eu", "reason": "gone", "csrf": "forged"})
    assert forged.status_code == 403 and "CSRF" in forged.text
    mistyped = await operator.post(remove, data={"confirm": "db.e", "reason": "gone", "csrf": csrf_of(page)})
    assert mistyped.status_code == 422 and "confirm must repeat the table name" in mistyped.text
    assert 'name="confirm" required autocomplete="off" value="db.e"' in mistyped.text
    own_table = await operator.post(
        "/console/sinks/orders/tables/db.orders/remove",
        data={"confirm": "db.orders", "reason": "gone", "csrf": csrf_of(page)},
    )
    assert own_table.status_code == 409 and "cannot be removed from the sink" in own_table.text
    for hostile, status in (("db.nope", 404), ("..%2Fdb.eu", 404), ("db." + "x" * 600, 422), ("db.eu%00", 422)):
        answer = await operator.post(
            f"/console/sinks/orders/tables/{hostile}/remove",
            data={"confirm": hostile, "reason": "gone", "csrf": csrf_of(page)},
        )
        assert answer.status_code == status, (hostile, answer.text)
    assert query(database_url, "SELECT table_identifier FROM sink_tables ORDER BY 1") == [("db.eu",), ("db.orders",)]

    done = await operator.post(
        remove, data={"confirm": "db.eu", "reason": "dropped by its owners", "csrf": csrf_of(page)}
    )
    assert done.status_code == 303
    after = await operator.get(done.headers["location"])
    assert (
        '<p class="flash ok" role="status">table db.eu removed from sink orders: 1 epoch given up (10 records)'
        in after.text
    )
    assert re.findall(r'data-table="([^"]+)"', after.text) == []  # its own table alone: no fan-out list
    assert query(database_url, "SELECT table_identifier FROM sink_tables") == [("db.orders",)]
