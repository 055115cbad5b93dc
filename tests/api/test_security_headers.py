"""Security headers (dse/api/security.py) on every kind of answer, and the dashboard working in
Chromium under its content security policy (no violation reported while it draws a study)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dse.api import Settings, create_app
from dse.api.security import API_CSP, DASHBOARD_CSP
from dse.storage import open_storage
from tests.api.conftest import TestClient
from tests.api.live import serve
from tests.api.seed import create_study, seed_all, seed_database

V1 = "/api/v1"


def _db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    storage = open_storage(url)
    try:
        create_study(storage, "s1")
    finally:
        storage.close()
    return url


@pytest.mark.parametrize(
    ("path", "status", "csp"),
    [
        ("/", 200, DASHBOARD_CSP),
        ("/static/dashboard.js", 200, DASHBOARD_CSP),
        ("/static/no-such-file.js", 404, DASHBOARD_CSP),
        (f"{V1}/studies", 200, API_CSP),
        (f"{V1}/studies/s1", 200, API_CSP),
        (f"{V1}/studies/s1/best", 404, API_CSP),  # no complete trial yet: a dse error
        (f"{V1}/studies/nope", 404, API_CSP),
        (f"{V1}/health", 200, API_CSP),
        (f"{V1}/openapi.json", 200, API_CSP),
        (f"{V1}/docs", 200, None),  # Swagger UI: its CDN and inline script, no policy
    ],
)
def test_every_answer_carries_the_headers(
    tmp_path: Path, path: str, status: int, csp: str | None
) -> None:
    app = create_app(settings=Settings(storage=_db(tmp_path)))
    with TestClient(app) as c:
        r = c.get(path)
    assert r.status_code == status, r.text
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers.get("content-security-policy") == csp


def test_the_dashboard_policy_runs_only_its_own_scripts() -> None:
    directives = dict(d.split(" ", 1) for d in DASHBOARD_CSP.split("; "))
    script = directives["script-src"].split()
    assert "'unsafe-inline'" not in script and "'unsafe-eval'" not in script
    assert [s for s in script if not s.startswith("'")] == []  # no other origin
    assert directives["connect-src"] == "'self'" and directives["object-src"] == "'none'"
    assert directives["frame-ancestors"] == "'none'"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('csp') / 'dash.db'}"
    seed_database(url, seed_all)
    with serve(url, api_token=None, poll_interval_s=0.5) as base:
        yield base


_WATCH = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI);
});
"""


def _until(page: Any, expr: str, timeout_s: float = 30.0) -> None:
    """Wait until ``expr`` is true in the page (polled through the browser's debugging
    protocol: Playwright's wait_for_function runs eval in the page, which the policy
    forbids)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expr):
        assert time.monotonic() < deadline, f"timed out waiting for {expr}"
        page.wait_for_timeout(100)


@pytest.mark.slow
def test_the_dashboard_draws_a_study_under_its_policy(browser: Any, site: str) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=False)
    page = context.new_page()
    console: list[str] = []
    errors: list[str] = []
    page.on("console", lambda m: console.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.add_init_script(_WATCH)
    try:
        resp = page.goto(site + "/")
        assert resp.headers["content-security-policy"] == DASHBOARD_CSP
        _until(page, "document.querySelectorAll('#study-list li').length === 4")
        page.click('#study-list li[data-study="llama-seeded"]')
        page.wait_for_selector('#study-view[data-rendered="true"]')
        for chart in ("#chart-history", "#chart-pareto", "#chart-parcoords"):
            assert page.locator(chart).get_attribute("data-rendered") == "true"
            assert page.locator(f"{chart} .main-svg").count() >= 1, chart
        page.locator("#trial-table tbody tr").first.click()
        page.wait_for_timeout(500)
        assert page.evaluate("window.Plotly !== undefined")
        assert page.evaluate("window.__cspViolations") == []
        assert not [m for m in console if "Content Security Policy" in m], console
        assert errors == []
    finally:
        context.close()
