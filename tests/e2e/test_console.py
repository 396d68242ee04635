"""The console in a real browser (headless Chromium) against a real coordinator process with real sinks.

Chromium is Debian's package (`apt-get install chromium`; .ci/run installs it), driven by Playwright. The test
also takes the screenshots docs/operations.md shows: set SINK_CONSOLE_SCREENSHOTS to a directory (docs/images)
to keep them; otherwise they go to the test's temporary directory.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from coordinator_service.contract.client import CoordinatorClient
from tests.fixtures.coordinator import ORDERS, CoordinatorProcess, orders, write_parquet

TOKEN = "console-browser-token-Zq3vX9pL2mN8rT5w"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser() -> Iterator[Browser]:
    if CHROMIUM is None:
        pytest.skip(
            "BROWSER TESTS NOT RUN: no Chromium on PATH. Install Debian's package (apt-get install chromium), "
            "as .ci/run does"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    directory = Path(os.environ.get("SINK_CONSOLE_SCREENSHOTS") or tmp_path / "screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def sink_with_epochs(client: CoordinatorClient, sink: str, table: str, pending: int) -> None:
    """A sink with two committed epochs and `pending` more pre-committed, not checkpointed."""
    registration = client.register_writer(sink, table, -1, arrow_schema=ORDERS.serialize().to_pybytes())
    for epoch in range(2 + pending):
        path = write_parquet(registration.table_location, orders(epoch * 10, 10))
        client.pre_commit(sink, epoch, registration.writer_term, [path], properties={"kafka.end-offsets": "{}"})
        if epoch < 2:
            client.commit_checkpoint(sink, epoch, registration.writer_term, wait=True)


def test_an_operator_goes_through_the_console(
    coordinator_factory: Callable[..., CoordinatorProcess], browser: Browser, screenshots: Path
) -> None:
    coordinator = coordinator_factory(
        SINK_COORDINATOR_ADMIN_TOKEN=TOKEN, SINK_COORDINATOR_ADMIN_READ_REQUIRES_TOKEN="false"
    )
    with coordinator.client(token=TOKEN) as client:
        sink_with_epochs(client, "orders", "shop.orders", pending=2)
        sink_with_epochs(client, "payments", "shop.payments", pending=0)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        # What the browser refused to load or run (the pages' Content-Security-Policy must let them work).
        refused: list[str] = []
        page.expose_function("reportViolation", lambda violation: refused.append(violation))
        page.add_init_script(
            "document.addEventListener('securitypolicyviolation', "
            "(e) => window.reportViolation(`${e.violatedDirective} ${e.blockedURI}`))"
        )
        console = f"{coordinator.http_url}/console"

        # Reads are opened (as the API's are here); the list shows each sink and its lag.
        page.goto(console)
        expect(page.locator("tr[data-sink]")).to_have_count(2)
        expect(page.locator('tr[data-sink="orders"] td').nth(5)).to_have_text("2")  # pending epochs
        expect(page.locator("#role")).to_have_text("read-only")
        # The list refreshes itself: a sink registered now shows up without a reload.
        sink_with_epochs(client, "clicks", "shop.clicks", pending=1)
        expect(page.locator('tr[data-sink="clicks"]')).to_be_visible(timeout=15_000)
        page.screenshot(path=str(screenshots / "console-sinks.png"), full_page=True)

        # Drill down: the timeline, the facts, no action for a reader.
        page.click('tr[data-sink="orders"] a')
        expect(page.locator("h1")).to_contain_text("orders")
        expect(page.locator(".timeline .epoch")).to_have_count(4)
        expect(page.locator(".timeline .epoch.pending")).to_have_count(2)
        expect(page.locator("#read-only")).to_be_visible()
        page.click('table.epochs a:text-is("3")')
        expect(page.locator("h1")).to_contain_text("epoch 3")
        expect(page.locator("table.files td.mono")).to_contain_text("shop/orders/data/")
        expect(page.locator("table.properties")).to_contain_text("kafka.end-offsets")
        page.go_back()

        # A wrong token is refused; the right one makes an operator, back on the same page.
        page.click("#read-only a")
        page.fill('input[name="token"]', "not-the-token")
        page.click('button:text("Sign in")')
        expect(page.locator(".flash.bad")).to_have_text("That is not the admin token.")
        page.fill('input[name="token"]', TOKEN)
        page.click('button:text("Sign in")')
        expect(page.locator("h1")).to_contain_text("orders")
        expect(page.locator("#role")).to_have_text("operator")
        page.screenshot(path=str(screenshots / "console-sink.png"), full_page=True)

        # Abort without force: refused, and the epoch stays PENDING.
        abort = page.locator("#abort-form")
        abort.locator('input[name="epoch"]').fill("3")
        abort.locator('input[name="reason"]').fill("poison record")
        abort.locator('button[type="submit"]').click()
        expect(page.locator(".flash.bad")).to_contain_text("force")
        expect(page.locator('tr[data-epoch="3"] .badge')).to_have_text("PENDING")
        # With force: aborted, recorded with the operator, shown at once.
        abort = page.locator("#abort-form")
        abort.locator('input[name="epoch"]').fill("3")
        abort.locator('input[name="reason"]').fill("poison record")
        abort.locator('input[name="force"]').check()
        abort.locator('button[type="submit"]').click()
        expect(page.locator(".flash.ok")).to_contain_text("epoch 3 aborted")
        expect(page.locator('tr[data-epoch="3"] .badge')).to_have_text("ABORTED")
        expect(page.locator('tr[data-epoch="3"]')).to_contain_text("poison record")

        # Reset: the name must be typed; then the sink is reset.
        reset = page.locator("#reset-form")
        reset.locator('input[name="confirm"]').fill("order")
        reset.locator('input[name="reason"]').fill("checkpoint volume lost")
        reset.locator('button[type="submit"]').click()
        expect(page.locator(".flash.bad")).to_contain_text("confirm must repeat the sink name")
        reset = page.locator("#reset-form")
        reset.locator('input[name="confirm"]').fill("orders")
        reset.locator('input[name="reason"]').fill("checkpoint volume lost")
        reset.locator('button[type="submit"]').click()
        expect(page.locator(".flash.ok")).to_contain_text("sink reset (generation 1)")
        page.screenshot(path=str(screenshots / "console-after-reset.png"), full_page=True)

    coordinator.wait_for_log("epoch aborted by an operator", sink="orders", epoch=3)
    _signed_out(page, console)
    assert refused == [], refused


def _signed_out(page: Page, console: str) -> None:
    """Signing out leaves a reader again."""
    page.goto(console)
    page.click('button:text("Sign out")')
    page.goto(console)
    expect(page.locator("#role")).to_have_text("read-only")


def test_a_newcomer_sees_what_is_wrong_and_cleans_up(
    coordinator_factory: Callable[..., CoordinatorProcess], browser: Browser
) -> None:
    """Issue 26's first hour in the browser: a sink whose writer died shows stalled (it was a green 'healthy'), the
    writer's term and last call, the last commit; a trial sink is deleted from its page; /docs works offline."""
    coordinator = coordinator_factory(SINK_COORDINATOR_STALLED_AFTER_SECONDS="1")
    with coordinator.client() as client:
        client.register_writer("orders-trial", "shop.orders_trial", -1, arrow_schema=ORDERS.serialize().to_pybytes())
        sink_with_epochs(client, "orders", "shop.orders", pending=1)  # then its writer died: no checkpoint comes
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    console = f"{coordinator.http_url}/console"

    page.goto(console)
    row = page.locator('tr[data-sink="orders"]')
    expect(row.locator(".badge")).to_have_text("stalled", timeout=15_000)  # the list refreshes itself
    # Writers' calls reach the log off their path (RECORD_SECONDS apart at most): the sink's page, which does not
    # refresh itself, is opened once the list shows the call.
    expect(row.locator("td.when").first).to_have_text(re.compile(r"^term 1, .+ ago$"), timeout=20_000)
    expect(row.locator("time")).to_have_count(1)  # the last commit, from the log
    expect(page.locator('tr[data-sink="orders-trial"] td').nth(2)).to_have_text("none")
    header = page.get_by_role("columnheader", name="Pending", exact=True)
    assert header.evaluate("th => getComputedStyle(th).textAlign") == "right"

    row.locator("a").first.click()
    expect(page.locator("#stalled")).to_contain_text("its checkpoint has not come")
    expect(page.locator("#writer")).to_contain_text("term 1, last call")

    page.goto(f"{console}/sinks/orders-trial")
    delete = page.locator("#delete-form")
    delete.locator('input[name="confirm"]').fill("orders-trial")
    delete.locator('input[name="reason"]').fill("a trial run")
    delete.locator('button[type="submit"]').click()
    expect(page.locator(".flash.ok")).to_contain_text("sink orders-trial deleted")
    expect(page.locator('tr[data-sink="orders-trial"]')).to_have_count(0)

    page.goto(f"{coordinator.http_url}/docs")  # no network here: Swagger UI must come from the coordinator
    expect(page.get_by_text("/api/v1/sinks/{sink}/delete", exact=True)).to_be_visible(timeout=15_000)
