"""The answers a user looks for on the dashboard, in headless Chromium against a real server:
the best configuration with its launcher overrides (copyable), the best row highlighted,
chart axes that fit the data, no horizontal scrolling at 1280 px, ``#study=`` in the URL,
and figures with four significant digits (the same rule as dse.core.figures)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from dse.core.figures import figure
from dse.space.searchspace import parse_space
from dse.storage import Storage
from tests.api.live import serve
from tests.api.seed import _run, create_from_dict, ok, seed_all, seed_cpu_demo, seed_database
from tests.conftest import EXAMPLES
from tests.core.test_figures import CASES

pytestmark = pytest.mark.slow

V1 = "/api/v1"


def _wide(storage: Storage) -> None:
    """Many knobs on 8 GPUs, long failure reasons and a predicted OOM far above the trials."""
    d = yaml.safe_load((EXAMPLES / "llama_1b_h200.yaml").read_text())
    d["study"] = "llama-1b-wide"
    d["resources"].update(world_size=8, features=[])
    d["knobs"] = {
        "tensor_model_parallel_size": {"values": [1, 2, 4]},
        "pipeline_model_parallel_size": {"values": [1, 2]},
        "context_parallel_size": {"values": [1, 2]},
        "micro_batch_size": {"values": [1, 2, 4]},
        "recompute": {"values": ["none", "selective", "full"]},
        "attention_backend": {"values": ["unfused", "sdpa"]},
        "use_distributed_optimizer": {"type": "bool"},
        "overlap_grad_reduce": {"type": "bool"},
        "overlap_param_gather": {"type": "bool"},
        "bias_activation_fusion": {"type": "bool"},
        "cross_entropy_loss_fusion": {"type": "bool"},
    }
    sid = create_from_dict(storage, d)
    space = parse_space(d, "wide")
    base = space.baseline()
    variants = [
        ({"micro_batch_size": 2, "attention_backend": "sdpa"}, ok(212.3456, 61.789)),
        ({"tensor_model_parallel_size": 2, "use_distributed_optimizer": True,
          "overlap_grad_reduce": True, "overlap_param_gather": True,
          "bias_activation_fusion": True, "cross_entropy_loss_fusion": True,
          "attention_backend": "unfused"}, ok(236.78912, 48.3012)),  # (sdpa: no export)
        ({"pipeline_model_parallel_size": 2}, ok(171.0, 39.5)),
    ]  # fmt: skip
    for change, outcome in variants:
        _run(storage, sid, {**base, **change}, outcome, gpu_seconds=480.0)
    from dse.core.records import Outcome

    reason = "RuntimeError: " + "x" * 300  # one long word: must wrap, not scroll
    _run(storage, sid, {**base, "context_parallel_size": 2},
         Outcome.failure("error", reason), gpu_seconds=20.0)  # fmt: skip
    params = {**base, "micro_batch_size": 4, "recompute": "none"}
    from dse.space.searchspace import params_key

    storage.add_rejection(
        study_id=sid, params=params, params_key=params_key(params), kind="predicted_oom",
        rule="costmodel", reason="predicted peak 301.0 GiB > 139.8 GiB x (1 + margin 0.25)",
        values={"predicted_peak_mem_gib": 301.0, "margin": 0.25},
    )  # fmt: skip


def _seed(storage: Storage) -> None:
    seed_all(storage)
    seed_cpu_demo(storage)
    _wide(storage)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('answers') / 'answers.db'}"
    seed_database(url, _seed)
    with serve(url, api_token=None, poll_interval_s=0.5) as base:
        yield base


@pytest.fixture(scope="module")
def context_args() -> dict[str, Any]:
    """The copy button writes the clipboard; the test reads it back."""
    return {
        "viewport": {"width": 1280, "height": 900},
        "permissions": ["clipboard-read", "clipboard-write"],
    }


def _open(page: Any, base: str, study: str) -> None:
    page.goto(f"{base}/#study={study}")
    page.wait_for_selector(f'#study-view[data-study="{study}"][data-rendered="true"]')


def _best(page: Any, base: str, study: str) -> dict[str, Any]:
    return dict(page.request.get(f"{base}{V1}/studies/{study}/best").json())


def test_best_panel_shows_metrics_and_copyable_overrides(page: Any, site: str) -> None:
    _open(page, site, "llama-1b-wide")
    best = _best(page, site, "llama-1b-wide")
    assert best["trial"] == 1
    panel = page.locator("#best-panel")
    page.wait_for_selector('#best-panel[data-trial="1"]')
    assert panel.get_attribute("data-state") == "shown"
    assert page.locator("#best-title").inner_text() == "trial 1"
    assert page.locator("#best-source").inner_text() == "measured"
    metrics = {
        page.locator(f"#best-metrics div:nth-child({i}) dt").inner_text(): page.locator(
            f"#best-metrics div:nth-child({i}) dd"
        ).inner_text()
        for i in range(1, page.locator("#best-metrics div").count() + 1)
    }
    assert metrics["TFLOP/s per GPU (objective)"] == "236.8"
    assert metrics["peak memory (GiB)"] == "48.30"
    assert metrics["step time (s)"] == "0.5000"
    assert "TFLOP/s per GPU" not in metrics  # the objective is shown once
    assert "tensor_model_parallel_size=2" in page.locator("#best-knobs").inner_text()

    # each launcher's overrides, exactly as the API (and `dse best --format X`) gives them
    for fmt in ("megatron", "bridge", "nemo"):
        page.click(f'#best-panel .tab[data-format="{fmt}"]')
        assert (
            page.locator(f'#best-panel .tab[data-format="{fmt}"]').get_attribute("aria-selected")
            == "true"
        )
        assert page.locator("#best-export").inner_text() == best["exports"][fmt]
    assert "--tensor-model-parallel-size 2" in best["exports"]["megatron"]

    page.click('#best-panel .tab[data-format="bridge"]')
    page.click("#copy-export")
    page.wait_for_selector('#copy-export[data-copied="true"]')
    assert page.evaluate("navigator.clipboard.readText()") == best["exports"]["bridge"]
    assert page.errors == []  # type: ignore[attr-defined]


def test_best_panel_without_a_complete_trial(page: Any, site: str) -> None:
    _open(page, site, "empty-study")
    assert page.locator("#best-panel").get_attribute("data-state") == "none"
    assert page.locator("#best-none").is_visible()
    assert page.errors == []  # type: ignore[attr-defined]


def test_the_best_row_is_highlighted(page: Any, site: str) -> None:
    _open(page, site, "llama-seeded")
    rows = page.locator("#trial-table tbody tr.best")
    assert rows.count() == 1
    assert rows.get_attribute("data-number") == "1"
    assert rows.get_attribute("data-best") == "true"
    best_bg = rows.evaluate("r => getComputedStyle(r).backgroundColor")
    other_bg = page.locator('#trial-table tbody tr[data-number="0"]').evaluate(
        "r => getComputedStyle(r).backgroundColor"
    )
    assert best_bg != other_bg


def test_table_badges_and_legends_use_four_significant_digits(page: Any, site: str) -> None:
    page.goto(site + "/")
    xs = [x for x, _ in CASES if x is not None]
    assert page.evaluate("xs => xs.map(fmt)", xs) == [figure(x) for x in xs]
    assert page.evaluate("[fmt(NaN), fmt(Infinity), fmt(null)]") == ["NaN", "inf", ""]
    _open(page, site, "llama-1b-wide")
    row = page.locator('#trial-table tbody tr[data-number="1"] td')
    # (the first line of each cell: the figure; its configuration's interval below it)
    assert [row.nth(i).inner_text().split("\n")[0] for i in (2, 3, 4, 5, 6)] == [
        "236.8", "236.8", "48.30", "0.5000", "480.0",
    ]  # fmt: skip
    assert page.locator("#badge-best b").inner_text() == "236.8"
    assert page.locator("#badge-gpu-hours b").inner_text() == "0.4056"  # 1460 GPU-s
    legend = page.locator("#chart-parcoords .legendtext").all_text_contents()
    numbers = [n for t in legend for n in re.findall(r"\d[\d.]*", t)]
    assert numbers and all(len(n.replace(".", "").lstrip("0")) == 4 for n in numbers), legend


def _ranges(page: Any, chart: str) -> tuple[list[float], list[float]]:
    r = page.evaluate(
        f"""() => {{ const l = document.querySelector('{chart}')._fullLayout;
        return [l.xaxis.range, l.yaxis.range]; }}"""
    )
    return r[0], r[1]


def test_pareto_axes_fit_the_cpu_demo(page: Any, site: str) -> None:
    _open(page, site, "cpu-demo")
    (x0, x1), (y0, y1) = _ranges(page, "#chart-pareto")
    # the trials span most of the chart instead of sitting at the origin
    assert 0.00347 / x1 > 0.8 and x0 <= 0
    assert 0.209 / y1 > 0.8 and y0 <= 0
    assert page.locator("#chart-pareto").get_attribute("data-clipped") == "0"


def test_a_predicted_oom_far_above_does_not_squash_the_trials(page: Any, site: str) -> None:
    _open(page, site, "llama-1b-wide")
    (_, x1), (_, y1) = _ranges(page, "#chart-pareto")
    # the range fits the measured trials and the GPU memory line (139.8 GiB), not 301 GiB
    assert 139.8 < y1 < 170
    assert 236.78912 / x1 > 0.8
    pareto = page.locator("#chart-pareto")
    assert pareto.get_attribute("data-clipped") == "1"
    legend = pareto.locator(".legendtext").all_text_contents()
    assert any(t.startswith("predicted OOM") and "1 above the chart" in t for t in legend)
    # the clipped point is drawn inside the chart, on its top edge, and says where it is
    trace = page.evaluate(
        """() => document.querySelector('#chart-pareto').data
            .find((t) => t.name.startsWith('predicted OOM'))"""
    )
    assert trace["y"][0] < y1 and trace["y"][0] > 139.8
    assert "301.0 GiB is above the chart" in trace["text"][0]


def test_no_horizontal_scrolling_at_1280_px(page: Any, site: str) -> None:
    for study in ("llama-1b-wide", "llama-seeded"):
        _open(page, site, study)
        page.click('#trial-table tbody tr[data-number="3"]')
        page.wait_for_selector("#trial-detail:not([hidden])")
        page.wait_for_function(
            "document.querySelector('#chart-steps-loss').dataset.rendered === 'true'"
        )
        nemo = page.locator('#best-panel .tab[data-format="nemo"]')
        if nemo.count():  # the longest overrides
            nemo.click()
        sizes = page.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert sizes[0] <= sizes[1], (study, sizes)
        wide = page.evaluate(
            """() => [...document.querySelectorAll('main *')]
                .filter((e) => e.getBoundingClientRect().right > innerWidth + 1)
                .map((e) => e.tagName + '#' + e.id + '.' + e.className).slice(0, 5)"""
        )
        assert wide == [], (study, wide)


def test_changing_the_url_hash_switches_the_study(page: Any, site: str) -> None:
    _open(page, site, "llama-seeded")
    assert page.locator("#trial-table tbody tr").count() == 9
    page.evaluate("location.hash = '#study=llama-seeded-b'")
    page.wait_for_selector('#study-view[data-study="llama-seeded-b"][data-rendered="true"]')
    assert page.locator("#trial-table tbody tr").count() == 1
    assert page.locator("#study-name").inner_text() == "llama-seeded-b"
    assert page.locator("#study-list li.selected").get_attribute("data-study") == "llama-seeded-b"
    page.wait_for_selector('#best-panel[data-trial="0"]')
    page.go_back()  # the previous hash: the previous study
    page.wait_for_selector('#study-view[data-study="llama-seeded"][data-rendered="true"]')
    assert page.locator("#trial-table tbody tr").count() == 9
    assert page.errors == []  # type: ignore[attr-defined]
