"""Read endpoints against seeded SQLite and PostgreSQL databases (the real app and storage)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest
import yaml

from dse.cli.main import main as cli_main
from tests.api.conftest import TestClient
from tests.api.seed import Seeded

V1 = "/api/v1"


def _auth(client: TestClient) -> dict[str, str]:
    """The bearer header of the client's server (its token)."""
    token = client.app.state.settings.api_token.get_secret_value()  # type: ignore[attr-defined]
    return {"Authorization": f"Bearer {token}"}


def test_health(client: TestClient) -> None:
    r = client.get(f"{V1}/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert body["writes_enabled"] is True
    assert body["schema_revision"]
    # the database URL only for a reader with the token; others see the backend
    assert body["storage"] in ("sqlite", "postgresql")
    trusted = client.get(f"{V1}/health", headers=_auth(client)).json()
    assert "://" in trusted["storage"] and trusted["storage"].startswith(body["storage"])


def test_list_studies(client: TestClient, seeds: dict[str, Seeded]) -> None:
    r = client.get(f"{V1}/studies")
    assert r.status_code == 200
    page = r.json()
    assert page["count"] == 4
    by_name = {s["name"]: s for s in page["data"]}
    assert list(by_name) == ["llama-seeded", "llama-seeded-b", "other-model", "empty-study"]
    main = by_name["llama-seeded"]
    assert main["counts"] == seeds["main"].counts
    assert main["state"] == "created"
    assert main["best_value"] == 350.0
    assert main["best_trial"] == 1
    assert main["rejections"] == 2
    assert main["gpu_hours"] == pytest.approx(seeds["main"].gpu_seconds / 3600)
    assert main["hardware"]["gpu"] == "NVIDIA H200"
    empty = by_name["empty-study"]
    assert empty["best_value"] is None and empty["counts"]["total"] == 0


def test_get_study(client: TestClient) -> None:
    r = client.get(f"{V1}/studies/llama-seeded")
    assert r.status_code == 200
    s = r.json()
    assert s["rejection_counts"] == {"invalid": 1, "predicted_oom": 1}
    assert yaml.safe_load(s["space_yaml"])["study"] == "llama-seeded"
    assert s["space_hash"]


@pytest.mark.parametrize("name", ["nope", "llama-seeded%00", "a%0Ab", "x" * 255])
def test_unknown_study_is_404(client: TestClient, name: str) -> None:
    for suffix in ("", "/trials", "/best", "/pareto", "/rejections", "/trials/0"):
        r = client.get(f"{V1}/studies/{name}{suffix}")
        assert r.status_code == 404, (suffix, r.text)
        assert "no study named" in r.json()["detail"]


def test_trials_page(client: TestClient, seeds: dict[str, Seeded]) -> None:
    r = client.get(f"{V1}/studies/llama-seeded/trials")
    assert r.status_code == 200
    page = r.json()
    assert page["count"] == seeds["main"].n_trials
    assert [t["number"] for t in page["data"]] == list(range(9))
    assert "losses" not in page["data"][0]["metrics"]

    r = client.get(f"{V1}/studies/llama-seeded/trials", params={"limit": 3, "offset": 3})
    assert [t["number"] for t in r.json()["data"]] == [3, 4, 5]
    assert r.json()["count"] == 9

    r = client.get(f"{V1}/studies/llama-seeded/trials", params={"state": "infeasible"})
    page = r.json()
    assert page["count"] == 2
    assert {t["failure_class"] for t in page["data"]} == {"oom", "invalid"}
    assert all(t["reason"] for t in page["data"])

    r = client.get(f"{V1}/studies/llama-seeded/trials", params={"order": "-value", "limit": 2})
    assert [t["value"] for t in r.json()["data"]] == [350.0, 300.0]

    r = client.get(f"{V1}/studies/llama-seeded/trials", params={"offset": 100})
    assert r.json() == {"data": [], "count": 9, "intervals": {}}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"state": "done"}, "query.state"),
        ({"limit": 0}, "query.limit"),
        ({"limit": 1001}, "query.limit"),
        ({"limit": "ten"}, "query.limit"),
        ({"offset": -1}, "query.offset"),
        ({"order": "random"}, "query.order"),
    ],
)
def test_trials_bad_parameters_are_422(client: TestClient, params: dict, field: str) -> None:
    r = client.get(f"{V1}/studies/llama-seeded/trials", params=params)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert isinstance(detail, str) and detail.startswith(field)


