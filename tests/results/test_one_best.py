"""One noise-aware best everywhere (issue 29): ``dse best``, the API's best and its history
line, the report and ``/compare`` name the same configuration with the same pooled figure and
interval, and say the tie; a sim study's figures are estimates everywhere and spend no GPU.

Before: the report's and /compare's best was the best single trial (the lucky re-measure),
the history's "best so far" ended at that trial's raw value, and the best's figures were its
first trial's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dse.cli.main import main
from dse.core.figures import figure
from dse.report.page import _sections
from dse.report.plots import compare_studies, running_best, study_plot_data
from dse.results.best_formats import best_payload
from dse.storage import open_storage
from tests.conftest import EXAMPLES
from tests.loop.test_loss_parity_replay import _noise_table, _run, _space


@pytest.fixture
def tied(tmp_path: Path) -> str:
    """Two studies of one model: MBS 2 and 4 within noise, each run twice; the best single
    run (121.5) is MBS 2's re-measure, the pooled best MBS 2 at 120.75, tied with MBS 4."""
    url = f"sqlite:///{tmp_path / 'tied.db'}"
    table = _noise_table(tmp_path)
    with open_storage(url) as st:
        for name in ("noisy", "noisy-2"):
            _run(_space(table, name, tmp_path, budget={"remeasure": 2}), st)
    return url


