"""The inspector (``/ui/``) in a real headless browser: Debian's ``chromium``
driven by ``chromedriver`` through selenium, against the real service and the
scripted upstream.

The service runs on this test's event loop, so every browser step (blocking
WebDriver calls) runs in a worker thread (``await browse(...)``) while the loop
keeps serving the page's requests. Waits are WebDriverWait conditions.

Without chromium the tests are skipped, unless ``CI`` is set: then a missing
browser is a failure (``.ci/run`` installs it). Screenshots go to
``bench-artifacts/ui/`` (``TURNLOG_UI_ARTIFACTS`` to change it); their paths
are printed in the log.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from tests.harness import Service, make_settings, start_service, stop_service
from tests.pg import unavailable
from tests.tools_fixtures import write_tools
from tests.upstream import Reply, ScriptedUpstream

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("TURNLOG_UI_ARTIFACTS") or ROOT / "bench-artifacts" / "ui")
USER = [{"role": "user", "content": "Add some numbers for me"}]
ANSWER = "The first sum is 5, the second is 42, and the third tool call failed. That is all I could do for you today."
WAIT = 15  # seconds: a WebDriverWait's limit (never reached when the page works)
#: axe-core, vendored (tests/vendor/axe-core/README.md): the file and its published hash.
AXE = ROOT / "tests" / "vendor" / "axe-core" / "axe.min.js"
AXE_SHA256 = "KTSJmUUM3yhJqOcLeRL8LahahJ2jnA0NU5T1HUqe2Vw="


# ---------------------------------------------------------------- the browser


def _browser_paths() -> tuple[str, str] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    paths = _browser_paths()
    if paths is None:
        unavailable("chromium and chromedriver are not installed (apt-get install -y chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service as DriverService
    except ImportError:
        unavailable("selenium is not installed (pip install -e '.[test]')")
    chromium, chromedriver = paths
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    # An explicit driver path: Selenium Manager never looks for (or downloads) one.
    driver = webdriver.Chrome(options=options, service=DriverService(executable_path=chromedriver))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


async def browse(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking browser steps off the loop (which serves the page meanwhile)."""
    return await asyncio.to_thread(fn, *args)


def wait(driver: Any, condition: Callable[[Any], Any], message: str | Callable[[], str] = "") -> Any:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(condition)
    except TimeoutException as exc:
        raise AssertionError(f"waited {WAIT} s for: {message() if callable(message) else message}") from exc


def css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def text_of(driver: Any, selector: str) -> str:
    found = texts(driver, selector)
    return found[0] if found else ""


def texts(driver: Any, selector: str) -> list[str]:
    """The text of every match, read in one script (no stale element between finding and reading)."""
    return list(driver.execute_script("return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", selector))


