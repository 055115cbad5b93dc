"""The report of a 20+-knob study (the Nemotron Omni space on the sim workload), in Chromium:
the slices are small multiples in rows (the PNG was 5200 x 280, a strip of unreadable plots),
every knob has its importance label, and the page calls its figures estimates.

``DSE_REPORT_SHOT=1`` writes docs/results/report_omni_sim.png (the whole page)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from dse.cli.main import main
from tests.api.live import chromium
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.slow
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _png_size(p: Path) -> tuple[int, int]:
    w, h = struct.unpack(">II", p.read_bytes()[16:24])
    return w, h


def test_the_report_of_a_20_knob_sim_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'omni.db'}"
    assert main(["start", "--space", str(EXAMPLES / "nemotron_omni.yaml"), "--workload", "sim",
                 "--n-trials", "10", "--storage", url]) == 0  # fmt: skip
    out = tmp_path / "rep"
    assert main(["report", "--storage", url, "-o", str(out)]) == 0
    w, h = _png_size(out / "slices.png")
    assert w <= 1200 and h >= 4 * 200, (w, h)  # 4 columns, 5+ rows of small multiples
    page_html = (out / "report.html").read_text()
    assert "<p class='note'>estimate (cost model, not measured)</p>" in page_html
    assert "measured step time" not in page_html
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto((out / "report.html").as_uri())
        widths = page.evaluate(
            "() => [...document.images].map((i) => [i.id, i.naturalWidth, i.clientWidth])"
        )
        assert widths and all(c <= 1000 for _, _, c in widths), widths
        sl = next(x for x in widths if x[0] == "plot-slices")
        assert sl[2] >= 0.8 * min(sl[1], 1000)  # shown near its size: readable, not shrunk
        assert page.evaluate("document.documentElement.scrollWidth") <= 1100
        # the Bridge overrides: each (and each export line's word) on one line, the text
        # unchanged; the Omni best has no Megatron-LM export, and the report says why
        args = page.evaluate(
            "() => [...document.querySelectorAll('#export-bridge .arg')]"
            ".map((s) => s.getClientRects().length)"
        )
        assert len(args) > 10 and set(args) == {1}
        import json

        exports = json.loads((out / "report.json").read_text())["exports"]
        assert page.locator("#export-bridge").text_content() == exports["bridge"]
        assert (
            exports["megatron"] is None and "no Megatron-LM equivalent" in exports["megatron_why"]
        )
        assert exports["megatron_why"] in page.locator("#export-megatron").text_content()
        if os.environ.get("DSE_REPORT_SHOT"):
            page.screenshot(path=str(RESULTS / "report_omni_sim.png"), full_page=True)
        page.close()
