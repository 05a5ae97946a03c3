"""The console in a real browser (issue 44): Debian's Chromium, headless, driven by Selenium through
Debian's chromedriver (scripts/bootstrap installs both; Selenium Manager never runs: the driver's
and the browser's paths are given), against a real ``memoryctl serve`` on the embedded default
profile in a temporary data directory.

Signs in with an issued operator token, reads every page, retries a delivery set aside (a poison
row, written as tests/e2e/test_delivery_faults.py writes it), forgets a memory and sees it gone;
an agent token is refused another agent's memory (404, as over HTTP); a ``<script>`` in a
memory's text is text; and with JavaScript disabled every page still reads. A screenshot of each
page is kept in ``.cache/console/``.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as until
from selenium.webdriver.support.ui import WebDriverWait

from memoryctl.client import MemoryClient
from memoryctl.config import load_settings
from tests.e2e.serving import Served, embedded_home, poison, running_service

pytestmark = pytest.mark.slow


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS = Path(__file__).resolve().parents[2] / ".cache" / "console"
HOSTILE = "Alice told Bob <script>document.title='pwned'</script> about the <b>plan</b>"
PAGES = ("overview", "runs", "outbox", "memories", "stats")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            pytest.fail(f"{binary} is missing: run scripts/bootstrap (apt-get install chromium chromium-driver)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with embedded_home("memoryctl-console-") as config:
        data_dir = config.parent / "d"
        with MemoryClient(load_settings(config)) as client:  # before serve owns the embedded PostgreSQL
            client.init()
            poison(client)  # set aside by the first delivery
            nights(client)
        log = tmp_path_factory.mktemp("console") / "serve.log"
        with running_service(config, data_dir, log=log) as service:
            yield {"service": service, **_seed(service)}


GATE = (0.62, 0.71, 0.69)  # three nights' held-out recall@k of the embedding candidate


def nights(client: MemoryClient) -> None:
    """Three nights as the nightly records them (``NightlyReport.as_dict``), with gate figures: the
    embedded profile trains nothing (its hash embedder takes no LoRA), so they are recorded here."""
    from memoryctl.maintenance.nightly import NightlyReport, StepOutcome

    for recall in GATE:
        report = NightlyReport(
            steps=[
                StepOutcome("embedding", "ok", {"gate_metrics": {"candidate_recall_at_k": recall}, "version": "v1"}, 9),
                StepOutcome("generation", "skipped", {"reason": "no [nightly] generation_base_model configured"}),
            ]
        )
        run = client.stack.runs.start("nightly", trigger="test", actor="console-test")
        client.stack.runs.finish(run, "ok", details=report.as_dict())


def _ok(service: Served, path: str, body: dict[str, Any]) -> Any:
    status, _, data = service.request(path, body)
    assert status == 200, (path, status, data)
    return data


def _seed(service: Served) -> dict[str, Any]:
    hostile = _ok(service, "/v1/add", {"text": HOSTILE, "entities": ["User:Alice", "User:Bob"]})["id"]
    plain = _ok(service, "/v1/add", {"text": "Alice prefers green tea in the morning", "entities": ["User:Alice"]})
    doomed = {"text": "a memory to forget about the lighthouse", "entities": ["Place:Lighthouse"]}
    doomed = _ok(service, "/v1/add", doomed)
    other = _ok(service, "/v1/add", {"text": "another agent's secret", "agent": "others"})["id"]
    for i in range(6):
        _ok(service, "/v1/add", {"text": f"mood note {i}", "metadata": {"mood": i / 5}})
    _ok(service, "/v1/sync", {})  # the poison row is set aside here
    operator = _ok(service, "/v1/token/issue", {"operator": True, "name": "browser-test"})["token"]
    agent = _ok(service, "/v1/token/issue", {"agent": "support"})["token"]
    return {
        "hostile": hostile,
        "plain": plain["id"],
        "doomed": doomed["id"],
        "other": other,
        "operator": operator,
        "agent": agent,
    }


def _browser(*, javascript: bool = True) -> Any:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1400"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager, should anything call it: no downloads
    driver = webdriver.Chrome(options=options, service=DriverService(executable_path=CHROMEDRIVER))
    driver.implicitly_wait(10)  # a clicked form's next page: its elements are waited for
    return driver


def wait_url(driver: Any, part: str) -> None:
    """Until the page a click led to is there (a click returns before the navigation ends)."""
    WebDriverWait(driver, 30).until(until.url_contains(part))


@pytest.fixture(scope="module")
def browser(served: dict[str, Any]) -> Iterator[Any]:
    driver = _browser()
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: Any, name: str) -> None:
    # The whole page: the window grows to the document's height for the screenshot.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(int(height or 0), 800), 6000))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def sign_in(driver: Any, url: str, token: str, *, then: str = "/console/overview") -> None:
    driver.delete_all_cookies()
    driver.get(url + then)
    assert "/console/login" in driver.current_url  # no session: sent to sign in
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "sign-in").click()
    WebDriverWait(driver, 30).until(until.url_to_be(url + then))  # the login URL holds `then` too


def csp_violations(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]


def test_sign_in_and_the_overview_shows_each_component(served: dict[str, Any], browser: Any) -> None:
    service: Served = served["service"]
    browser.get(service.url + "/console/overview")
    shot(browser, "login")
    browser.find_element(By.ID, "token").send_keys("mca_not-a-token")
    browser.find_element(By.ID, "sign-in").click()
    assert "not valid" in browser.find_element(By.ID, "message").text
    sign_in(browser, service.url, served["operator"])
    assert browser.find_element(By.ID, "who").text == "operator (browser-test)"
    _, _, health = service.request("/v1/health", {})
    rows = {r.get_attribute("data-component"): r for r in browser.find_elements(By.CSS_SELECTOR, "tr.component")}
    assert set(rows) == set(health["components"]) and len(rows) >= 5
    for name, component in health["components"].items():
        assert component["status"] in rows[name].text
    assert "Not in this profile" in browser.find_element(By.ID, "no-cluster").text  # embedded: no Patroni
    assert browser.find_elements(By.CSS_SELECTOR, "#last-runs tr")  # the sync above is there
    shot(browser, "overview")
    assert csp_violations(browser) == []  # nothing on the page needs what the CSP forbids
    assert "js" in browser.find_element(By.TAG_NAME, "html").get_attribute("class")  # the script ran


def test_a_search_shows_its_plan(served: dict[str, Any], browser: Any) -> None:
    service: Served = served["service"]
    browser.get(service.url + "/console/memories")
    browser.find_element(By.ID, "q").send_keys("green tea")
    browser.find_element(By.ID, "search-button").click()
    wait_url(browser, "text=green+tea")
    steps = browser.find_elements(By.CSS_SELECTOR, "#plan rect.bar")
    assert steps, "the plan is drawn: a bar per step"
    assert "ms" in browser.find_element(By.ID, "plan").text
    assert browser.find_element(By.ID, "plan-text").text.strip()
    hits = browser.find_elements(By.CSS_SELECTOR, "#hits tr.hit")
    assert any("green tea" in h.text for h in hits)
    shot(browser, "memories-search")


def test_a_memory_page_shows_its_graph_and_script_as_text(served: dict[str, Any], browser: Any) -> None:
    service: Served = served["service"]
    browser.get(f"{service.url}/console/memories/{served['hostile']}")
    assert browser.find_element(By.ID, "memory-text").text == HOSTILE  # the tags as text
    assert browser.title != "pwned" and "pwned" not in browser.execute_script("return document.title")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    assert "&lt;script&gt;" in browser.page_source
    nodes = browser.find_elements(By.CSS_SELECTOR, "#graph g.node")
    assert {n.get_attribute("data-label") for n in nodes} >= {"User:Alice", "User:Bob"} and len(nodes) == 3
    assert "vector answers" in browser.find_element(By.ID, "delivery").text
    shot(browser, "memory")
    browser.find_element(By.ID, "neighbours").click()  # the memories that share its entities too
    wait_url(browser, "neighbours=1")
    nodes = browser.find_elements(By.CSS_SELECTOR, "#graph g.node")
    labels = {n.get_attribute("data-label") for n in nodes}
    assert {"User:Alice", "User:Bob"} <= labels and len(nodes) >= 4  # itself, 2 entities, a neighbour
    assert browser.find_elements(By.CSS_SELECTOR, "#graph line.edge")
    assert browser.find_element(By.CSS_SELECTOR, "#graph a")  # a neighbour links to its own page
    delivery = browser.find_element(By.ID, "delivery").text
    assert "vector answers" in delivery and "graph answers" in delivery
    shot(browser, "memory-neighbours")
    assert csp_violations(browser) == []


def test_retry_a_delivery_set_aside(served: dict[str, Any], browser: Any) -> None:
    service: Served = served["service"]
    browser.get(service.url + "/console/outbox")
    rows = browser.find_elements(By.CSS_SELECTOR, "#set-aside tr.aside")
    assert len(rows) == 2 and all("timestamp too small" in r.text for r in rows)
    shot(browser, "outbox")
    ids = {r.get_attribute("data-row") for r in rows}
    row = rows[0].get_attribute("data-row")
    rows[0].find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
    browser.find_element(By.ID, "retry").click()
    wait_url(browser, "done=")
    assert browser.find_element(By.ID, "done").text == "retried 1"
    _, _, queue = service.request("/v1/outbox/list", {})
    # The other row is still aside; the retried one is queued (or set aside again by a later delivery,
    # the poison being still unreadable: which one depends on the service's timing, not on the console).
    assert ids - {row} <= {str(r["id"]) for r in queue}
    _, _, runs = service.request("/v1/runs", {"command": "console outbox retry"})
    assert runs[0]["actor"] == "console operator (browser-test)" and runs[0]["status"] == "ok"


def test_forget_a_memory_and_see_it_gone(served: dict[str, Any], browser: Any) -> None:
    service: Served = served["service"]
    browser.get(f"{service.url}/console/memories/{served['doomed']}")
    browser.find_element(By.ID, "forget").click()
    WebDriverWait(browser, 10).until(until.alert_is_present()).accept()  # the one script asks first
    wait_url(browser, "forgotten=")
    assert "Forgotten at" in browser.find_element(By.ID, "forgotten").text
    browser.get(service.url + "/console/memories?text=lighthouse&retrieval=lexical")
    assert served["doomed"] not in browser.page_source
    _, _, runs = service.request("/v1/runs", {"command": "console forget"})
    assert runs[0]["actor"] == "console operator (browser-test)"
    browser.get(service.url + "/console/runs")
    assert "console forget" in browser.find_element(By.ID, "runs").text
    dots = browser.find_elements(By.CSS_SELECTOR, "figure.chart svg circle.dot")  # the gate over the nights
    assert len(dots) == len(GATE) and browser.find_element(By.CSS_SELECTOR, "figure.chart polyline")
    heights = [float(d.get_attribute("cy")) for d in dots]  # oldest first: up, then down a little
    assert heights[1] < heights[0] and heights[1] < heights[2] < heights[0]
    assert len(browser.find_elements(By.CSS_SELECTOR, "details.night")) == len(GATE)
    shot(browser, "runs")
    browser.get(service.url + "/console/stats?metric=mood&bucket=1h")
    assert browser.find_elements(By.CSS_SELECTOR, "section.panel svg rect.bar")
    shot(browser, "stats")


def test_an_agent_token_cannot_open_another_agents_memory(served: dict[str, Any], browser: Any) -> None:
    service: Served = served["service"]
    sign_in(browser, service.url, served["agent"], then=f"/console/memories/{served['plain']}")
    assert browser.find_element(By.ID, "who").text.startswith("agent:support")
    browser.get(f"{service.url}/console/memories/{served['other']}")
    assert browser.title.startswith("404") and "no memory" in browser.find_element(By.ID, "error").text.lower()
    status, _, _ = service.request("/v1/get", {"id": served["other"]}, token=served["agent"])
    assert status == 404  # the same answer as HTTP's
    shot(browser, "agent-refused")
    browser.get(service.url + "/console/outbox")  # the operator's pages: refused, not shown
    assert browser.title.startswith("403")
    browser.find_element(By.CSS_SELECTOR, "form.who button").click()  # sign out
    wait_url(browser, "/console/login")
    browser.get(service.url + "/console/overview")
    assert "/console/login" in browser.current_url


def test_every_page_reads_without_javascript(served: dict[str, Any]) -> None:
    service: Served = served["service"]
    driver = _browser(javascript=False)
    try:
        sign_in(driver, service.url, served["operator"])
        assert "js" not in (driver.find_element(By.TAG_NAME, "html").get_attribute("class") or "")  # it did not
        for page in PAGES:
            driver.get(f"{service.url}/console/{page}")
            assert driver.find_element(By.TAG_NAME, "h1").text, page
            assert not driver.title.startswith(("4", "5")), (page, driver.title)
            shot(driver, f"{page}-nojs")
        driver.get(f"{service.url}/console/memories/{served['hostile']}")
        assert driver.find_elements(By.CSS_SELECTOR, "#graph g.node")  # drawn on the server
        shot(driver, "memory-nojs")
    finally:
        driver.quit()


# ---- the same service over plain HTTP: headers, cookies, CSRF (what a browser does not show) -----
class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _http(url: str, *, form: dict[str, str] | None = None, cookies: dict[str, str] | None = None) -> Any:
    """One request, redirects not followed: (status, headers, body text)."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if form is not None else "GET")
    if cookies:
        req.add_header("Cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()))
    try:
        with urllib.request.build_opener(_NoRedirect).open(req, timeout=60) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


def _signed_in(url: str, token: str) -> tuple[dict[str, str], Any]:
    status, headers, html = _http(url + "/console/login")
    nonce = SimpleCookie(headers["Set-Cookie"])["memoryctl_console_login"].value
    status, headers, _ = _http(
        url + "/console/login", form={"csrf": _csrf(html), "token": token}, cookies={"memoryctl_console_login": nonce}
    )
    assert status == 303, status
    jar = SimpleCookie(headers["Set-Cookie"])
    return {"memoryctl_console": jar["memoryctl_console"].value}, jar["memoryctl_console"]


def test_every_console_response_carries_the_csp(served: dict[str, Any]) -> None:
    url = served["service"].url
    cookies, _ = _signed_in(url, served["operator"])
    for path in (
        "/console/login",
        "/console/static/console.css",
        "/console/nowhere",
        *(f"/console/{p}" for p in PAGES),
        f"/console/memories/{served['plain']}",
    ):
        status, headers, _ = _http(url + path, cookies=None if path.endswith("login") else cookies)
        assert headers["Content-Security-Policy"].startswith("default-src 'none'; script-src 'self'"), path
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["Referrer-Policy"] == "no-referrer", path
        assert status == (404 if path.endswith("nowhere") else 200), (path, status)


def test_the_session_cookie_and_what_a_form_without_its_csrf_token_gets(served: dict[str, Any]) -> None:
    url = served["service"].url
    cookies, morsel = _signed_in(url, served["operator"])
    assert morsel["httponly"] and morsel["samesite"].lower() == "strict" and morsel["path"] == "/console"
    assert not morsel["secure"]  # plain HTTP on loopback; Secure when the request came over TLS
    assert served["operator"] not in morsel.value  # the token's digest, never the token
    target = f"{url}/console/memories/{served['plain']}/forget"
    for form in ({}, {"csrf": "forged"}, {"csrf": _csrf(_http(url + "/console/login")[2])}):
        status, _, html = _http(target, form=form, cookies=cookies)
        assert status == 403 and "CSRF" in html, (form, status)
    status, _, memory = served["service"].request("/v1/get", {"id": served["plain"]})
    assert status == 200 and memory["deleted_at"] is None  # nothing was forgotten
    status, _, html = _http(target, form={"csrf": "x"})  # no session at all
    assert status == 401
    status, _, html = _http(url + "/console/login", form={"csrf": "forged", "token": served["operator"]})
    assert status == 403  # the sign-in form has its own CSRF token


def test_a_deep_link_survives_signing_in(served: dict[str, Any]) -> None:
    url = served["service"].url
    status, headers, _ = _http(url + "/console/memories?text=green+tea&limit=3")
    assert status == 303
    status, headers, html = _http(url + headers["Location"])
    nonce = SimpleCookie(headers["Set-Cookie"])["memoryctl_console_login"].value
    assert 'name="next" value="/console/memories?text=green+tea&amp;limit=3"' in html
    form = {"csrf": _csrf(html), "token": served["operator"], "next": "/console/memories?text=green+tea&limit=3"}
    status, headers, _ = _http(url + "/console/login", form=form, cookies={"memoryctl_console_login": nonce})
    assert status == 303 and headers["Location"] == "/console/memories?text=green+tea&limit=3"


def test_logout_and_revocation_end_a_session_on_the_server(served: dict[str, Any]) -> None:
    url, service = served["service"].url, served["service"]
    cookies, _ = _signed_in(url, served["operator"])
    status, _, html = _http(url + "/console/overview", cookies=cookies)
    assert status == 200
    status, _, _ = _http(url + "/console/logout", form={"csrf": _csrf(html)}, cookies=cookies)
    assert status == 303
    status, headers, _ = _http(url + "/console/overview", cookies=cookies)  # the old cookie, replayed
    assert status == 303 and headers["Location"].startswith("/console/login")
    issued = service.request("/v1/token/issue", {"operator": True, "name": "revoked-soon"})[2]
    cookies, _ = _signed_in(url, issued["token"])
    assert _http(url + "/console/overview", cookies=cookies)[0] == 200
    service.request("/v1/token/revoke", {"ids": [issued["id"]]})
    assert _http(url + "/console/overview", cookies=cookies)[0] == 303  # revoked: signed out at once


def test_an_agent_session_cannot_forget_another_agents_memory_nor_drop_deliveries(served: dict[str, Any]) -> None:
    url, service = served["service"].url, served["service"]
    cookies, _ = _signed_in(url, served["agent"])
    status, _, html = _http(f"{url}/console/memories/{served['plain']}", cookies=cookies)  # its own: fine
    assert status == 200
    csrf = _csrf(html)  # a valid token of this session: what is refused is the agent, not the form
    status, _, page = _http(f"{url}/console/memories/{served['other']}/forget", form={"csrf": csrf}, cookies=cookies)
    assert status == 404 and "no memory" in page
    status, _, memory = service.request("/v1/get", {"id": served["other"]})
    assert status == 200 and memory["deleted_at"] is None
    status, _, page = _http(f"{url}/console/outbox/drop", form={"csrf": csrf, "all": "1"}, cookies=cookies)
    assert status == 403 and "may not run outbox drop" in page
    assert service.request("/v1/outbox/list", {})[2]  # still set aside


def test_drop_deliveries_set_aside_from_a_form(served: dict[str, Any]) -> None:
    url, service = served["service"].url, served["service"]
    cookies, _ = _signed_in(url, served["operator"])
    status, _, html = _http(url + "/console/outbox", cookies=cookies)
    rows = re.findall(r'name="row" value="(\d+)"', html)
    assert status == 200 and rows
    form = {"csrf": _csrf(html), "row": rows[0]}
    status, headers, _ = _http(url + "/console/outbox/drop", form=form, cookies=cookies)
    assert status == 303 and headers["Location"] == "/console/outbox?done=dropped+1"
    assert rows[0] not in {str(r["id"]) for r in service.request("/v1/outbox/list", {})[2]}
    _, _, runs = service.request("/v1/runs", {"command": "console outbox drop"})
    assert runs[0]["actor"] == "console operator (browser-test)" and runs[0]["details"]["params"]["rows"] == [
        int(rows[0])
    ]
