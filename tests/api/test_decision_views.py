"""The decision views of the REST API on SQLite and PostgreSQL: the timeline of trials per GPU
slot, loss curves over the baseline's, the studies of one model side by side, and the
measurement fields of issue 15 (intervals, the numerics check, the ``pruned`` state) on the
pages, the best configuration and the comparison. Bad input is a 422 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dse.report.plots import STATE_COLORS
from dse.storage import open_storage
from tests.api.conftest import BACKENDS, TOKEN, TestClient, make_client, new_url
from tests.api.seed import seed_database
from tests.api.seed_views import ViewSeed, seed_views, set_pruned

V1 = "/api/v1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module", params=BACKENDS)
def views(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TestClient, ViewSeed]]:
    url = new_url(request.param, request, tmp_path_factory.mktemp("views"))
    seeded = seed_database(url, seed_views)
    set_pruned(url, seeded)
    seeded.url = url
    with make_client(url) as c:
        yield c, seeded


def _get(c: TestClient, path: str, **kw: Any) -> Any:
    r = c.get(V1 + path, **kw)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()


def _422(c: TestClient, path: str) -> str:
    r = c.get(V1 + path)
    assert r.status_code == 422, (path, r.status_code, r.text)
    return str(r.json()["detail"])


# --- timeline ---------------------------------------------------------------------------------


@pytest.mark.parametrize("study", ["gpt-h200", "gpt-h100", "gpt-bridge-h200"])
def test_timeline_lanes_and_bars(views: tuple[TestClient, ViewSeed], study: str) -> None:
    c, seeded = views
    want = seeded.studies[study]
    tl = _get(c, f"/studies/{study}/timeline", headers=AUTH)  # with the token: host names
    assert [x["label"] for x in tl["lanes"]] == want["lanes"]
    assert len(tl["bars"]) == want["bars"]
    assert tl["runs"] == want["runs"]
    assert tl["trials_shown"] == tl["trials_ran"] == want["ran"]
    assert tl["slots_from"] == want["slots_from"]
    assert tl["colors"] == STATE_COLORS
    lanes = {x["label"] for x in tl["lanes"]}
    assert all(b["lane"] in lanes and b["end"] >= b["start"] >= 0 for b in tl["bars"])
    if "gaps" in want:
        assert len(tl["gaps"]) == want["gaps"]


def test_timeline_of_recorded_slots(views: tuple[TestClient, ViewSeed]) -> None:
    c, _ = views
    tl = _get(c, "/studies/gpt-h200/timeline", headers=AUTH)
    by = {(b["trial"], b["lane"]): b for b in tl["bars"]}
    # trial 2 ran on the first two GPUs from 130 s to 220 s; the pruned one keeps its bar
    assert by[(2, "gpu-node-a:0")]["start"] == pytest.approx(130.0)
    assert by[(2, "gpu-node-a:1")]["duration_s"] == pytest.approx(90.0)
    assert by[(4, "gpu-node-a:2")]["state"] == "pruned"
    assert by[(3, "gpu-node-a:3")]["failure_class"] == "oom"
    running = by[(5, "gpu-node-a:0")]
    assert running["open"] is True and running["state"] == "running"
    gaps = {(g["lane"], round(g["start"]), round(g["end"])) for g in tl["gaps"]}
    assert ("gpu-node-a:0", 100, 130) in gaps and ("gpu-node-a:2", 140, 150) in gaps
    assert not any(b["trial"] == 6 for b in tl["bars"])  # queued: never held a slot


def test_timeline_hides_host_names_without_the_token(views: tuple[TestClient, ViewSeed]) -> None:
    c, _ = views
    for study, lanes in [
        ("gpt-h200", ["node 1:0", "node 1:1", "node 1:2", "node 1:3"]),
        ("gpt-bridge-h200", ["node 1:0", "node 1:1", "node 2:0", "node 2:1"]),
        ("gpt-h100", ["node 1 · slot 1", "node 1 · slot 2", "node 1 · slot 3"]),
    ]:
        r = c.get(f"{V1}/studies/{study}/timeline")
        assert r.status_code == 200
        assert [x["label"] for x in r.json()["lanes"]] == lanes
        for host in ("gpu-node-a", "node-1", "box-1"):
            assert host not in r.text
    # and the GPU slots on the trial pages likewise
    page = c.get(f"{V1}/studies/gpt-h200/trials").json()
    assert all("gpu_slots" not in t["metrics"] for t in page["data"])
    page = c.get(f"{V1}/studies/gpt-h200/trials", headers=AUTH).json()
    assert page["data"][0]["metrics"]["gpu_slots"] == ["gpu-node-a:0", "gpu-node-a:1"]
    one = c.get(f"{V1}/studies/gpt-h200/trials/0").json()
    assert "gpu_slots" not in one["metrics"] and one["host"] is None


def test_timeline_keeps_the_latest_bars(views: tuple[TestClient, ViewSeed]) -> None:
    c, _ = views
    tl = _get(c, "/studies/gpt-h100/timeline?last=2")
    # the two latest starts (trial 3 with its interrupted attempt, trial 2) of the 5 that ran
    assert tl["trials_ran"] == 5 and tl["trials_shown"] == 2 and tl["runs"] == 3
    assert sorted((b["trial"], b["state"]) for b in tl["bars"]) == [
        (2, "failed"), (3, "complete"), (3, "interrupted"),
    ]  # fmt: skip
    assert "query.last" in _422(c, "/studies/gpt-h100/timeline?last=0")
    assert c.get(f"{V1}/studies/nope/timeline").status_code == 404


def test_timeline_of_a_study_without_trials(views: tuple[TestClient, ViewSeed]) -> None:
    c, _ = views
    tl = _get(c, "/studies/gpt-other/timeline")
    assert tl["lanes"] == [] and tl["bars"] == [] and tl["gaps"] == []


# --- loss curves --------------------------------------------------------------------------


def test_loss_curves_over_the_baseline(views: tuple[TestClient, ViewSeed]) -> None:
    c, _ = views
    data = _get(c, "/studies/gpt-h200/losses?trials=2&trials=1")
    assert data["baseline"] == 0
    assert data["baseline_params"] == {"tensor_model_parallel_size": 1, "micro_batch_size": 1,
                                       "use_distributed_optimizer": False}  # fmt: skip
    assert [(x["number"], x["baseline"]) for x in data["curves"]] == [
        (0, True), (2, False), (1, False),
    ]  # fmt: skip
    base, changed, best = data["curves"]
    assert base["steps"] == list(range(1, 9))
    assert base["loss"] == pytest.approx([7.0 - 0.1 * i for i in range(8)])
    assert changed["numerics"] == "changed" and changed["drift"] == pytest.approx(0.08)
    assert best["numerics"] == "ok" and best["value"] == 350.0
    assert "numerics check" in data["baseline_how"]
    # the baseline itself asked for: drawn once
    again = _get(c, "/studies/gpt-h200/losses?trials=0&trials=1")
    assert [x["number"] for x in again["curves"]] == [0, 1]


def test_loss_curves_find_the_baseline_by_its_configuration(
    views: tuple[TestClient, ViewSeed],
) -> None:
    c, _ = views
    # no numerics check in this study: the first finished trial of the baseline's knobs
    data = _get(c, "/studies/gpt-h100/losses?trials=3")
    assert data["baseline"] == 0 and data["curves"][0]["baseline"] is True
    assert "baseline configuration" in data["baseline_how"]
    assert [x["number"] for x in data["curves"]] == [0, 3]
    only = _get(c, "/studies/gpt-h100/losses")  # nothing ticked: the baseline alone
    assert [x["number"] for x in only["curves"]] == [0]
    none = _get(c, "/studies/gpt-other/losses")
    assert none["baseline"] is None and none["curves"] == []
    assert none["baseline_how"] == "the baseline configuration has not run"


def test_loss_curves_refuse_bad_input(views: tuple[TestClient, ViewSeed]) -> None:
    c, _ = views
    assert _422(c, "/studies/gpt-h200/losses?trials=99") == (
        "query.trials: study 'gpt-h200' has no trial 99"
    )
    assert _422(c, "/studies/gpt-h200/losses?trials=x").startswith("query.trials")
    assert _422(c, "/studies/gpt-h200/losses?trials=-1").startswith("query.trials")
    many = "&".join(f"trials={i}" for i in range(21))
    assert _422(c, f"/studies/gpt-h200/losses?{many}").startswith("query.trials")
    assert c.get(f"{V1}/studies/nope/losses").status_code == 404


# --- the studies of one model ---------------------------------------------------------------


def test_comparable_studies_share_the_model(views: tuple[TestClient, ViewSeed]) -> None:
    c, _ = views
    data = _get(c, "/studies/gpt-h200/comparable")
    assert data["study"] == "gpt-h200" and data["count"] == 2
    assert [r["study"] for r in data["data"]] == ["gpt-h100", "gpt-bridge-h200"]
    assert _get(c, "/studies/gpt-other/comparable")["data"] == []


def test_compare_side_by_side(views: tuple[TestClient, ViewSeed]) -> None:
    c, seeded = views
    names = ["gpt-h200", "gpt-h100", "gpt-bridge-h200"]
    data = _get(c, "/compare?" + "&".join(f"studies={n}" for n in names))
    assert [r["study"] for r in data["studies"]] == names
    assert data["model"]["num_layers"] == 4 and "seq_length" not in data["model"]
    assert set(data["figures"]) >= {"tflops_per_gpu", "step_time_s", "peak_mem_gib"}
    for r in data["studies"]:
        want = seeded.studies[r["study"]]
        assert r["gpu"] == want["gpu"] and r["world_size"] == want["world_size"]
        assert r["best"]["trial"] == want["best"]
        assert r["best"]["tflops_per_gpu"] == want["tflops"]
        assert r["best"]["step_time_s"] == pytest.approx(100 / want["tflops"])
        assert r["best"]["peak_mem_gib"] == pytest.approx(40 + want["tflops"] / 10)
        assert r["seq_length"] == 64 and r["global_batch_size"] == 8
    h200, h100, bridge = data["studies"]
    # each best is the study's noise-aware one: GET .../best's figures and intervals
    for r in (h200, h100, bridge):
        figs = _get(c, f"/studies/{r['study']}/best")["noise"]["figures"]
        assert r["best"]["tflops_per_gpu_ci"] == figs["tflops_per_gpu"]["ci"]
        assert r["best"]["step_time_ci_s"] == figs["step_time_s"]["ci"]
    # the trial measured [340, 358]; one run: the run-to-run prior widens it (about +-8 %)
    lo, hi = h200["best"]["tflops_per_gpu_ci"]
    assert 315 < lo < 335 and 365 < hi < 385 and h200["best"]["pooled"]
    assert bridge["recipe"] == "bridge:gpt_small_pretrain" and h100["recipe"] is None
    assert h200["counts"]["pruned"] == 1
    assert h200["gpu_hours"] == pytest.approx((200 + 240 + 180 + 30 + 60) / 3600)
    # the comma form names the same studies
    assert _get(c, "/compare?studies=gpt-h200,gpt-h100")["studies"][1]["study"] == "gpt-h100"


def test_compare_refuses_bad_input(views: tuple[TestClient, ViewSeed]) -> None:
    c, _ = views
    assert _422(c, "/compare") == "query.studies: Field required"
    assert _422(c, "/compare?studies=gpt-h200") == (
        "query.studies: name at least two studies to compare, got 1"
    )
    assert _422(c, "/compare?studies=gpt-h200&studies=gpt-h200").endswith("got 1")
    assert _422(c, "/compare?studies=gpt-h200&studies=nope") == (
        "query.studies: no study named 'nope'"
    )
    detail = _422(c, "/compare?studies=gpt-h200&studies=gpt-other")
    assert detail.startswith("query.studies: 'gpt-other' trains another model than 'gpt-h200'")
    assert "num_layers 4 vs 8" in detail
    many = "&".join(f"studies=s{i}" for i in range(13))
    assert _422(c, f"/compare?{many}").startswith("query.studies")
    assert _422(c, "/compare?studies=gpt-h200&studies=a%00b").startswith("query.studies")


# --- issue 15's fields where the dashboard reads them -----------------------------------------


def test_measurement_fields_on_pages_and_the_best(views: tuple[TestClient, ViewSeed]) -> None:
    c, _ = views
    page = _get(c, "/studies/gpt-h200/trials")
    by = {t["number"]: t for t in page["data"]}
    assert by[4]["state"] == "pruned" and by[4]["value"] == 200.0
    assert by[2]["metrics"]["numerics"]["status"] == "changed"
    assert by[1]["metrics"]["tflops_per_gpu_ci"] == [340.0, 358.0]
    study = _get(c, "/studies/gpt-h200")
    assert study["counts"]["pruned"] == 1 and study["counts"]["total"] == 7
    best = _get(c, "/studies/gpt-h200/best")
    m = best["metrics"]
    figs = best["noise"]["figures"]  # the configuration's noise-aware intervals
    assert m["tflops_per_gpu_ci"] == figs["tflops_per_gpu"]["ci"]
    assert m["step_time_ci_s"] == figs["step_time_s"]["ci"]
    assert m["tflops_per_gpu_ci"][0] < 350.0 < m["tflops_per_gpu_ci"][1]
    assert m["numerics"]["status"] == "ok" and m["measurement"]["stop_reason"] == "converged"
    # a best that recorded none has the noise model's (one run: the run-to-run prior)
    other = _get(c, "/studies/gpt-h100/best")
    assert (
        other["metrics"]["tflops_per_gpu_ci"] == other["noise"]["figures"]["tflops_per_gpu"]["ci"]
    )
    assert other["noise"]["interval_source"] == "prior"


def test_the_report_data_carries_the_views(views: tuple[TestClient, ViewSeed]) -> None:
    """The report draws the same data the routes answer (dse.report.plots)."""
    from dse.report.plots import study_plot_data

    c, seeded = views
    storage = open_storage(seeded.url)
    try:
        data = study_plot_data(storage, storage.get_study("gpt-h200"))
    finally:
        storage.close()
    api_tl = _get(c, "/studies/gpt-h200/timeline", headers=AUTH)
    assert [x["label"] for x in data["timeline"]["lanes"]] == [x["label"] for x in api_tl["lanes"]]
    assert len(data["timeline"]["bars"]) == len(api_tl["bars"])
    assert data["losses"]["baseline"] == 0
    assert [x["number"] for x in data["losses"]["curves"]] == [0, 1, 2]  # the best ones
    assert [r["study"] for r in data["compare"]["studies"]] == [
        "gpt-h200", "gpt-h100", "gpt-bridge-h200",
    ]  # fmt: skip
    assert data["projection"]["baseline_trial"] == 0


def test_the_report_data_lists_the_trials_once(
    views: tuple[TestClient, ViewSeed], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Insights are the heaviest read answer (seconds at 10,000 trials, BENCHMARKS 20): the
    study's trials are read once for all of their parts, and the importance from that one
    list is the one computed on its own."""
    from dse.report.plots import knob_importance, study_plot_data

    _, seeded = views
    storage = open_storage(seeded.url)
    try:
        study = storage.get_study("gpt-h200")
        alone = knob_importance(storage, study)
        calls: list[int] = []
        listing = storage.list_trials

        def counted(*a: Any, **k: Any) -> Any:
            calls.append(1)
            return listing(*a, **k)

        monkeypatch.setattr(storage, "list_trials", counted)
        data = study_plot_data(storage, study)
    finally:
        storage.close()
    assert len(calls) == 1
    assert (data["importance"], data["importance_how"]) == alone