def test_every_view_names_the_pooled_best_and_its_tie(
    tied: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_storage(tied) as st:
        study = st.get_study("noisy")
        trials = st.list_trials(study.id)
        raw_best = max(t.value for t in trials if t.value is not None)
        p = best_payload(st, study)
        data = study_plot_data(st, study)
        cmp = compare_studies(st, ["noisy", "noisy-2"])
    noise = p["noise"]
    pooled = p["objective"]["value"]
    assert raw_best == pytest.approx(121.5) and pooled == pytest.approx(120.75)
    assert len(noise["trials"]) == 2 and noise["message"].startswith("tied within noise")
    # the payload's figures are the pooled ones, with the pooled interval
    assert p["metrics"]["tflops_per_gpu"] == pytest.approx(pooled)
    assert p["metrics"]["tflops_per_gpu_ci"] == noise["figures"]["tflops_per_gpu"]["ci"]
    assert p["metrics"]["step_time_s"] == noise["figures"]["step_time_s"]["value"]
    # the history's best so far ends at the pooled best, never at the lucky single run
    line = [r["best_so_far"] for r in data["history"]]
    assert line[-1] == pytest.approx(pooled) and max(v for v in line if v) < raw_best
    assert [r["remeasure_of"] is not None for r in data["history"]].count(True) == 2
    # the report's best section: the pooled figure, its runs and the tie
    rows = {i: v for _, rs, _ in _sections(data) for i, _, v in rs}
    assert rows["best-trial"] == str(p["trial"]) and rows["best-tie"] == noise["message"]
    assert rows["best-pooled"].startswith("2: trials")
    # /compare: each study's noise-aware best
    for r in cmp["studies"]:
        b = r["best"]
        assert b["trial"] == p["trial"] and b["value"] == pytest.approx(pooled)
        assert b["pooled"] and b["tie"] == noise["message"] and b["tied"]
        assert b["tflops_per_gpu_ci"] == noise["figures"]["tflops_per_gpu"]["ci"]
    # dse best prints the same
    assert main(["best", "--storage", tied, "--study", "noisy", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"]["tflops_per_gpu"] == pytest.approx(pooled)
    # ... and so does dse status's best line: the pooled step time and peak, not one run's
    assert main(["status", "--storage", tied, "--study", "noisy"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("best:"))
    step = noise["figures"]["step_time_s"]["value"]
    assert f"step {figure(step)} s," in line, line
    assert f"peak {figure(p['metrics']['peak_mem_gib'])} GiB" in line, line


def test_the_status_line_shows_the_pooled_step_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The best's step time on dse status's line is the pooled one the API, panel and report
    show, not its first run's (here the two runs of the best differ by 10 %)."""
    table = _noise_table(tmp_path)
    rows = [json.loads(x) for x in table.read_text().splitlines()]
    for r in rows[3:]:  # the second runs: 10 % faster steps
        m = r["metrics"]
        m["step_time_s"] *= 0.9
        m["step_times_s"] = [t * 0.9 for t in m["step_times_s"]]
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    url = f"sqlite:///{tmp_path / 'p.db'}"
    with open_storage(url) as st:
        _run(_space(table, "pooled", tmp_path, budget={"remeasure": 2}), st)
        p = best_payload(st, st.get_study("pooled"))
    pooled = p["noise"]["figures"]["step_time_s"]["value"]
    with open_storage(url) as st:
        own = st.get_trial_by_number(st.get_study("pooled").id, p["trial"]).metrics["step_time_s"]
    assert figure(pooled) != figure(own)  # the case the line must get right
    assert main(["status", "--storage", url, "--study", "pooled"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("best:"))
    assert f"step {figure(pooled)} s," in line, line


def test_running_best_follows_pooled_configurations() -> None:
    """A lucky run lifts the line until its configuration's re-measure pools it down."""
    from dataclasses import dataclass, field

    from dse.space.searchspace import load_space

    space = load_space(EXAMPLES / "tiny_gpt_cpu.yaml")
    base = space.baseline()

    @dataclass
    class T:
        number: int
        value: float | None
        params: dict = field(default_factory=dict)
        state: str = "complete"
        numerics: str | None = None

    other = {**base, "micro_batch_size": 2}
    trials = [T(0, 10.0, base), T(1, 14.0, other), T(2, 8.0, other), T(3, None, base, "failed"),
              T(4, 12.0, base, numerics="changed")]  # fmt: skip
    line = [r["value"] for r in running_best(space, trials, "maximize")]
    assert line == [10.0, 14.0, 11.0, 11.0, 11.0]  # numerics-changed left out of the best
    assert running_best(space, trials, "maximize", final=11.5)[-1]["value"] == 11.5
    low = [r["value"] for r in running_best(space, trials[:3], "minimize")]
    assert low == [10.0, 10.0, 10.0]


@pytest.mark.slow
def test_a_sim_study_is_an_estimate_everywhere_and_spends_no_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'sim.db'}"
    space = EXAMPLES / "nemotron_omni.yaml"
    assert main(["start", "--space", str(space), "--workload", "sim", "--n-trials", "3",
                 "--storage", url]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["status", "--storage", url, "--format", "json"]) == 0
    st_json = json.loads(capsys.readouterr().out)
    g = st_json["gpu"]
    assert g["gpu_hours"] == 0.0 and g["grid_gpu_hours"] is None and g["saved_gpu_hours"] is None
    assert "measured" not in g["label"].split(":")[0] and "estimates" in g["label"]
    assert all(t["metrics"].get("gpu_seconds_startup") is None for t in st_json["trials"])
    with open_storage(url) as st:
        data = study_plot_data(st, st.get_study(st.list_studies()[0].name))
    assert data["source"] == "estimate"
    secs = {title: ({i: v for i, _, v in rows}, note)
            for title, rows, note in _sections(data)}  # fmt: skip
    assert secs["Trials"][1].startswith("estimate")
    assert secs["Best configuration"][1].startswith("estimate")
    assert secs["GPU-hours"][0]["gpu-spent"].startswith("0 ")
    assert "measured step time" not in data["projection"]["label"]
    # deterministic: never re-measured; the best's interval is the estimate's error band,
    # labelled so, and a tie is never "tied within noise ... re-measure"
    assert all(t["remeasure_of"] is None for t in st_json["trials"])
    noise = st_json["best"]["noise"]
    assert noise["kind"] == "estimate" and noise["interval_source"] == "estimate"
    assert "tied within noise" not in noise["message"] and noise["split_budget"] is None
    lo, hi = noise["figures"]["tflops_per_gpu"]["ci"]
    assert lo < noise["figures"]["tflops_per_gpu"]["value"] < hi
    complete = [t for t in st_json["trials"] if t["state"] == "complete"]
    assert complete and all(t["interval"]["kind"] == "estimate" for t in complete)