def log_line(request: pytest.FixtureRequest, line: str) -> None:
    """A line in the test log, whatever the capture mode."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        print(line)


def shows(selector: str, needle: str = "") -> Callable[[Any], bool]:
    return lambda d: needle in text_of(d, selector) and bool(all_css(d, selector))


def screenshot(driver: Any, request: pytest.FixtureRequest, name: str, width: int, at: str | None = None) -> Path:
    """A PNG at this width (the whole page, or one screen from the element
    ``at``); its path is printed in the test log."""
    driver.set_window_size(width, 900)
    if at is not None:
        driver.execute_script("document.querySelector(arguments[0]).scrollIntoView()", at)
    else:
        height = int(driver.execute_script("window.scrollTo(0, 0); return Math.max(document.body.scrollHeight, 900)"))
        # a phone: its first screens; a desktop: the whole page
        driver.set_window_size(width, min(height + 120, 1800 if width < 600 else 5000))
        driver.execute_script("window.scrollTo(0, 0)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}-{width}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 900)
    log_line(request, f"inspector screenshot: {path}")
    return path


def unlabelled_controls(driver: Any) -> list[str]:
    """Form controls and buttons without an accessible name (a label, aria-label or text)."""
    return list(
        driver.execute_script("""
        return [...document.querySelectorAll('input, select, button, a[href]')]
          .filter(el => el.offsetParent !== null || el.type === 'range')
          .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.textContent.trim())
          .map(el => el.outerHTML.slice(0, 120));
    """)
    )


def serious_violations(driver: Any) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now
    (the WebDriver injects it: the page's own CSP does not apply to that)."""
    source = AXE.read_bytes()
    assert base64.b64encode(hashlib.sha256(source).digest()).decode() == AXE_SHA256, "the vendored axe.min.js is not the pinned one"
    driver.execute_script(source.decode())
    driver.set_script_timeout(60)
    found: list[dict[str, Any]] = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        axe.run(document, { resultTypes: ['violations'] }).then(
          (r) => done(r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 5).map((n) => n.target.join(' ')) }))),
          (e) => done([{ id: 'axe-error', impact: 'critical', help: String(e), nodes: [] }]));
    """)
    return [f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}" for v in found if v["impact"] in ("serious", "critical")]


def overflows(driver: Any) -> int:
    """How far the page is wider than the window (a sideways scroll), in CSS pixels."""
    return int(driver.execute_script("return document.documentElement.scrollWidth - document.documentElement.clientWidth"))


def only_local_resources(driver: Any, base: str) -> None:
    """Everything the page loaded came from turnlog itself."""
    urls = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    foreign = [u for u in urls if not u.startswith(base) and not u.startswith("data:")]
    assert not foreign, f"the page loaded from elsewhere: {foreign}"


# ---------------------------------------------------------------- the service


@pytest.fixture
async def tools_service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Service]:
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    tools = write_tools(tmp_path / "tools")
    settings = make_settings(tmp_path, upstream.url, tools_dir=str(tools), tool_timeout=2.0, database_url=database_url, flush_max_chunks=2)
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


def call(name: str, arguments: object, id: str) -> dict[str, Any]:
    return {"name": name, "arguments": arguments, "id": id}


async def tool_turn(service: Service, **extra: Any) -> str:
    """Three model calls: two tool rounds (one call failing), then the answer."""
    service.upstream.enqueue(
        Reply(tool_calls=[call("add", {"a": 2, "b": 3}, "call_add1")], finish_reason="tool_calls"),
        Reply(tool_calls=[call("add", {"a": 20, "b": 22}, "call_add2"), call("explode", {"reason": "on purpose"}, "call_boom")], finish_reason="tool_calls"),
        Reply(text=ANSWER, chunk_size=4),
    )
    status, body, headers = await service.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "tool_ids": ["weather"], **extra})
    assert status == 200, body
    return headers["X-Turn-Id"]


async def start_running(service: Service, text: str, pause_after: int) -> tuple[str, asyncio.Task[str]]:
    """A streamed turn held open by the upstream (paused after ``pause_after``
    chunks, until ``upstream.release()``); the task reads its stream to the end."""
    service.upstream.enqueue(Reply(text=text, chunk_size=4, pause_after=pause_after))
    response = await service.http.post(service.v1 + "/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
    turn_id = response.headers["X-Turn-Id"]

    async def read() -> str:
        async with response:
            return await response.text()

    task = asyncio.create_task(read())
    await asyncio.wait_for(service.upstream.paused.wait(), 10)
    # the text before the pause is in the log (a delta window is flushed within flush_interval)
    for _ in range(500):
        if any(e["type"] == "model.delta" for e in await service.events(turn_id)):
            break
        await asyncio.sleep(0.01)
    return turn_id, task


# ---------------------------------------------------------------- tests


async def test_list_then_a_tool_turn_its_answer_calls_replay_verify_and_receipt(tools_service: Service, browser: Any, request: pytest.FixtureRequest) -> None:
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    svc = tools_service
    turn_id = await tool_turn(svc)
    svc.upstream.enqueue(Reply(text="plain"))
    status, _, headers = await svc.post("/v1/chat/completions", {"model": "gpt-other", "messages": USER})
    assert status == 200
    other_id = headers["X-Turn-Id"]
    svc.upstream.enqueue(Reply(status=500, error_message="upstream on fire"))
    status, _, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 502
    failed_id = headers["X-Turn-Id"]
    events = await svc.events(turn_id)
    view = await svc.turn(turn_id)
    assert view["content"] == ANSWER
    deltas = [e["seq"] for e in events if e["type"] == "model.delta"]
    assert len(deltas) >= 4, "the answer should be several delta windows"
    middle = deltas[len(deltas) // 2]
    verify_status = (await svc.get(f"/v1/turns/{turn_id}/verify"))[0]
    receipt_status = (await svc.get(f"/v1/turns/{turn_id}/receipt"))[0]

    def the_list(driver: Any) -> None:
        driver.get(svc.url + "/ui/")
        wait(driver, lambda d: len(texts(d, "#turns-table tbody tr")) == 3, "the three turns are listed")
        rows = texts(driver, "#turns-table tbody tr")
        # newest first
        assert failed_id in rows[0] and other_id in rows[1] and turn_id in rows[2], rows
        assert "failed" in rows[0] and "gpt-other" in rows[1]
        # the chats list is fetched on its own: wait for it as for the turns
        wait(driver, lambda d: len(all_css(d, "#chats-list li")) == 3, "the three chats are listed")
        screenshot(driver, request, "list", 1280)
        screenshot(driver, request, "list", 390)
        # filter by status, then by model (the filter is in the URL: a reload keeps it)
        Select(css(driver, "#f-status")).select_by_value("failed")
        wait(
            driver,
            lambda d: texts(d, "#turns-table tbody tr") == [t for t in texts(d, "#turns-table tbody tr") if failed_id in t] != [],
            "the failed turn only",
        )
        assert "status=failed" in driver.current_url
        Select(css(driver, "#f-status")).select_by_value("")
        wait(driver, lambda d: len(texts(d, "#turns-table tbody tr")) == 3)
        wait(driver, lambda d: len(texts(d, "#f-model option")) == 3, lambda: f"the models in use are offered: {texts(driver, '#f-model option')}")
        Select(css(driver, "#f-model")).select_by_value("gpt-other")
        wait(driver, lambda d: len(texts(d, "#turns-table tbody tr")) == 1 and other_id in text_of(d, "#turns-table tbody"))
        Select(css(driver, "#f-model")).select_by_value("")
        wait(driver, lambda d: len(texts(d, "#turns-table tbody tr")) == 3)
        only_local_resources(driver, svc.url)
        assert not unlabelled_controls(driver)
        # open the tool turn from the list, by keyboard
        link = [r for r in all_css(driver, "#turns-table tbody tr") if turn_id in r.get_attribute("textContent")][0]
        link.find_element("css selector", "a.turn-link").send_keys(Keys.ENTER)
        wait(driver, lambda d: d.current_url.endswith(f"/ui/turns/{turn_id}"))

    await browse(the_list, browser)

    def the_turn(driver: Any) -> None:
        wait(driver, shows("#answer-text", ANSWER), "the answer")
        tools = all_css(driver, "#tool-list > li")
        assert len(tools) == 3
        first = tools[0].get_attribute("textContent")
        assert "add" in first and "completed" in first
        assert json.loads(tools[0].find_element("css selector", ".tool-args").get_attribute("textContent")) == {"a": 2, "b": 3}
        assert tools[0].find_element("css selector", ".tool-result").get_attribute("textContent") == "5"
        assert tools[1].find_element("css selector", ".tool-result").get_attribute("textContent") == "42"
        boom = tools[2].get_attribute("textContent")
        assert "explode" in boom and "failed" in boom and "kaboom: on purpose" in boom
        assert " ms" in first  # its duration
        # the failure stands out, on top and in the timeline
        assert "kaboom: on purpose" in text_of(driver, "#problem-list")
        assert all_css(driver, "#timeline li.ev.bad[data-type='tool.completed']")
        assert text_of(driver, "#iterations") == "3"
        # the timeline: every event, with its seq, type and the state after it
        rows = all_css(driver, "#timeline > li")
        assert [int(r.get_attribute("data-seq")) for r in rows] == [e["seq"] for e in events]
        assert rows[-1].get_attribute("data-type") == "turn.completed"
        assert "done" in rows[-1].find_element("css selector", ".ev-state").get_attribute("textContent")
        # a model request shows the messages it sent, as text
        second = [r for r in rows if r.get_attribute("data-type") == "model.requested"][1]
        second.find_element("css selector", "summary").send_keys(Keys.ENTER)
        wait(driver, lambda d: "Add some numbers for me" in second.find_element("css selector", ".ev-detail").get_attribute("textContent"))
        detail = second.find_element("css selector", ".ev-detail").get_attribute("textContent")
        assert "call_add1" in detail and "tool" in detail
        screenshot(driver, request, "turn", 1280)
        screenshot(driver, request, "turn", 390)
        screenshot(driver, request, "turn-timeline", 390, at="#timeline-h")

        # scrub to the middle of the answer: a prefix of it
        driver.execute_script("const s = document.getElementById('replay-seq'); s.value = arguments[0]; s.dispatchEvent(new Event('input'));", middle)
        wait(driver, lambda d: css(d, "#replay-text").get_attribute("data-seq") == str(middle), "the replay at the middle seq")
        prefix = css(driver, "#replay-text").get_attribute("textContent")
        assert prefix and ANSWER.startswith(prefix) and len(prefix) < len(ANSWER), prefix
        # one step back by keyboard: a shorter (or equal) prefix
        css(driver, "#replay-seq").send_keys(Keys.ARROW_LEFT)
        wait(driver, lambda d: css(d, "#replay-text").get_attribute("data-seq") == str(middle - 1))
        assert ANSWER.startswith(css(driver, "#replay-text").get_attribute("textContent"))
        assert len(css(driver, "#replay-text").get_attribute("textContent")) <= len(prefix)
        css(driver, "#replay-seq").send_keys(Keys.END)
        wait(driver, lambda d: css(d, "#replay-text").get_attribute("textContent") == ANSWER, "the whole answer at the end")

        # verify and receipt: the result, or a clear "not available" where the server has none
        css(driver, "#verify-btn").click()
        wait(driver, lambda d: all_css(d, "#verify-result"))
        css(driver, "#receipt-btn").click()
        wait(driver, lambda d: all_css(d, "#receipt-result"))
        verify_state = css(driver, "#verify-result").get_attribute("data-state")
        receipt_state = css(driver, "#receipt-result").get_attribute("data-state")
        if verify_status == 404:
            assert verify_state == "unavailable" and "Not available" in text_of(driver, "#verify-result")
        else:
            assert verify_state == "ok", text_of(driver, "#verify")
        if receipt_status == 404:
            assert receipt_state == "unavailable" and "Not available" in text_of(driver, "#receipt-result")
        else:
            assert receipt_state == "ok" and "Head" in text_of(driver, "#receipt-result")
        assert "does not prove the model" in text_of(driver, "#main")  # what verify proves, in plain words
        screenshot(driver, request, "turn-verify", 1280)
        only_local_resources(driver, svc.url)
        assert not unlabelled_controls(driver)

    await browse(the_turn, browser)


@pytest.mark.sqlite_only
async def test_a_running_turn_grows_live_then_another_is_cancelled_from_the_page(tools_service: Service, browser: Any, request: pytest.FixtureRequest) -> None:
    svc = tools_service
    text = "Counting slowly: one, two, three, four, five, six, seven, eight, nine, ten. Done."
    turn_id, reader = await start_running(svc, text, pause_after=5)
    before = (await svc.turn(turn_id))["content"]
    assert before and text.startswith(before) and before != text

    def open_running(driver: Any) -> None:
        driver.get(f"{svc.url}/ui/turns/{turn_id}")
        wait(driver, shows("#answer-text", before), "the text so far")
        assert "running" in text_of(driver, "#turn-facts")
        assert css(driver, "#cancel-btn").is_displayed()
        wait(driver, shows("#live", "Following live"))
        driver.execute_script("window.__same_page = true")
        screenshot(driver, request, "turn-running", 1280)

    await browse(open_running, browser)
    count = len(await svc.events(turn_id))
    svc.upstream.release()

    def grows(driver: Any) -> None:
        wait(driver, lambda d: text_of(d, "#answer-text") == text, "the rest of the answer, live")
        wait(driver, lambda d: "completed" in text_of(d, "#turn-facts"), "the end, live")
        wait(driver, lambda d: len(all_css(d, "#timeline > li")) > count, "new events in the timeline")
        # the status comes with the summary; the timeline's page is read after it
        wait(driver, lambda d: bool(all_css(d, "#timeline > li[data-type='turn.completed']")), "turn.completed in the timeline")
        assert driver.execute_script("return window.__same_page === true"), "the page was reloaded"
        wait(driver, lambda d: not css(d, "#cancel-btn").is_displayed())
        wait(driver, shows("#live", "no longer live"))

    await browse(grows, browser)
    await reader

    turn_id, reader = await start_running(svc, "This one is stopped from the inspector before it ends.", pause_after=3)

    def cancel(driver: Any) -> None:
        driver.get(f"{svc.url}/ui/turns/{turn_id}")
        wait(driver, lambda d: css(d, "#cancel-btn").is_displayed(), "the cancel button of a running turn")
        css(driver, "#cancel-btn").click()
        wait(driver, lambda d: "cancelled" in text_of(d, "#turn-facts"), "the cancelled status on the page")
        wait(driver, lambda d: not css(d, "#cancel-btn").is_displayed())
        wait(driver, lambda d: bool(all_css(d, "#timeline > li[data-type='turn.cancelled']")), "turn.cancelled in the timeline")

    await browse(cancel, browser)
    svc.upstream.release()
    assert (await svc.turn(turn_id))["status"] == "cancelled"
    await reader


@pytest.fixture
async def authed(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[tuple[Service, str, str]]:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on", database_url=database_url), upstream)
    try:
        store = svc.services.store
        yield svc, await store.create_api_key("alice"), await store.create_api_key("bob")
    finally:
        await stop_service(svc)


@pytest.mark.sqlite_only
async def test_with_auth_on_the_page_asks_for_a_key_and_shows_only_that_users_turns(
    authed: tuple[Service, str, str], browser: Any, request: pytest.FixtureRequest
) -> None:
    svc, alice, bob = authed
    ids = {}
    for name, key in (("alice", alice), ("bob", bob)):
        svc.headers = {"Authorization": f"Bearer {key}"}
        status, _, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER, "chat_id": f"chat-{name}"})
        assert status == 200
        ids[name] = headers["X-Turn-Id"]
    # the page itself needs no key; the API behind it does
    async with aiohttp.ClientSession() as http:
        for path in ("/ui/", f"/ui/turns/{ids['alice']}", "/ui/static/app.js", "/ui/static/app.css"):
            async with http.get(svc.url + path) as resp:
                assert resp.status == 200, path
        async with http.get(svc.url + "/ui", allow_redirects=False) as resp:
            assert resp.status == 302 and resp.headers["Location"] == "/ui/"
        async with http.get(svc.url + "/v1/ui/turns") as resp:
            assert resp.status == 401

    def no_key(driver: Any) -> None:
        driver.get(svc.url + "/ui/")
        driver.execute_script("sessionStorage.clear()")
        driver.get(svc.url + "/ui/")
        wait(driver, lambda d: all_css(d, "#key-form"), "the key form")
        assert not all_css(driver, "#turns-table")
        source = driver.page_source
        assert ids["alice"] not in source and ids["bob"] not in source and "chat-alice" not in source
        screenshot(driver, request, "key", 390)
        # a turn's page without a key shows nothing of it either
        driver.get(f"{svc.url}/ui/turns/{ids['alice']}")
        wait(driver, lambda d: all_css(d, "#key-form"))
        assert "Add some numbers" not in driver.page_source and not all_css(driver, "#timeline > li")
        # a wrong key is refused
        css(driver, "#key-input").send_keys("tl-not-a-key")
        css(driver, "#key-form button[type=submit]").click()
        wait(driver, shows("#key-form", "not accepted"))

    await browse(no_key, browser)

    def as_alice(driver: Any) -> None:
        driver.get(svc.url + "/ui/")
        wait(driver, lambda d: all_css(d, "#key-input"))
        css(driver, "#key-input").send_keys(alice)
        css(driver, "#key-form button[type=submit]").click()
        wait(driver, lambda d: len(texts(d, "#turns-table tbody tr")) == 1, "alice's turn")
        listed = text_of(driver, "#main")
        assert ids["alice"] in listed and ids["bob"] not in listed
        assert "chat-alice" in driver.page_source and "chat-bob" not in driver.page_source
        assert driver.execute_script("return sessionStorage.getItem('turnlog.key')") == alice
        # her turn's page works (the key rides along); bob's is "not found"
        driver.get(f"{svc.url}/ui/turns/{ids['alice']}")
        wait(driver, shows("#answer-text", "Hello from the scripted upstream."))
        driver.get(f"{svc.url}/ui/turns/{ids['bob']}")
        wait(driver, shows("#main", "Turn not found"))
        css(driver, "#forget-key").click()
        wait(driver, lambda d: all_css(d, "#key-form"))
        assert driver.execute_script("return sessionStorage.getItem('turnlog.key')") is None

    await browse(as_alice, browser)


@pytest.fixture
async def long_service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[Service]:
    # One chunk per delta event: a long streamed answer is a long log.
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, flush_max_chunks=1, flush_interval=0.001)
    svc = await start_service(settings, upstream)
    try:
        yield svc
    finally:
        await stop_service(svc)


@pytest.mark.sqlite_only
async def test_a_ten_thousand_event_turn_pages_its_timeline_and_paints_within_a_second(
    long_service: Service, browser: Any, request: pytest.FixtureRequest
) -> None:
    svc = long_service
    svc.upstream.enqueue(Reply(chunks=[f"w{i} " for i in range(10_050)]))
    status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200, body
    turn_id = headers["X-Turn-Id"]
    view = await svc.turn(turn_id)
    assert view["seq"] >= 10_000, f"only {view['seq']} events"

    def open_it(driver: Any) -> dict[str, float]:
        driver.get(f"{svc.url}/ui/turns/{turn_id}")
        wait(driver, lambda d: d.execute_script("return performance.getEntriesByName('turnlog:timeline').length") > 0, "the timeline")
        wait(driver, lambda d: d.execute_script("return performance.getEntriesByName('turnlog:spans').length") > 0, "the spans chart")
        assert css(driver, "#spans-chart").get_attribute("data-spans") == "2", "assembly and the one model call"
        rows = all_css(driver, "#timeline > li")
        assert 0 < len(rows) <= 200, f"{len(rows)} rows rendered"
        wait(driver, shows("#tl-where", f"of {view['seq']}"), "the event count, once the summary is in")
        wait(driver, shows("#answer-text", "w10049"), "the whole answer")
        wait(driver, lambda d: d.execute_script("return performance.getEntriesByName('turnlog:summary').length") > 0, "the summary")
        timing: dict[str, float] = driver.execute_script(
            "const p = performance.getEntriesByName('first-contentful-paint')[0];"
            "const t = performance.getEntriesByName('turnlog:timeline')[0];"
            "const s = performance.getEntriesByName('turnlog:summary')[0];"
            "const c = performance.getEntriesByName('turnlog:spans')[0];"
            "return {fcp: p ? p.startTime : -1, timeline: t.startTime, summary: s.startTime, spans: c.startTime};"
        )
        # the last page, by keyboard-reachable buttons: still bounded
        css(driver, "#tl-next").click()
        wait(driver, lambda d: "Events 201–400" in text_of(d, "#tl-where"))
        assert len(all_css(driver, "#timeline > li")) <= 200
        screenshot(driver, request, "turn-10k", 1280)
        return timing

    timing = await browse(open_it, browser)
    line = (
        f"inspector on a {view['seq']}-event turn: first contentful paint {timing['fcp']:.0f} ms, "
        f"timeline rendered {timing['timeline']:.0f} ms, spans chart {timing['spans']:.0f} ms, all panels {timing['summary']:.0f} ms"
    )
    log_line(request, line)
    assert 0 <= timing["fcp"] < 1000, line
    assert timing["timeline"] < 1000, line
    assert timing["spans"] < 1000, line


@pytest.mark.sqlite_only
async def test_a_timeline_page_answered_after_a_newer_one_is_not_shown(long_service: Service, browser: Any) -> None:
    """Two pages asked for in a row (Later, then Last): the first one's answer
    arrives after the second one's. The timeline keeps showing the last page;
    the late answer is read and dropped."""
    svc = long_service
    svc.upstream.enqueue(Reply(chunks=[f"w{i} " for i in range(450)]))
    status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": USER})
    assert status == 200, body
    turn_id = headers["X-Turn-Id"]
    total = (await svc.turn(turn_id))["seq"]
    assert total > 400, f"only {total} events: the turn must have three pages"
    last_page = f"Events 401–{total} of {total}"

    def page_through(driver: Any) -> None:
        gate = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": read_gate("/timeline?")})
        try:
            driver.get(f"{svc.url}/ui/turns/{turn_id}")
            wait(driver, shows("#tl-where", f"Events 1–200 of {total}"), "the first page, with the count from the summary")
            driver.execute_script("window.__hold = true")
            css(driver, "#tl-next").click()  # page 2: held
            wait(driver, lambda d: d.execute_script("return window.__held.length") == 1, "the held read")
            driver.execute_script("window.__hold = false")
            css(driver, "#tl-last").click()  # page 3: answered at once
            wait(driver, shows("#tl-where", last_page), lambda: text_of(driver, "#tl-where"))
            driver.execute_script("window.__release()")
            wait(driver, lambda d: d.execute_script("return window.__lateRead") == 1, "the late answer read")
            # (the page's handling of a read runs before the next script does)
            assert text_of(driver, "#tl-where").startswith(last_page), text_of(driver, "#tl-where")
            assert css(driver, "#timeline > li").get_attribute("id") == "ev-401"
        finally:
            driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": gate["identifier"]})

    await browse(page_through, browser)


@pytest.mark.sqlite_only
async def test_verify_and_receipt_panels_show_what_the_server_answers(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, browser: Any, request: pytest.FixtureRequest
) -> None:
    """A failed verify shows its diff; a signed receipt shows its fields. Where
    this service has no such endpoint yet, stand-ins with their documented
    shapes answer (where it has one, the real endpoint answers and the page
    must show it)."""
    from aiohttp import web

    from adapters.http.app import create_app

    app = create_app(make_settings(tmp_path, upstream.url, database_url=database_url))
    routed = {r.canonical for r in app.router.resources()}
    stand_ins = "/v1/turns/{turn_id}/verify" not in routed and "/v1/turns/{turn_id}/receipt" not in routed

    async def verify(req: web.Request) -> web.Response:
        return web.json_response({"ok": False, "diff": ["seq 4: model.delta text differs", {"seq": 5, "field": "usage"}]})

    async def receipt(req: web.Request) -> web.Response:
        turn_id = req.match_info["turn_id"]
        return web.json_response({"turn_id": turn_id, "events": 5, "head": "ab12" * 16, "algorithm": "sha256-chain", "signature": "sig-" + "cd" * 20})

    if stand_ins:
        app.router.add_get("/v1/turns/{turn_id}/verify", verify)
        app.router.add_get("/v1/turns/{turn_id}/receipt", receipt)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/v1/chat/completions", json={"model": "gpt-test", "messages": USER}) as resp:
                assert resp.status == 200
                turn_id = resp.headers["X-Turn-Id"]

        def panels(driver: Any) -> None:
            driver.get(f"{url}/ui/turns/{turn_id}")
            wait(driver, shows("#answer-text", "Hello"))
            css(driver, "#verify-btn").click()
            css(driver, "#receipt-btn").click()
            wait(driver, lambda d: all_css(d, "#verify-result") and all_css(d, "#receipt-result"))
            if stand_ins:
                assert css(driver, "#verify-result").get_attribute("data-state") == "failed"
                verdict = text_of(driver, "#verify-result")
                assert "Does not verify" in verdict and "seq 4: model.delta text differs" in verdict and '"field":"usage"' in verdict
                shown = text_of(driver, "#receipt-result")
                assert "ab12" * 16 in shown and "sha256-chain" in shown and "sig-" in shown and "server signed" in shown
            else:
                assert css(driver, "#verify-result").get_attribute("data-state") == "ok"
                assert css(driver, "#receipt-result").get_attribute("data-state") == "ok"
            screenshot(driver, request, "turn-panels", 1280)

        await browse(panels, browser)
    finally:
        await runner.cleanup()


@pytest.mark.sqlite_only
async def test_the_list_finds_turns_by_their_words_filters_counts_and_pages(tools_service: Service, browser: Any, request: pytest.FixtureRequest) -> None:
    from selenium.webdriver.common.keys import Keys

    svc = tools_service
    tool_id = await tool_turn(svc)
    svc.upstream.enqueue(Reply(status=500, error_message="upstream on fire"))
    status, _, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "this one breaks"}]})
    assert status == 502
    failed_id = headers["X-Turn-Id"]
    plain: list[str] = []
    for i in range(26):  # more than a page
        svc.upstream.enqueue(Reply(text=f"Answer {i} about okapis." if i == 7 else f"Answer {i}."))
        status, _, headers = await svc.post(
            "/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": f"Question {i} for the list"}]}
        )
        assert status == 200
        plain.append(headers["X-Turn-Id"])
    newest_first = [*plain[::-1], failed_id, tool_id]
    # each row is named by the turn's title, else its first new user message
    names = {}
    for turn_id, question in [(tool_id, USER[0]["content"]), (failed_id, "this one breaks"), *((t, f"Question {i} for the list") for i, t in enumerate(plain))]:
        names[turn_id] = (await svc.turn(turn_id)).get("title") or question

    def row_ids(d: Any) -> list[str]:
        return [next((t for t in newest_first if t in row), "?") for row in texts(d, "#turns-table tbody tr")]

    def the_list(driver: Any) -> None:
        driver.get(svc.url + "/ui/")
        wait(driver, lambda d: row_ids(d) == newest_first[:25], lambda: f"the first page: {row_ids(driver)}")
        for row in all_css(driver, "#turns-table tbody tr")[:3]:
            turn_id = next(t for t in newest_first if t in row.get_attribute("textContent"))
            assert row.find_element("css selector", "a.turn-link").text == names[turn_id]
        wait(driver, shows("#turn-counts", "28 turns: 27 completed, 1 failed"), lambda: text_of(driver, "#turn-counts"))
        # an untitled chat is named by its first message
        wait(driver, shows("#chats-list li", names[plain[-1]]), lambda: f"the newest chat: {text_of(driver, '#chats-list li')}")
        # keyset pages, both ways
        css(driver, "nav[aria-label='Turn pages'] button:last-child").click()
        wait(driver, lambda d: row_ids(d) == newest_first[25:], lambda: f"the second page: {row_ids(driver)}")
        css(driver, "nav[aria-label='Turn pages'] button:first-child").click()
        wait(driver, lambda d: row_ids(d) == newest_first[:25], "the first page again")
        # full text: a word of one answer
        css(driver, "#f-q").send_keys("OKAPIS", Keys.ENTER)
        wait(driver, lambda d: row_ids(d) == [plain[7]], lambda: f"the okapi turn: {row_ids(driver)}")
        wait(driver, shows("#turn-counts", "1 turn: 1 completed"))
        assert "q=OKAPIS" in driver.current_url
        screenshot(driver, request, "list-search", 1280)
        css(driver, "#f-q").clear()
        css(driver, "#f-q").send_keys(Keys.ENTER)
        wait(driver, lambda d: len(row_ids(d)) == 25)
        css(driver, "#f-tools").click()
        wait(driver, lambda d: row_ids(d) == [tool_id], "the tool turn")
        css(driver, "#f-tools").click()
        css(driver, "#f-failed").click()
        wait(driver, lambda d: row_ids(d) == [failed_id, tool_id], lambda: f"failed or a tool call failed: {row_ids(driver)}")
        assert "failed=true" in driver.current_url
        css(driver, "#f-failed").click()
        # a date range without the turns (they are from today)
        driver.execute_script("const el = document.getElementById('f-until'); el.value = '2001-01-01'; el.dispatchEvent(new Event('change'))")
        wait(driver, shows("#turns-box", "No turns match."))
        wait(driver, shows("#turn-counts", "0 turns"))
        assert not unlabelled_controls(driver)
        screenshot(driver, request, "list-filters", 390)

    await browse(the_list, browser)


def read_gate(*parts: str) -> str:
    """A script that holds the page's reads of URLs containing any of
    ``parts`` while ``window.__hold`` is set, until ``window.__release()``;
    ``window.__lateRead`` counts the held answers the page has read."""
    return f"""
