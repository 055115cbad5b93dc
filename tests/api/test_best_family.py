"""The cross-study best lookup does not mix model families: a query that leaves out a field
whose absence makes the model another kind (``num_moe_experts``: dense, not MoE;
``hybrid_layer_pattern``: a GPT, not a hybrid Mamba model; ``frozen_params``: no frozen
encoders) matches only studies without it, unless the query names a value or ``"any"``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from sqlalchemy import text as sql

from dse.space.searchspace import parse_space
from dse.storage import open_storage
from tests.api.conftest import TestClient, make_client
from tests.api.seed import _run, ok, space_dict

V1 = "/api/v1"
PARAMS = {"tensor_model_parallel_size": 1, "micro_batch_size": 1,
          "use_distributed_optimizer": False}  # fmt: skip

#: name -> (model fields beyond the small GPT of tests.api.seed, its best TFLOP/s)
STUDIES: dict[str, tuple[dict[str, Any], float]] = {
    "dense": ({}, 300.0),
    "moe4": ({"num_moe_experts": 4, "moe_ffn_hidden_size": 64}, 600.0),
    "moe8": ({"num_moe_experts": 8, "moe_ffn_hidden_size": 64}, 500.0),
    "hybrid": (
        {
            "hybrid_layer_pattern": "M*M*",
            "position_embedding_type": "none",
            "mamba_num_groups": 2,
            "mamba_head_dim": 16,
        },
        700.0,
    ),  # fmt: skip
    "vlm": ({"frozen_params": 1000}, 800.0),
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path_factory.mktemp('bf') / 'bf.db'}"
    storage = open_storage(url)
    try:
        for name, (extra, tflops) in STUDIES.items():
            d = space_dict(name)
            d["model"].update(extra)
            text = yaml.safe_dump(d, sort_keys=False)
            rec = storage.create_study(space_yaml=text, **parse_space(d, name).study_fields())
            _run(storage, rec.id, PARAMS, ok(tflops, 50.0), gpu_seconds=1.0)
        # a record stored before frozen_params existed has no such key: a dense GPT still
        d = space_dict("old")
        rec = storage.create_study(
            space_yaml=yaml.safe_dump(d, sort_keys=False), **parse_space(d, "old").study_fields()
        )
        _run(storage, rec.id, PARAMS, ok(200.0, 50.0), gpu_seconds=1.0)
        with storage._engine.begin() as conn:
            model = {k: v for k, v in rec.model.items() if k != "frozen_params"}
            conn.execute(
                sql("UPDATE studies SET model = :m WHERE name = 'old'"),
                {"m": json.dumps(model)},
            )
    finally:
        storage.close()
    with make_client(url) as c:
        yield c


@pytest.mark.parametrize(
    ("query", "matched", "best"),
    [
        ({"num_layers": 4}, ["dense", "old"], "dense"),
        ({"num_layers": 4, "num_moe_experts": 4}, ["moe4"], "moe4"),
        ({"world_size": 2}, ["dense", "old"], "dense"),
    ],
)
def test_get_best_keeps_to_the_family(
    client: TestClient, query: dict[str, Any], matched: list[str], best: str
) -> None:
    r = client.get(f"{V1}/best", params=query)
    assert r.status_code == 200, r.text
    assert sorted(r.json()["matched"]) == sorted(matched)
    assert r.json()["best"]["study"] == best


def test_get_best_any_family(client: TestClient) -> None:
    r = client.get(f"{V1}/best", params={"num_layers": 4, "num_moe_experts": "any"})
    assert r.status_code == 200, r.text
    assert sorted(r.json()["matched"]) == ["dense", "moe4", "moe8", "old"]
    assert r.json()["best"]["study"] == "moe4"


@pytest.mark.parametrize(
    ("model", "matched"),
    [
        ({"num_layers": 4}, ["dense", "old"]),
        ({"num_layers": 4, "num_moe_experts": None}, ["dense", "old"]),
        ({"num_layers": 4, "num_moe_experts": 0}, ["dense", "old"]),
        ({"num_layers": 4, "num_moe_experts": 8}, ["moe8"]),
        ({"num_layers": 4, "num_moe_experts": "any"}, ["dense", "moe4", "moe8", "old"]),
        ({"num_layers": 4, "hybrid_layer_pattern": "M*M*"}, ["hybrid"]),
        ({"num_layers": 4, "hybrid_layer_pattern": "any"}, ["dense", "hybrid", "old"]),
        ({"num_layers": 4, "frozen_params": 1000}, ["vlm"]),
        ({"num_layers": 4, "frozen_params": 0}, ["dense", "old"]),
        (
            {
                "num_layers": 4,
                "num_moe_experts": "any",
                "hybrid_layer_pattern": "any",
                "frozen_params": "any",
            },
            ["dense", "hybrid", "moe4", "moe8", "old", "vlm"],
        ),  # fmt: skip
    ],
)
def test_post_best_query_keeps_to_the_family(
    client: TestClient, model: dict[str, Any], matched: list[str]
) -> None:
    r = client.post(f"{V1}/best/query", json={"model": model})
    assert r.status_code == 200, r.text
    assert sorted(r.json()["matched"]) == matched


def test_any_is_only_for_the_family_fields(client: TestClient) -> None:
    r = client.post(f"{V1}/best/query", json={"model": {"num_layers": "any"}})
    assert r.status_code == 422, r.text
    assert "model.num_layers" in r.text and "'any'" in r.text
    r = client.get(f"{V1}/best", params={"num_layers": "any"})
    assert r.status_code == 422, r.text
