"""The dashboard in narrower windows, in headless Chromium against a real server: the page
never scrolls sideways (the document's scrollWidth stays within its clientWidth) after a
resize from 1280 px to 800 px, nor when loaded at 1024, 800 or 390 px, and the trial table's
knobs column keeps a readable width (a table too wide for the window scrolls inside its own
box). Two studies: the Bridge-style 16-knob sim study (examples/bridge_moe_sim.yaml, run
through ``dse start``) and the CPU demo's space with its few knobs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dse.cli.main import main
from tests.api.live import serve
from tests.api.seed import seed_cpu_demo, seed_database
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.slow

STUDIES = ["bridge-moe-sim", "cpu-demo"]
#: Window widths (px) in the order the page sees them: loaded at the first, resized to the rest.
PLANS = [(1280, 800), (800,), (1024,), (390,)]

#: The document's scroll and client width, and what sticks out past the window: elements
#: (outside the charts' SVG) whose box, or whose content where it is not clipped, ends right of
#: the document's client width once cut by the boxes that clip or scroll it.
OVERFLOW_JS = """() => {
  const doc = document.scrollingElement, w = doc.clientWidth;
  const clips = (e) => getComputedStyle(e).overflowX !== 'visible';
  const out = [];
  for (const e of document.querySelectorAll('body *')) {
    if (e.closest('svg') || !e.getClientRects().length) continue;
    const r = e.getBoundingClientRect();
    let right = clips(e) ? r.right : Math.max(r.right, r.left + e.scrollWidth);
    for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      if (clips(a)) right = Math.min(right, a.getBoundingClientRect().right);
    }
    if (right > w + 0.5) out.push(`${e.tagName.toLowerCase()}#${e.id}.${e.className} ${right}`);
  }
  return { scrollWidth: doc.scrollWidth, clientWidth: w, outside: out.slice(0, 8) };
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("narrow")
    url = f"sqlite:///{tmp / 'narrow.db'}"
    argv = ["start", "--space", str(EXAMPLES / "bridge_moe_sim.yaml"), "--storage", url,
            "--workdir", str(tmp / "runs"), "--n-trials", "16"]  # fmt: skip
    assert main(argv) == 0
    seed_database(url, seed_cpu_demo)
    with serve(url, api_token=None, poll_interval_s=60.0) as base:
        yield base


@pytest.fixture(scope="module")
def context_args() -> dict[str, Any]:
    return {"viewport": {"width": 1280, "height": 900}}


def _settle(page: Any) -> None:
    """Wait until the charts have been drawn for the window's width (the resize handler waits
    200 ms before it draws the parallel coordinates again)."""
    page.wait_for_function(
        "[...document.querySelectorAll('#study-view .chart')].every((c) =>"
        " c.dataset.rendered !== 'false' || c.closest('[hidden]'))"
    )
    page.wait_for_timeout(700)


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "-".join(map(str, p)))
@pytest.mark.parametrize("study", STUDIES)
def test_the_page_does_not_scroll_sideways(
    browser: Any, site: str, study: str, plan: tuple[int, ...]
) -> None:
    context = browser.new_context(viewport={"width": plan[0], "height": 900}, bypass_csp=True)
    page = context.new_page()
    try:
        page.goto(f"{site}/#study={study}")
        page.wait_for_selector(f'#study-view[data-study="{study}"][data-rendered="true"]')
        # a trial's detail open as well (its parameters and step charts)
        page.click('#trial-table tbody tr[data-number="1"]')
        page.wait_for_selector("#trial-detail:not([hidden])")
        _settle(page)
        for width in plan[1:]:
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_function(f"document.scrollingElement.clientWidth <= {width}")
            _settle(page)
        got = page.evaluate(OVERFLOW_JS)
        assert got["scrollWidth"] <= got["clientWidth"], got
        assert got["outside"] == [], got
        # the knobs stay readable: their column is never squeezed to nothing
        knobs = page.evaluate(
            """() => [...document.querySelectorAll('#trial-table td.params')]
                .map((td) => [td.clientWidth, td.scrollWidth])"""
        )
        assert knobs and all(cw >= 120 and sw <= cw + 1 for cw, sw in knobs), knobs
    finally:
        context.close()


@pytest.mark.parametrize("study", STUDIES)
def test_at_1280_px_the_trial_table_fits_without_scrolling(
    page: Any, site: str, study: str
) -> None:
    """The tables' minimum widths leave the 1280 px layout as it was: nothing to scroll."""
    page.goto(f"{site}/#study={study}")
    page.wait_for_selector(f'#study-view[data-study="{study}"][data-rendered="true"]')
    box = page.evaluate(
        """() => { const b = document.querySelector('#trial-table').closest('.table-scroll');
                   return [b.scrollWidth, b.clientWidth]; }"""
    )
    assert box[0] <= box[1], box
