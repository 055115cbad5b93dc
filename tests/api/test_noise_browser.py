"""One interval per trial, whichever view shows it (issue 35), in headless Chromium against a
real server on a seeded SQLite database: every complete trial's interval in the trials table
is its configuration's as the server computed it (the trials of one configuration show the
same one), the best panel shows the best's and the tied configurations' the same, the
comparison view the same again; no interval of a step time or a throughput reaches 0 (the
runs' own recorded step-time intervals start at 0: the table used to show those)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.live import serve
from tests.api.seed import seed_database
from tests.api.seed_noise import seed_noise

pytestmark = pytest.mark.slow

V1 = "/api/v1"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('noise-browser') / 'noise.db'}"
    seed_database(url, seed_noise)
    with serve(url, api_token=None, poll_interval_s=60.0) as base:
        yield base


def _ci(attr: str | None) -> list[float] | None:
    return None if attr is None else json.loads(attr)


def test_every_view_shows_one_interval_per_trial(page: Any, site: str) -> None:
    base = site
    page.goto(f"{base}/#study=noise-a")
    page.wait_for_selector('#study-view[data-study="noise-a"][data-rendered="true"]')
    page.wait_for_selector('#best-panel[data-state="shown"]')
    page.wait_for_selector('#compare-table tbody tr[data-study="noise-a"]')
    api = page.request.get(f"{base}{V1}/studies/noise-a/trials?limit=100").json()
    best = page.request.get(f"{base}{V1}/studies/noise-a/best").json()

    # the trials table: each complete row's TFLOP/s and step-time intervals, as drawn
    rows = page.evaluate(
        """() => [...document.querySelectorAll('#trial-table tbody tr')].map((tr) => ({
            number: Number(tr.dataset.number), state: tr.dataset.state,
            tflops: tr.children[3].dataset.ci || null, step: tr.children[5].dataset.ci || null,
        }))"""
    )
    assert len(rows) == 6 and all(r["state"] == "complete" for r in rows)
    table: dict[int, dict[str, list[float] | None]] = {}
    for r in rows:
        iv = api["intervals"][str(r["number"])]
        tf, st = _ci(r["tflops"]), _ci(r["step"])
        # the server's interval of the trial's configuration, not the trial's own [0, ...]
        assert tf == iv["figures"]["tflops_per_gpu"]["ci"], r
        assert st == iv["figures"]["step_time_s"]["ci"], r
        assert tf is not None and st is not None and tf[0] > 0 and st[0] > 0, r
        table[r["number"]] = {"tflops_per_gpu": tf, "step_time_s": st}
    # the runs of one configuration (trials 0, 3, 5) show one interval
    assert table[0] == table[3] == table[5]

    # the best panel: the best's figures with the same intervals as its rows
    number = best["trial"]
    assert page.locator("#best-panel").get_attribute("data-trial") == str(number)
    for k in ("tflops_per_gpu", "step_time_s"):
        shown = _ci(
            page.locator(f'#best-metrics div[data-metric="{k}"] .ci').get_attribute("data-ci")
        )
        assert shown == table[number][k], k
        assert shown is not None and shown[0] > 0
    # ... and each configuration tied with it, as its rows show it
    tied = best["noise"]["tied"]
    assert tied, "the seeded configurations within noise of the best are tied with it"
    for c in tied:
        assert c["ci"] == table[c["trial"]]["tflops_per_gpu"]
        text = page.locator(f'#best-tie .tie[data-trial="{c["trial"]}"]').inner_text()
        assert text.startswith(f"trial {c['trial']}: ")
    # the panel says what the intervals rest on, in the server's words
    assert page.locator("#best-noise").inner_text().endswith(best["noise"]["model"]["text"])
    # the clearly slower configuration is not tied, the slow step made no tie of its own
    assert {c["trial"] for c in tied} == {1}, tied

    # the comparison view: the study's best with the same intervals again
    row = page.locator('#compare-table tbody tr[data-study="noise-a"]')
    assert row.get_attribute("data-best-trial") == str(number)
    for k in ("tflops_per_gpu", "step_time_s"):
        shown = _ci(row.locator(f'td[data-metric="{k}"]').get_attribute("data-ci"))
        assert shown == table[number][k], k
    # every interval drawn anywhere on the page stays above 0
    lows = page.evaluate(
        """() => [...document.querySelectorAll('[data-ci]')]
            .map((e) => JSON.parse(e.dataset.ci)[0])"""
    )
    assert lows and min(lows) > 0
    assert page.errors == []  # type: ignore[attr-defined]
