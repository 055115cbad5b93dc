"""``dse report``: the report of the replay study of the measured H200 table
(examples/replay_llama1b.yaml), opened in headless Chromium; its figures match
``dse status --format json``. The screenshot goes to docs/results/ when DSE_REPORT_SHOT is set."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dse.cli.main import main
from dse.core.figures import figure
from tests.api.live import chromium, serve

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


@pytest.fixture(scope="module")
def report_dir(replay_study: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    rc = main(["report", "--storage", replay_study, "-o", str(out),
               "--cost-per-gpu-hour", "3.0", "--tokens", "1e12"])  # fmt: skip
    assert rc == 0
    return out


def _status(url: str, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert main(["status", "--storage", url, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_files(report_dir: Path) -> None:
    for name in ("report.html", "report.md", "history.png", "pareto.png", "importance.png",
                 "slices.png", "failures.png", "timeline.png", "losses.png"):  # fmt: skip
        p = report_dir / name
        assert p.stat().st_size > 0, name
        if name.endswith(".png"):
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (report_dir / "report.html").read_text()
    assert "src='http" not in page and "<script src" not in page  # self-contained
    assert page.count("data:image/png;base64,") == 7  # no other study of the model: no comparison
    assert not (report_dir / "compare.png").exists()
    md = (report_dir / "report.md").read_text()
    assert "(estimate)" in md and "![pareto](pareto.png)" in md


def test_report_in_chromium_matches_status(
    replay_study: str, report_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    st = _status(replay_study, capsys)
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto((report_dir / "report.html").as_uri())

        def cell(i: str) -> str:
            return page.locator(f"#{i}").inner_text().strip()

        best = st["best"]
        assert cell("best-trial") == str(best["number"])
        assert cell("best-value") == figure(best["value"])
        assert cell("best-tflops") == figure(best["metrics"]["tflops_per_gpu"])
        assert cell("best-step") == figure(best["metrics"]["step_time_s"])
        assert cell("best-mem") == figure(best["metrics"]["peak_mem_gib"])
        shown = json.loads(cell("best-params"))
        assert {k: shown[k] for k in best["params"]} == best["params"]
        for k in ("total", "complete", "failed", "infeasible"):
            assert cell(f"count-{k}") == str(st["counts"][k])
        assert cell("count-rejected") == str(sum(st["rejections"].values()))
        assert "--micro-batch-size " + str(best["params"]["micro_batch_size"]) in cell(
            "export-megatron"
        )
        # the projection: 1e12 tokens at the best measured step time (an estimate)
        steps = 1e12 / (8 * 4096)
        assert cell("proj-best-days") == figure(steps * best["metrics"]["step_time_s"] / 86400)
        # the timeline: every trial of the replay ran, on the local runner's two slots (no GPU
        # indices recorded: lanes from overlaps); the losses over the baseline trial's
        ran = sum(st["counts"][k] for k in ("complete", "failed", "infeasible"))
        assert cell("timeline-note").startswith(f"2 slots, {ran} trials, {ran} runs")
        assert "overlapping run times" in cell("timeline-note")
        # the loss-parity guard (on by default) names the baseline it compared against
        assert cell("losses-note").startswith(
            "baseline: trial 0 (the trial the numerics check compared against)"
        )
        assert f"trials {best['number']}" in cell("losses-note")
        for img in ("history", "pareto", "importance", "slices", "failures", "timeline", "losses"):
            assert page.locator(f"#plot-{img}").evaluate("e => e.naturalWidth") > 100
        if os.environ.get("DSE_REPORT_SHOT"):
            RESULTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(RESULTS / "report_replay_llama1b.png"), full_page=True)


def test_dashboard_draws_importance_and_slices_from_the_report_data(
    replay_study: str, report_dir: Path
) -> None:
    data = json.loads((report_dir / "report.json").read_text())
    with chromium() as browser, serve(replay_study, api_token=None) as base:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(base + "/#study=replay-llama1b")
        page.wait_for_selector('#chart-importance[data-rendered="true"]', timeout=30_000)
        page.wait_for_selector('#chart-slices[data-rendered="true"]', timeout=30_000)
        imp = page.locator("#chart-importance").get_attribute("data-knobs")
        assert imp == ",".join(data["importance"])  # same knobs, same order as the report
        assert page.locator("#chart-slices").get_attribute("data-knobs") == ",".join(
            data["slices"]
        )
        bars = page.locator("#chart-importance .bars .point").count()
        assert bars == len(data["importance"])
        if os.environ.get("DSE_REPORT_SHOT"):
            page.locator("#chart-importance").scroll_into_view_if_needed()
            page.screenshot(path=str(RESULTS / "dashboard_importance_slices.png"), full_page=True)
        assert errors == []


def test_report_of_a_study_without_a_complete_trial(tmp_path: Path) -> None:
    from dse.core.records import Outcome
    from dse.storage import open_storage
    from tests.api.seed import create_study

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = open_storage(url)
    sid = create_study(storage, "all-failed")
    params = {"tensor_model_parallel_size": 2, "micro_batch_size": 4,
              "use_distributed_optimizer": False}  # fmt: skip
    from dse.space.searchspace import params_key

    t = storage.claim_trial(study_id=sid, params=params, params_key=params_key(params), budget=5)
    assert t is not None
    storage.start_trial(t.id, runner="r", host="h", log_path="l", metrics_path="m")
    storage.finish_trial(
        t.id, Outcome("failed", {}, failure_class="oom", reason="CUDA out of memory"), value=None
    )
    storage.close()
    out = tmp_path / "rep"
    assert main(["report", "--storage", url, "-o", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "CUDA out of memory" in page and "needs 3 complete trials" in page
    assert "best-value" not in page


def test_report_of_a_model_studied_on_other_hardware(tmp_path: Path) -> None:
    """Other studies of the model in the database: the report compares their best figures;
    the best configuration's intervals and numerics check are reported where measured."""
    from dse.storage import open_storage
    from tests.api.seed_views import seed_views, set_pruned

    url = f"sqlite:///{tmp_path / 'views.db'}"
    storage = open_storage(url)
    try:
        seeded = seed_views(storage)
    finally:
        storage.close()
    set_pruned(url, seeded)
    out = tmp_path / "rep"
    assert main(["report", "--storage", url, "--study", "gpt-h200", "-o", str(out)]) == 0
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 8
    data = json.loads((out / "report.json").read_text())
    rows = [r["study"] for r in data["compare"]["studies"]]
    assert rows == ["gpt-h200", "gpt-h100", "gpt-bridge-h200"]  # not the other model's
    for name in rows:
        assert f"<tr data-study='{name}'>" in page
    # the best's figures and intervals are its configuration's noise-aware ones
    # (dse.results.noise),
    # the same in the best section and the comparison
    from dse.core.figures import figure

    figs = data["best"]["noise"]["figures"]
    lo, hi = (figure(x) for x in figs["tflops_per_gpu"]["ci"])
    # one run: its interval holds the run-to-run prior (about +-8 %), not its steps' +-2.6 %
    assert figure(figs["tflops_per_gpu"]["value"]) == "350.0" and 315 < float(lo) < 335
    assert 365 < float(hi) < 385
    assert f"<td>350.0 ({lo}–{hi})</td>" in page and "<td>NVIDIA H100 x2</td>" in page
    assert f"<td id='best-tflops-ci'>{lo}–{hi}</td>" in page
    slo, shi = (figure(x) for x in figs["step_time_s"]["ci"])
    assert f"<td id='best-step-ci'>{slo}–{shi}</td>" in page
    assert "<td id='best-numerics'>ok</td>" in page
    # four GPUs, six trials that ran (the pruned one included); a numerics baseline
    assert "<p class='note' id='timeline-note'>4 slots, 6 trials, 6 runs" in page
    assert "baseline: trial 0 (the trial the numerics check compared against); over it: " \
           "trials 1, 2" in page  # fmt: skip
    md = (out / "report.md").read_text()
    assert "| gpt-bridge-h200 | NVIDIA H200 x4 | bridge:gpt_small_pretrain |" in md
    assert "![compare](compare.png)" in md and "![timeline](timeline.png)" in md
