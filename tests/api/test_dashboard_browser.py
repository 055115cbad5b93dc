"""The dashboard in headless Chromium (Playwright, the system browser) against a real uvicorn
server on a seeded SQLite study: lists, charts, table, trial detail, live updates."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dse.storage import open_storage
from tests.api.live import TIMEOUT_MS, colors, has_color, serve
from tests.api.seed import Seeded, _run, ok, seed_all, seed_database

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, dict[str, Seeded]]]:
    """(base URL, database URL, seeds) of a live server with poll interval 0.5 s."""
    url = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'dash.db'}"
    seeds = seed_database(url, seed_all)
    with serve(url, api_token=None, poll_interval_s=0.5) as base:
        yield base, url, seeds


@pytest.fixture(scope="module")
def context_args() -> dict[str, Any]:
    return {"viewport": {"width": 1400, "height": 1000}}


def _count(page: Any, selector: str) -> int:
    return int(page.locator(selector).count())


def test_dashboard_renders_a_study(
    page: Any, site: tuple[str, str, dict[str, Seeded]], tmp_path: Path
) -> None:
    base, _, seeds = site
    main = seeds["main"]
    page.goto(base + "/")
    page.wait_for_function("document.querySelectorAll('#study-list li').length === 4")
    assert page.locator("#study-count").get_attribute("data-count") == "4"

    page.click('#study-list li[data-study="llama-seeded"]')
    page.wait_for_selector('#study-view[data-rendered="true"]')

    # charts drawn by plotly
    for chart in ("#chart-history", "#chart-pareto", "#chart-parcoords"):
        assert page.locator(chart).get_attribute("data-rendered") == "true"
        assert _count(page, f"{chart} .main-svg") >= 1, chart
    # the table: one row per trial
    assert _count(page, "#trial-table tbody tr") == main.n_trials
    assert page.locator("#page-info").get_attribute("data-count") == str(main.n_trials)
    # summary badges
    for key, n in main.counts.items():
        if key in ("total", "complete", "running", "queued", "failed", "infeasible"):
            badge = page.locator(f"#badge-{key}")
            assert badge.get_attribute("data-count") == str(n), key
    assert page.locator("#badge-rejections").get_attribute("data-count") == "2"
    gpu_h = float(page.locator("#badge-gpu-hours").get_attribute("data-value"))
    assert gpu_h == pytest.approx(main.gpu_seconds / 3600)
    assert float(page.locator("#badge-best").get_attribute("data-value")) == main.best_value
    # Pareto chart: complete and failure markers (OOM, invalid, predicted OOM, other)
    pareto = page.locator("#chart-pareto")
    assert pareto.get_attribute("data-failed-count") == str(main.n_failed_markers)
    assert pareto.get_attribute("data-complete-count") == "3"
    assert pareto.get_attribute("data-front-count") == str(len(main.front))
    assert _count(page, "#chart-pareto .scatterlayer .point") == 3 + main.n_failed_markers
    legend = page.locator("#chart-pareto .legendtext").all_text_contents()
    assert any(t.startswith("OOM") for t in legend)
    assert any(t.startswith("predicted OOM") for t in legend)
    assert any(t.startswith("invalid") for t in legend)
    assert "Pareto front" in legend
    # history: one point per complete trial
    assert page.locator("#chart-history").get_attribute("data-points") == "3"
    assert _count(page, "#chart-history .scatterlayer .point") == 3
    # rejections
    assert _count(page, "#rejection-table tbody tr") == 2
    assert _count(page, '#trial-table tbody tr[data-failure-class="oom"]') == 1

    # a row click shows the trial's step curves and its failure reason
    page.click('#trial-table tbody tr[data-number="3"]')
    page.wait_for_selector("#trial-detail[data-trial-id]:not([hidden])")
    page.wait_for_function(
        "document.querySelector('#chart-steps-loss').dataset.rendered === 'true'"
    )
    assert "out of memory" in page.locator("#detail-reason").inner_text()
    page.click('#trial-table tbody tr[data-number="1"]')
    page.wait_for_function("document.querySelector('#detail-number').textContent === '1'")
    page.wait_for_function("document.querySelector('#chart-steps-loss').dataset.points === '4'")
    assert _count(page, "#chart-steps-loss .main-svg") >= 1
    assert _count(page, "#chart-steps-time .main-svg") >= 1

    # screenshots: not blank; the OOM marker red is on the chart
    shot = page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
    assert (tmp_path / "dashboard.png").stat().st_size > 30_000
    chart = page.locator("#chart-pareto").screenshot(path=str(tmp_path / "pareto.png"))
    hist = colors(chart)
    assert len(hist) > 20, "the Pareto chart looks blank"
    assert max(hist.values()) < 0.99 * sum(hist.values())
    assert has_color(hist, (0xD6, 0x27, 0x28)) > 10  # OOM markers
    assert has_color(hist, (0x1F, 0x77, 0xB4)) > 10  # complete trials
    assert len(shot) > 30_000

    assert page.errors == []  # type: ignore[attr-defined]
    foreign = [u for u in page.urls if not u.startswith(base)]  # type: ignore[attr-defined]
    assert foreign == [], "the dashboard must load nothing from another host"


def test_dashboard_updates_live(page: Any, site: tuple[str, str, dict[str, Seeded]]) -> None:
    base, url, seeds = site
    page.goto(base + "/#study=llama-seeded-b")
    page.wait_for_selector('#study-view[data-rendered="true"]')
    assert page.locator("#study-view").get_attribute("data-study") == "llama-seeded-b"
    assert _count(page, "#trial-table tbody tr") == 1

    storage = open_storage(url)
    try:
        params = {"tensor_model_parallel_size": 2, "micro_batch_size": 2,
                  "use_distributed_optimizer": False}  # fmt: skip
        _run(storage, seeds["b"].study_id, params, ok(400.0, 75.0), gpu_seconds=5.0)
    finally:
        storage.close()
    page.wait_for_function("document.querySelectorAll('#trial-table tbody tr').length === 2")
    page.wait_for_function("document.querySelector('#badge-best').dataset.value === '400'")
    page.wait_for_function("document.querySelector('#chart-history').dataset.points === '2'")
    assert page.errors == []  # type: ignore[attr-defined]


def test_dashboard_shows_an_empty_database(browser: Any, tmp_path: Path) -> None:
    with serve(f"sqlite:///{tmp_path / 'empty.db'}", api_token=None) as base:
        pg = browser.new_page()
        try:
            pg.goto(base + "/")
            pg.wait_for_selector("#no-studies:not([hidden])", timeout=TIMEOUT_MS)
            assert pg.locator("#study-view").is_hidden()
        finally:
            pg.close()
