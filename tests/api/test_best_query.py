"""The cross-study best lookup matches by sequence length and global batch size too, and a
misspelled field is a 422 naming it (not a 404 'no study matches')."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dse.space.searchspace import parse_space
from dse.storage import open_storage
from tests.api.conftest import TestClient, make_client
from tests.api.seed import _run, create_study, ok, space_dict

V1 = "/api/v1"
PARAMS = {"tensor_model_parallel_size": 1, "micro_batch_size": 1,
          "use_distributed_optimizer": False}  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path_factory.mktemp('bq') / 'bq.db'}"
    storage = open_storage(url)
    try:
        for name, seq, gbs, tflops in [
            ("s64", 64, 8, 300.0), ("s128", 128, 8, 400.0), ("g16", 64, 16, 500.0),
        ]:  # fmt: skip
            sid = create_study(storage, name, seq_length=seq, global_batch_size=gbs)
            _run(storage, sid, PARAMS, ok(tflops, 50.0), gpu_seconds=1.0)
    finally:
        storage.close()
    with make_client(url) as c:
        yield c


def test_the_stored_model_has_the_sequence_length(client: TestClient) -> None:
    assert client.get(f"{V1}/studies/s128").json()["model"]["seq_length"] == 128
    space = parse_space(space_dict("x", seq_length=96), "x")
    assert space.study_fields()["model"]["seq_length"] == 96


@pytest.mark.parametrize(
    ("query", "matched", "best"),
    [
        ({"num_layers": 4}, ["s64", "s128", "g16"], "g16"),
        ({"num_layers": 4, "seq_length": 64}, ["s64", "g16"], "g16"),
        ({"seq_length": 128}, ["s128"], "s128"),
        ({"num_layers": 4, "global_batch_size": 8}, ["s64", "s128"], "s128"),
        ({"seq_length": 64, "global_batch_size": 8}, ["s64"], "s64"),
    ],
)
def test_get_best_by_sequence_length_and_batch(
    client: TestClient, query: dict[str, Any], matched: list[str], best: str
) -> None:
    r = client.get(f"{V1}/best", params=query)
    assert r.status_code == 200, r.text
    assert r.json()["matched"] == matched
    assert r.json()["best"]["study"] == best


@pytest.mark.parametrize(
    ("body", "matched"),
    [
        ({"semantics": {"seq_length": 64, "global_batch_size": 16}}, ["g16"]),
        ({"model": {"num_layers": 4, "seq_length": 128}}, ["s128"]),
        ({"model": {"seq_length": 64}, "semantics": {"global_batch_size": 8}}, ["s64"]),
        ({"semantics": {"steps": 4}}, ["s64", "s128", "g16"]),
    ],
)
def test_post_best_query_by_semantics(
    client: TestClient, body: dict[str, Any], matched: list[str]
) -> None:
    r = client.post(f"{V1}/best/query", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["matched"] == matched


def test_no_match_on_another_sequence_length_is_404(client: TestClient) -> None:
    r = client.get(f"{V1}/best", params={"num_layers": 4, "seq_length": 4096})
    assert r.status_code == 404
    assert "semantics.seq_length=4096" in r.json()["detail"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"model": {"num_layer": 4}}, ["body.model", "'num_layer'", "num_layers"]),
        ({"hardware": {"gpus": "NVIDIA H200"}}, ["body.hardware", "'gpus'", "gpu"]),
        ({"semantics": {"seq_len": 64}}, ["body.semantics", "'seq_len'", "seq_length"]),
        ({"model": {"num_layers": 4}, "semantic": {}}, ["body.semantic"]),
    ],
)
def test_a_misspelled_field_is_422_naming_it(
    client: TestClient, body: dict[str, Any], words: list[str]
) -> None:
    r = client.post(f"{V1}/best/query", json=body)
    assert r.status_code == 422, r.text
    for w in words:
        assert w in r.json()["detail"]


def test_a_misspelled_query_parameter_is_422_naming_it(client: TestClient) -> None:
    r = client.get(f"{V1}/best", params={"num_layer": 4})
    assert r.status_code == 422, r.text
    assert "query.num_layer" in r.json()["detail"]
    assert "num_layers" in r.json()["detail"]
