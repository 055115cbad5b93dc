"""Issue 29, the CPU demo in headless Chromium against a real server: a study whose trials
time each step by CPU time (``measurement.clock: cpu``, examples/demo_cpu.yaml) says so
wherever its step time is shown (the best panel "CPU time per step (s)" with the wall time
beside it, the trials table, the trial's step chart, the comparison of the model's studies);
the same study timed by wall time keeps "step time (s)" and shows no wall time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.live import api_get, open_study, serve
from tests.api.seed import seed_cpu_clock, seed_database

pytestmark = pytest.mark.slow

CPU, WALL = "demo-cpu-clock", "demo-wall-clock"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("cpu-clock")
    url = f"sqlite:///{tmp / 'clock.db'}"

    def fill(st: Any) -> None:
        seed_cpu_clock(st, CPU)
        seed_cpu_clock(st, WALL, clock="wall")

    seed_database(url, fill)
    with serve(url, api_token=None, poll_interval_s=60.0) as base:
        yield base


@pytest.fixture(scope="module")
def context_args() -> dict[str, Any]:
    return {"viewport": {"width": 1400, "height": 1000}}


def test_a_cpu_clock_study_says_cpu_time_with_the_wall_time_beside(page: Any, site: str) -> None:
    best = api_get(site, f"/studies/{CPU}/best")
    m = best["metrics"]
    assert m["step_clock"] == "cpu" and m["step_wall_time_s"] == pytest.approx(0.1998)
    open_study(page, site, CPU)
    step = page.locator('#best-metrics div[data-metric="step_time_s"]')
    assert step.get_attribute("data-clock") == "cpu"
    assert step.locator("dt").text_content() == "CPU time per step (s)"
    assert float(step.locator("dd").get_attribute("data-value")) == pytest.approx(m["step_time_s"])
    wall = step.locator(".wall")
    assert wall.is_visible() and "s wall" in wall.text_content()
    assert float(wall.get_attribute("data-wall")) == pytest.approx(m["step_wall_time_s"])
    # the trials table: the column says CPU time, each row its wall time beside it
    page.wait_for_selector("#trial-table tbody tr")
    assert page.locator("#th-step").text_content() == "CPU s per step"
    cells = page.locator('#trial-table tbody td[data-clock="cpu"]')
    assert cells.count() == 3
    walls = [float(w) for w in cells.locator(".wall").evaluate_all(
        "(ws) => ws.map((w) => w.dataset.wall)")]  # fmt: skip
    assert sorted(walls) == pytest.approx([0.1998, 0.2152, 0.4414])
    # a trial's step chart
    page.locator(f'#trial-table tbody tr[data-number="{best["trial"]}"]').click()
    page.wait_for_selector('#chart-steps-time[data-clock="cpu"]')
    assert "CPU time per step" in page.locator("#caption-steps-time").text_content()
    # the comparison of the model's two studies: CPU time on its row only
    page.wait_for_selector(f'#compare-table tbody tr[data-study="{WALL}"]')
    mine = page.locator(
        f'#compare-table tbody tr[data-study="{CPU}"] td[data-metric="step_time_s"]'
    )
    assert mine.get_attribute("data-clock") == "cpu" and "s wall" in mine.text_content()
    other = page.locator(
        f'#compare-table tbody tr[data-study="{WALL}"] td[data-metric="step_time_s"]'
    )
    assert other.get_attribute("data-clock") is None and "wall" not in other.text_content()


def test_a_wall_clock_study_keeps_its_step_time_label(page: Any, site: str) -> None:
    m = api_get(site, f"/studies/{WALL}/best")["metrics"]
    assert "step_clock" not in m and "step_wall_time_s" not in m
    open_study(page, site, WALL)
    step = page.locator('#best-metrics div[data-metric="step_time_s"]')
    assert step.locator("dt").text_content() == "step time (s)"
    assert step.get_attribute("data-clock") is None and step.locator(".wall").count() == 0
    page.wait_for_selector("#trial-table tbody tr")
    assert page.locator("#th-step").text_content() == "step s"
    assert page.locator('#trial-table tbody td[data-clock="cpu"]').count() == 0