def test_trial_detail(client: TestClient, seeds: dict[str, Seeded]) -> None:
    tid = seeds["main"].trial_ids["c1"]
    r = client.get(f"{V1}/trials/{tid}")
    assert r.status_code == 200
    t = r.json()
    assert t["study"] == "llama-seeded" and t["number"] == 1 and t["state"] == "complete"
    assert [s["step"] for s in t["steps"]] == [1, 2, 3, 4]
    assert t["steps"][0]["loss"] == pytest.approx(7.0)
    assert t["metrics"]["losses"] == [7.0, 6.9, 6.8, 6.7]
    # where it ran: for readers with the token only
    assert t["host"] is None and t["log_path"] is None and t["metrics_path"] is None
    assert t["runner"] is None
    assert client.get(f"{V1}/studies/llama-seeded/trials/1").json() == t
    trusted = client.get(f"{V1}/trials/{tid}", headers=_auth(client)).json()
    assert trusted["host"] == "node-1" and trusted["log_path"].endswith("log.txt")
    by_number = client.get(f"{V1}/studies/llama-seeded/trials/1", headers=_auth(client))
    assert by_number.json() == trusted
    page = client.get(f"{V1}/studies/llama-seeded/trials").json()["data"]
    assert page and all(row["host"] is None for row in page)
    page = client.get(f"{V1}/studies/llama-seeded/trials", headers=_auth(client)).json()["data"]
    assert any(row["host"] == "node-1" for row in page)


def test_failed_trial_detail_has_reason_and_nan_as_null(
    client: TestClient, seeds: dict[str, Seeded]
) -> None:
    oom = client.get(f"{V1}/trials/{seeds['main'].trial_ids['oom']}").json()
    assert oom["state"] == "infeasible" and oom["failure_class"] == "oom"
    assert "out of memory" in oom["reason"]
    nan = client.get(f"{V1}/trials/{seeds['main'].trial_ids['nan']}").json()
    assert nan["failure_class"] == "nan"
    assert nan["metrics"]["loss"] is None
    assert nan["steps"][-1]["loss"] is None
    assert nan["steps"][0]["loss"] == pytest.approx(7.0)


@pytest.mark.parametrize(("tid", "code"), [(10**6, 404), (0, 422), (2**31, 422), ("x", 422)])
def test_trial_errors(client: TestClient, tid: object, code: int) -> None:
    r = client.get(f"{V1}/trials/{tid}")
    assert r.status_code == code
    assert isinstance(r.json()["detail"], str)


def test_best_json(client: TestClient, seeds: dict[str, Seeded]) -> None:
    r = client.get(f"{V1}/studies/llama-seeded/best")
    assert r.status_code == 200
    b = r.json()
    assert b["trial"] == 1
    assert b["objective"] == {"metric": "tflops_per_gpu", "direction": "maximize", "value": 350.0}
    assert b["params"]["micro_batch_size"] == 2
    assert b["metrics"]["peak_mem_gib"] == 80.0
    ex = b["exports"]
    assert "--micro-batch-size 2" in ex["megatron"]
    assert "--tensor-model-parallel-size 1" in ex["megatron"]
    assert "train.micro_batch_size=2" in ex["bridge"]
    assert "trainer.strategy.tensor_model_parallel_size=1" in ex["nemo"]


def _cli_best(url: str, fmt: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        rc = cli_main(["best", "--study", "llama-seeded", "--storage", url, "--format", fmt])
    assert rc == 0
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["yaml", "megatron", "bridge", "nemo"])
def test_best_text_formats_match_the_cli(
    client: TestClient, seeded: tuple[str, dict[str, Seeded]], fmt: str
) -> None:
    r = client.get(f"{V1}/studies/llama-seeded/best", params={"format": fmt})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert r.text == _cli_best(seeded[0], fmt)
    if fmt == "yaml":
        assert yaml.safe_load(r.text)["trial"] == 1


def test_best_json_matches_the_cli(
    client: TestClient, seeded: tuple[str, dict[str, Seeded]]
) -> None:
    api = client.get(f"{V1}/studies/llama-seeded/best").json()
    cli = json.loads(_cli_best(seeded[0], "json"))
    assert {k: v for k, v in api.items() if k != "exports"} == cli


def test_best_errors(client: TestClient) -> None:
    r = client.get(f"{V1}/studies/empty-study/best")
    assert r.status_code == 404
    assert "no complete trial" in r.json()["detail"]
    r = client.get(f"{V1}/studies/llama-seeded/best", params={"format": "toml"})
    assert r.status_code == 422
    assert r.json()["detail"].startswith("query.format")


def test_pareto(client: TestClient, seeds: dict[str, Seeded]) -> None:
    r = client.get(f"{V1}/studies/llama-seeded/pareto")
    assert r.status_code == 200
    p = r.json()
    assert [pt["number"] for pt in p["front"]] == seeds["main"].front
    assert all(pt["on_front"] for pt in p["front"])
    assert p["gpu_memory_gib"] == 141.0
    points = p["points"]
    assert len(points) == 9 + 2
    by_number = {pt["number"]: pt for pt in points if pt["source"] == "trial"}
    assert by_number[2]["on_front"] is False  # dominated by trial 1
    kinds = sorted(pt["kind"] for pt in points)
    assert kinds == sorted(
        ["complete"] * 3
        + ["oom", "error", "invalid", "nan", "running", "queued", "invalid", "predicted_oom"]
    )
    rejected = [pt for pt in points if pt["source"] == "rejection"]
    assert {pt["kind"] for pt in rejected} == {"invalid", "predicted_oom"}
    pred = next(pt for pt in rejected if pt["kind"] == "predicted_oom")
    assert pred["peak_mem_gib"] == 180.0 and pred["number"] is None
    assert by_number[3]["kind"] == "oom" and by_number[3]["peak_mem_gib"] == 139.5


