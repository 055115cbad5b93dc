"""The parallel-coordinates chart of a 16-knob study in headless Chromium (Playwright, the
system browser) against a real server: at 1280 px no two axis labels overlap, every label
stays inside the chart, its tooltip gives the full knob name, and the page does not scroll
sideways. The study is the Bridge-style 16-knob MoE space (examples/bridge_moe_sim.yaml) run
through ``dse start`` on the sim workload.

``DSE_VIEWS_SHOT=1`` writes the chart to docs/results/dashboard_parcoords_16knobs.png."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.cli.main import main
from tests.api.live import serve
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.slow

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
STUDY = "bridge-moe-sim"
SPACE = EXAMPLES / "bridge_moe_sim.yaml"
KNOBS = list(yaml.safe_load(SPACE.read_text())["knobs"])

#: Each axis label's text, full name (its tooltip, else its text) and box in the page (px);
#: the labels are the chart's bold annotations (the value ticks are plain).
LABELS_JS = """() => {
  const div = document.querySelector('#chart-parcoords');
  const ann = div.layout.annotations;
  return [...div.querySelectorAll('g.annotation')]
    .filter((g) => ann[Number(g.dataset.index)].text.startsWith('<b>'))
    .map((g) => { const r = g.querySelector('.annotation-text').getBoundingClientRect();
      const a = ann[Number(g.dataset.index)];
      return { index: Number(g.dataset.index), text: g.textContent,
               full: a.hovertext || g.textContent,
               left: r.left, right: r.right, top: r.top, bottom: r.bottom }; });
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("parcoords")
    url = f"sqlite:///{tmp / 'pc.db'}"
    argv = ["start", "--space", str(SPACE), "--storage", url, "--workdir", str(tmp / "runs"),
            "--n-trials", "16"]  # fmt: skip
    assert main(argv) == 0
    with serve(url, api_token=None, poll_interval_s=60.0) as base:
        yield base


def _open(page: Any, base: str) -> list[dict[str, Any]]:
    page.goto(f"{base}/#study={STUDY}")
    page.wait_for_selector(f'#study-view[data-study="{STUDY}"][data-rendered="true"]')
    page.wait_for_function(
        "document.querySelector('#chart-parcoords').dataset.rendered === 'true'"
    )
    return list(page.evaluate(LABELS_JS))


def _overlaps(labels: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if (a["left"] < b["right"] and b["left"] < a["right"]
                    and a["top"] < b["bottom"] and b["top"] < a["bottom"]):  # fmt: skip
                out.append((a["full"], b["full"]))
    return out


def test_sixteen_knob_labels_do_not_overlap_at_1280_px(page: Any, site: str) -> None:
    labels = _open(page, site)
    # one axis per knob (each varies over the study's trials) and the objective
    assert sorted(x["full"] for x in labels) == sorted([*KNOBS, "tflops_per_gpu"])
    assert _overlaps(labels) == []
    chart = page.locator("#chart-parcoords").bounding_box()
    for x in labels:  # inside the chart: nothing cut at its edges
        assert chart["x"] <= x["left"] and x["right"] <= chart["x"] + chart["width"], x
        assert chart["y"] <= x["top"] and x["bottom"] <= chart["y"] + chart["height"], x
        assert x["text"] == x["full"]  # short enough to show whole
    sizes = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert sizes[0] <= sizes[1], sizes
    if os.environ.get("DSE_VIEWS_SHOT"):
        page.locator("#chart-parcoords").screenshot(
            path=str(RESULTS / "dashboard_parcoords_16knobs.png")
        )


def test_a_label_shows_the_full_knob_name_on_hover(page: Any, site: str) -> None:
    _open(page, site)
    page.locator("#chart-parcoords").scroll_into_view_if_needed()
    labels = page.evaluate(LABELS_JS)
    x = next(x for x in labels if x["full"] == "moe_token_dispatcher_type")
    page.mouse.move((x["left"] + x["right"]) / 2, (x["top"] + x["bottom"]) / 2)
    tip = page.locator("#chart-parcoords .hovertext")
    tip.first.wait_for()
    assert "moe_token_dispatcher_type" in tip.first.text_content()


def test_labels_are_laid_out_again_for_a_narrower_window(page: Any, site: str) -> None:
    _open(page, site)
    page.set_viewport_size({"width": 800, "height": 900})
    # the resize handler waits 200 ms, then the chart is drawn again at its new width
    page.wait_for_function("document.querySelector('#chart-parcoords').offsetWidth < 800")
    page.wait_for_timeout(800)
    labels = page.evaluate(LABELS_JS)
    assert len(labels) == len(KNOBS) + 1 and _overlaps(labels) == []
    chart = page.locator("#chart-parcoords").bounding_box()
    assert chart["width"] < 800
    for x in labels:
        assert chart["x"] <= x["left"] and x["right"] <= chart["x"] + chart["width"], x


def test_sim_trials_and_their_losses_are_labelled_estimates(page: Any, site: str) -> None:
    """The study runs on the sim workload: its rows carry the estimate flag and its loss
    curves say they are simulated, not trained."""
    _open(page, site)
    rows = page.locator("#trial-table tbody tr")
    assert rows.count() > 0
    assert page.locator(
        '#trial-table tbody tr[data-source="estimate"] .flag.estimate'
    ).count() == (rows.count())
    # every estimate says how far it is to be trusted (calibrated / interpolated /
    # extrapolated), its basis and band in the title
    trust = page.locator('#trial-table tbody tr[data-source="estimate"] .flag[data-flag="trust"]')
    labels = set(trust.all_text_contents())
    assert labels and labels <= {"calibrated", "interpolated", "extrapolated"}, labels
    assert "basis:" in (trust.first.get_attribute("title") or "")
    page.check('#trial-table input.pick[data-number="1"]')
    page.wait_for_function("document.querySelector('#chart-losses').dataset.traces === '2'")
    assert page.locator("#chart-losses").get_attribute("data-simulated") == "true"
    assert "simulated (sim workload" in page.locator("#note-losses").text_content()
    names = page.evaluate("() => document.querySelector('#chart-losses').data.map((t) => t.name)")
    assert names == ["baseline (trial 0) · simulated", "trial 1 · simulated"]
    page.click('#trial-table tbody tr[data-number="1"]')
    page.wait_for_function(
        "document.querySelector('#chart-steps-loss').dataset.rendered === 'true'"
        " && document.querySelector('#chart-steps-loss').dataset.source === 'estimate'"
    )
    assert "simulated" in page.locator("#note-steps-loss").text_content()