window.__hold = false; window.__held = []; window.__lateRead = 0;
const heldParts = {json.dumps(list(parts))};
const pageFetch = window.fetch;
window.fetch = (url, options) => {{
  const u = String(url);
  if (!window.__hold || !heldParts.some((p) => u.includes(p))) return pageFetch(url, options);
  return new Promise((go) => window.__held.push(go)).then(() => pageFetch(url, options)).then((response) => {{
    const json = response.json.bind(response);
    response.json = () => json().then((body) => {{ window.__lateRead += 1; return body; }});
    return response;
  }});
}};
window.__release = () => {{ for (const go of window.__held.splice(0)) go(); }};
"""


#: The list's reads: its turns and their counts.
LIST_GATE = read_gate("/v1/turns?", "/v1/ui/turns/counts?")


@pytest.mark.sqlite_only
async def test_a_filters_answer_that_arrives_after_a_newer_ones_is_not_shown(tools_service: Service, browser: Any) -> None:
    """Two filter changes in a row: the first one's answers (all turns)
    arrive after the second one's (none). The list and its counts show the
    second; the late ones are read and dropped."""
    svc = tools_service
    await tool_turn(svc)

    def the_list(driver: Any) -> None:
        gate = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": LIST_GATE})
        try:
            driver.get(svc.url + "/ui/?failed=true")
            wait(driver, lambda d: bool(all_css(d, "#turns-table tbody tr")), "the list")
            driver.execute_script("window.__hold = true")
            css(driver, "#f-failed").click()  # all turns: held
            wait(driver, lambda d: d.execute_script("return window.__held.length") == 2, "the held reads")
            driver.execute_script(
                "window.__hold = false; const el = document.getElementById('f-until'); el.value = '2001-01-01'; el.dispatchEvent(new Event('change'))"
            )
            wait(driver, shows("#turns-box", "No turns match."), "the newer answer")
            wait(driver, shows("#turn-counts", "0 turns"), lambda: text_of(driver, "#turn-counts"))
            driver.execute_script("window.__release()")
            wait(driver, lambda d: d.execute_script("return window.__lateRead") == 2, "the late answers read")
            # (the page's handling of a read runs before the next script does)
            assert "No turns match." in text_of(driver, "#turns-box") and not all_css(driver, "#turns-table tbody tr")
            assert text_of(driver, "#turn-counts").startswith("0 turns"), text_of(driver, "#turn-counts")
        finally:
            driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": gate["identifier"]})

    await browse(the_list, browser)


async def test_the_shape_of_a_tool_turn_on_one_time_axis_jumps_to_events_passes_axe_and_fits_a_phone(
    tools_service: Service, browser: Any, request: pytest.FixtureRequest
) -> None:
    svc = tools_service
    # an earlier turn of the same chat: the conversation shows it before this one
    svc.upstream.enqueue(Reply(text="Hello, how can I help?"))
    status, body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": [{"role": "user", "content": "Hi there"}]})
    assert status == 200, body
    first_id, chat_id = headers["X-Turn-Id"], headers["X-Chat-Id"]
    turn_id = await tool_turn(svc, chat_id=chat_id)
    events = await svc.events(turn_id)
    requested = [e["seq"] for e in events if e["type"] == "model.requested"]
    started = {e["data"]["call_id"]: e["seq"] for e in events if e["type"] == "tool.started"}
    assert len(requested) == 3 and len(started) == 3

    def look(driver: Any) -> None:
        driver.get(f"{svc.url}/ui/turns/{turn_id}")
        wait(driver, lambda d: bool(all_css(d, "#spans-chart .sp-row[data-kind]")), "the spans chart")
        rows = driver.execute_script(
            "return [...document.querySelectorAll('#spans-chart li.sp-row')].map(r => [r.dataset.kind, Number(r.dataset.seq), r.title])"
        )
        assert [seq for kind, seq, _ in rows if kind == "model"] == requested, rows
        assert sorted(seq for kind, seq, _ in rows if kind == "tool") == sorted(started.values()), rows
        assert [kind for kind, _, _ in rows][:1] == ["assembly"] and sum(kind == "reinjection" for kind, _, _ in rows) == 2, rows
        # nothing but the chart and its legend: no stray text (a null appended as "null")
        assert [n.strip() for n in driver.execute_script("return [...document.querySelector('#spans').childNodes].map(n => n.nodeName)")] == ["DIV", "UL"]
        # hover: the bar's row says what it is, how long, where in the log
        boom = next(title for kind, seq, title in rows if seq == started["call_boom"])
        assert "tool call: explode" in boom and "failed" in boom and f"seq {started['call_boom']}" in boom, boom
        bar_title = driver.execute_script(f"return document.querySelector(\"#spans-chart li[data-seq='{started['call_boom']}'] rect title\").textContent")
        assert bar_title == boom
        # every bar lies on the one axis: inside the track, left to right in time
        xs = driver.execute_script(
            "return [...document.querySelectorAll('#spans-chart li .sp-bar')].map(b => [Number(b.getAttribute('x')), Number(b.getAttribute('width'))])"
        )
        assert all(0 <= x and x + w <= 1000.01 for x, w in xs), xs
        model_xs = [x for (kind, _, _), (x, _) in zip(rows, xs, strict=True) if kind == "model"]
        assert model_xs == sorted(model_xs) and model_xs[-1] > model_xs[0], model_xs
        # choosing the failed tool's bar opens its event in the event list
        css(driver, f"#spans-chart li.sp-row[data-seq='{started['call_boom']}'] button").click()
        opened = f"const r = document.querySelector('#ev-{started['call_boom']} details'); return !!r && r.open"
        wait(driver, lambda d: d.execute_script(opened), "the event opened")
        assert driver.switch_to.active_element.text.startswith(f"#{started['call_boom']}")
        screenshot(driver, request, "turn-shape", 1280, at="#shape")

        # the conversation as its user saw it: both turns, tool calls folded with their results
        wait(driver, lambda d: bool(all_css(d, "#chat-list > li")), "the conversation")
        said = driver.execute_script(
            "return [...document.querySelectorAll('#chat-list > li')].map(li => [li.dataset.role, li.classList.contains('current'),"
            " [...li.querySelectorAll(':scope > .chat-text')].map(p => p.textContent).join(''),"
            " [...li.querySelectorAll(':scope > details > summary')].map(s => s.textContent)])"
        )
        assert said == [
            ["user", False, "Hi there", []],
            ["assistant", False, "Hello, how can I help?", []],
            ["user", False, USER[0]["content"], []],
            ["assistant", True, ANSWER, ["Tool call: add", "Tool call: add", "Tool call: explode (failed)"]],
        ], said
        assert css(driver, "#chat-list a[href]").get_attribute("href").endswith(f"/ui/turns/{first_id}")
        folded = all_css(driver, "#chat-list li.current > details")
        assert not any(d.get_attribute("open") for d in folded)
        folded[1].find_element("css selector", "summary").click()
        wait(driver, lambda d: "42" in folded[1].text, "the second add's result, unfolded")
        screenshot(driver, request, "turn-chat", 1280, at="#chat-h")

        problems = serious_violations(driver)
        assert not problems, problems
        # a phone: the chart and the page fit the width, bars included
        driver.set_window_size(375, 900)
        wait(driver, lambda d: d.execute_script("return window.innerWidth") <= 375, "the narrow window")
        assert overflows(driver) <= 0, f"{overflows(driver)} px wider than a 375 px screen"
        widths = driver.execute_script("return [...document.querySelectorAll('#spans-chart .sp-track')].map(t => t.getBoundingClientRect().width)")
        assert widths and min(widths) > 200, widths
        assert not serious_violations(driver)
        screenshot(driver, request, "turn-shape", 375, at="#shape")
        screenshot(driver, request, "turn-chat", 375, at="#chat-h")
        driver.get(svc.url + "/ui/")
        wait(driver, lambda d: bool(all_css(d, "#turns-table tbody tr")), "the list")
        problems = serious_violations(driver)
        assert not problems, problems

    await browse(look, browser)


#: Holds the page's summary read (``/summary``) until the test calls
#: ``window.__releaseSummary()``: the page's reads then arrive in the order the
#: test chooses, not as a loaded machine happens to serve them.
SUMMARY_GATE = """
window.__summaryGate = new Promise((go) => { window.__releaseSummary = go; });
const pageFetch = window.fetch;
window.fetch = (url, options) => String(url).includes("/summary") ? window.__summaryGate.then(() => pageFetch(url, options)) : pageFetch(url, options);
"""


@pytest.mark.sqlite_only
async def test_an_event_opened_before_the_summary_arrives_stays_open_and_focused(tools_service: Service, browser: Any) -> None:
    """The event list is drawn again when the turn's summary arrives (a fold of
    the whole log: the page's slowest read). An event opened from the spans
    chart before that stays open, its row focused, after it."""
    svc = tools_service
    turn_id = await tool_turn(svc)
    seq = next(e["seq"] for e in await svc.events(turn_id) if e["type"] == "tool.started")
    opened = f"const r = document.querySelector('#ev-{seq} details'); return !!r && r.open"
    summary_shown = "return performance.getEntriesByName('turnlog:summary').length > 0"

    def look(driver: Any) -> None:
        gate = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": SUMMARY_GATE})
        try:
            driver.get(f"{svc.url}/ui/turns/{turn_id}")
            wait(driver, lambda d: bool(all_css(d, "#spans-chart .sp-row[data-kind]")), "the spans chart")
            css(driver, f"#spans-chart li.sp-row[data-seq='{seq}'] button").click()
            wait(driver, lambda d: d.execute_script(opened), "the event opened")
            assert not driver.execute_script(summary_shown)  # the gate held it: the order is the one under test
            driver.execute_script("window.__releaseSummary()")
            wait(driver, lambda d: d.execute_script(summary_shown), "the summary")
            assert driver.execute_script(opened), "the event list was drawn again with the opened event closed"
            assert driver.switch_to.active_element.text.startswith(f"#{seq}")
        finally:
            driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": gate["identifier"]})

    await browse(look, browser)


async def test_a_fork_shows_beside_its_parent_what_it_was_given_and_what_differs(tools_service: Service, browser: Any, request: pytest.FixtureRequest) -> None:
    svc = tools_service
    parent_id = await tool_turn(svc)
    batches = [e["seq"] for e in await svc.events(parent_id) if e["type"] == "tools.batch"]
    svc.upstream.enqueue(Reply(text="With 7 in place of the failure: 5, 42 and 7."))
    status, body, _ = await svc.post(f"/v1/turns/{parent_id}/fork", {"at": batches[1], "tool_results": {"call_boom": "7"}})
    assert status == 201, body
    fork_id = body["turn_id"]
    async with svc.http.get(f"{svc.v1}/turns/{fork_id}/stream", headers=svc.headers) as response:
        await response.text()  # to the fork's end
    assert (await svc.turn(fork_id))["content"] == "With 7 in place of the failure: 5, 42 and 7."

    def look(driver: Any) -> None:
        driver.get(f"{svc.url}/ui/turns/{fork_id}")
        wait(driver, lambda d: bool(all_css(d, "#fork-table tbody tr")), "the fork beside its parent")
        assert css(driver, "#fork-parent").get_attribute("href").endswith(f"/ui/turns/{parent_id}")
        intro = text_of(driver, "#fork-cmp > p")
        assert f"at its seq {batches[1]}" in intro and "given the results of call_boom" in intro, intro
        rows = driver.execute_script(
            "return [...document.querySelectorAll('#fork-table tbody tr')].map(r => [r.className, r.querySelector('th').textContent,"
            " [...r.querySelectorAll('td')].map(td => td.textContent)])"
        )
        assert [(cls, name.split(" (")[0].split(" same")[0].split(" differs")[0]) for cls, name, _ in rows] == [
            ("same", "Model"),
            ("same", "add result"),
            ("same", "add result"),
            ("differs", "explode result"),
            ("differs", "Answer"),
        ], rows
        assert "given" in rows[3][1] and rows[3][2][1] == "7", rows[3]
        assert rows[4][2] == [ANSWER, "With 7 in place of the failure: 5, 42 and 7."], rows[4]
        # the fork's chart is its own time: the parent's copied spans are named, not drawn
        wait(driver, lambda d: bool(all_css(d, "#spans-copied")), "the note on the copied spans")
        drawn = [int(x) for x in driver.execute_script("return [...document.querySelectorAll('#spans-chart li.sp-row')].map(r => r.dataset.seq)")]
        assert drawn and min(drawn) > batches[1], (drawn, batches[1])
        assert css(driver, "#spans-copied a").get_attribute("href").endswith(f"/ui/turns/{parent_id}")
        screenshot(driver, request, "fork", 1280, at="#fork")
        problems = serious_violations(driver)
        assert not problems, problems
        driver.set_window_size(375, 900)
        wait(driver, lambda d: d.execute_script("return window.innerWidth") <= 375, "the narrow window")
        assert overflows(driver) <= 0, f"{overflows(driver)} px wider than a 375 px screen"
        screenshot(driver, request, "fork", 375, at="#fork")
        # the parent names its fork (the fork index), with where it was forked
        driver.set_window_size(1280, 900)
        driver.get(f"{svc.url}/ui/turns/{parent_id}")
        wait(driver, lambda d: bool(all_css(d, "#forks-of li")), "the parent's forks")
        listed = texts(driver, "#forks-of li")
        assert len(listed) == 1 and fork_id in listed[0] and f"at seq {batches[1]}" in listed[0], listed
        assert css(driver, "#forks-of a").get_attribute("href").endswith(f"/ui/turns/{fork_id}")
        screenshot(driver, request, "forks-of", 1280, at="#fork")

    await browse(look, browser)


async def test_the_shape_shows_an_approval_wait_and_a_background_task(tools_service: Service, browser: Any, request: pytest.FixtureRequest) -> None:
    svc = tools_service
    svc.upstream.enqueue(Reply(tool_calls=[call("add", {"a": 1, "b": 2}, "call_ok")], finish_reason="tool_calls"), Reply(text="It is 3."))
    svc.upstream.task_replies.append(("title", Reply(text='{"title": "Adding up"}')))
    body = {
        "model": "gpt-test",
        "messages": USER,
        "tool_ids": ["weather"],
        "params": {"tool_approval": "ask"},
        "background_tasks": {"title": True, "tags": False},
    }
    status, answer, headers = await svc.post("/v1/chat/completions", body)
    assert status == 200 and answer["turnlog"]["status"] == "waiting", answer
    turn_id = headers["X-Turn-Id"]
    status, decided, _ = await svc.post(f"/v1/turns/{turn_id}/approvals", {"call_id": "call_ok", "approve": True})
    assert status == 202, decided
    async with svc.http.get(f"{svc.v1}/turns/{turn_id}/stream", headers=svc.headers) as response:
        await response.text()  # to the turn's end
    events = await svc.events(turn_id)
    asked = next(e["seq"] for e in events if e["type"] == "tool.approval_requested")
    background = next(e["seq"] for e in events if e["type"] == "background.started")

    def look(driver: Any) -> None:
        driver.get(f"{svc.url}/ui/turns/{turn_id}")
        wait(driver, lambda d: bool(all_css(d, "#spans-chart li.sp-row[data-kind='background']")), "the background task's span")
        rows = driver.execute_script(
            "return [...document.querySelectorAll('#spans-chart li.sp-row')].map(r => [r.dataset.kind, Number(r.dataset.seq), r.title])"
        )
        approval = [r for r in rows if r[0] == "approval"]
        assert [(seq, "approval wait: approval of add" in title and "approved" in title) for _, seq, title in approval] == [(asked, True)], rows
        title_task = [r for r in rows if r[0] == "background"]
        assert [(seq, "background task: title" in title) for _, seq, title in title_task] == [(background, True)], rows
        screenshot(driver, request, "turn-shape-approval", 1280, at="#shape")
        problems = serious_violations(driver)
        assert not problems, problems

    await browse(look, browser)