def test_rejections(client: TestClient) -> None:
    r = client.get(f"{V1}/studies/llama-seeded/rejections")
    assert r.status_code == 200
    page = r.json()
    assert page["count"] == 2
    assert page["counts"] == {"invalid": 1, "predicted_oom": 1}
    assert [x["kind"] for x in page["data"]] == ["invalid", "predicted_oom"]
    assert page["data"][0]["rule"] == "tp_divides_query_groups"
    r = client.get(f"{V1}/studies/llama-seeded/rejections", params={"kind": "predicted_oom"})
    assert r.json()["count"] == 1 and r.json()["data"][0]["values"]["margin"] == 0.25
    r = client.get(f"{V1}/studies/llama-seeded/rejections", params={"limit": 1, "offset": 1})
    assert [x["kind"] for x in r.json()["data"]] == ["predicted_oom"]
    assert r.json()["count"] == 2  # all pages
    r = client.get(
        f"{V1}/studies/llama-seeded/rejections", params={"kind": "invalid", "offset": 1}
    )
    assert r.json()["data"] == [] and r.json()["count"] == 1
    r = client.get(f"{V1}/studies/llama-seeded/rejections", params={"kind": "nothing"})
    assert r.json() == {"data": [], "count": 0, "counts": {"invalid": 1, "predicted_oom": 1}}


def test_best_across_studies(client: TestClient) -> None:
    q = {"num_layers": 4, "hidden_size": 64, "gpu": "nvidia h200", "world_size": 2}
    r = client.get(f"{V1}/best", params=q)
    assert r.status_code == 200
    body = r.json()
    assert body["matched"] == ["llama-seeded", "llama-seeded-b", "empty-study"]
    assert body["best"]["study"] == "llama-seeded-b"
    assert body["best"]["objective"]["value"] == 360.0

    r = client.post(f"{V1}/best/query", json={"model": {"num_layers": 8}})
    assert r.status_code == 200
    assert r.json()["matched"] == ["other-model"]
    assert r.json()["best"]["study"] == "other-model"


@pytest.mark.parametrize(
    ("method", "kwargs", "code", "words"),
    [
        ("get", {"params": {"num_layers": 96}}, 404, "no study matches"),
        ("get", {"params": {"gpu": "NVIDIA B200"}}, 404, "no study matches"),
        ("get", {"params": {"num_layers": 4, "metric": "step_time_s"}}, 404, "no study"),
        ("get", {}, 422, "at least one"),
        ("get", {"params": {"num_layers": 0}}, 422, "query.num_layers"),
        ("post", {"json": {}}, 422, "at least one"),
        ("post", {"json": {"model": {"num_layers": 4}, "extra": 1}}, 422, "body.extra"),
        ("post", {"json": {"model": {"num_layers": 8}, "metric": "x"}}, 422, "body.metric"),
        ("post", {"content": b"not json"}, 422, "body"),
    ],
)
def test_best_across_errors(
    client: TestClient, method: str, kwargs: dict, code: int, words: str
) -> None:
    if method == "get":
        r = client.get(f"{V1}/best", **kwargs)
    else:
        r = client.post(f"{V1}/best/query", headers={"content-type": "application/json"}, **kwargs)
    assert r.status_code == code, r.text
    assert words in r.json()["detail"]


def test_no_complete_trial_among_matches_is_404(client: TestClient) -> None:
    r = client.post(f"{V1}/best/query", json={"model": {"num_layers": 4}, "hardware": {}})
    assert r.status_code == 200  # llama-seeded-b has one
    r = client.get(f"{V1}/best", params={"num_layers": 4, "world_size": 64})
    assert r.status_code == 404


def test_dashboard_assets(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    for hook in ('id="trial-table"', 'id="chart-pareto"', 'id="study-list"', "data-count"):
        assert hook in r.text
    assert "://" not in r.text  # nothing from another host
    js = client.get("/static/dashboard.js")
    assert js.status_code == 200 and "Plotly" in js.text
    assert '<script id="plotly-js" src="/static/vendor/plotly.min.js"' in r.text
    assert "://" not in js.text  # no absolute URL: every asset from this app
    assert client.get("/static/dashboard.css").status_code == 200
    plotly = client.get("/static/vendor/plotly.min.js")
    assert plotly.status_code == 200
    assert "javascript" in plotly.headers["content-type"]
    assert len(plotly.content) > 1_000_000
    assert client.get("/static/nope.js").status_code == 404


def test_openapi_documents_errors_as_detail_strings(client: TestClient) -> None:
    spec = client.get(f"{V1}/openapi.json").json()
    op = spec["paths"]["/api/v1/studies/{name}/trials"]["get"]
    ref = op["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/ErrorPublic")
    assert "HTTPValidationError" not in json.dumps(spec)
    best = spec["paths"]["/api/v1/studies/{name}/best"]["get"]["responses"]["200"]["content"]
    assert set(best) == {"application/json", "text/plain"}
