"""The plain polls of a best and a trial page are answered without FastAPI's routing
(:mod:`dse.api.fastreads`): the same status, headers and bytes as the routes, for every
request; anything not plain, or failing, is left to the routes."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI

from dse.api import Settings, create_app
from dse.api.fastreads import FastReads
from dse.storage import open_storage
from tests.api.conftest import BACKENDS, TOKEN, TestClient, new_url
from tests.api.seed import create_study, ok

V1 = "/api/v1"

#: Requests the middleware answers (plain) and requests it leaves to the routes.
PLAIN = [
    "/studies/s/best",
    "/studies/s/best?format=json",
    "/studies/s/trials",
    "/studies/s/trials?limit=5&offset=1&order=-value",
    "/studies/s/trials?order=value&limit=1000",
    "/studies/s/trials?state=complete&limit=2",
    "/studies/s/trials?offset=2147483647",
    "/studies/s/trials?limit=007",
]
LEFT = [
    "/studies/s/best?format=yaml",
    "/studies/s/best?format=megatron",
    "/studies/s/best?format=xml",
    "/studies/s/best?x=1",
    "/studies/none/best",
    "/studies/empty/best",
    "/studies/none/trials",
    "/studies/s%0A/trials",
    "/studies/" + "x" * 256 + "/trials",
    "/studies/s/trials?limit=0",
    "/studies/s/trials?limit=1001",
    "/studies/s/trials?limit=-1",
    "/studies/s/trials?limit=%35",
    "/studies/s/trials?limit=5&limit=6",
    "/studies/s/trials?offset=2147483648",
    "/studies/s/trials?order=sideways",
    "/studies/s/trials?state=lost",
    "/studies/s/trials?limit=",
    "/studies/s/trials?limit=1&",
    "/studies/s/trials?page=2",
    "/studies/s/trials?limit=%C2%B2",
    "/studies/s/trials/0",
    "/studies/s",
]


def _apps(url: str, **settings: object) -> tuple[FastAPI, FastAPI]:
    fast = create_app(settings=Settings(storage=url, **settings))  # type: ignore[arg-type]
    plain = create_app(settings=Settings(storage=url, **settings))  # type: ignore[arg-type]
    plain.user_middleware = [m for m in plain.user_middleware if m.cls is not FastReads]
    return fast, plain


def _seed(url: str) -> None:
    with open_storage(url) as storage:
        sid = create_study(storage, "s")
        create_study(storage, "empty")
        for k, tflops in enumerate((300.0, 420.0, 380.0)):
            params = {"tensor_model_parallel_size": 1, "micro_batch_size": k + 1,
                      "use_distributed_optimizer": False}  # fmt: skip
            t = storage.claim_trial(
                study_id=sid, params=params, params_key=str(k), budget=10, runner="r",
                allow_repeat=True,
            )  # fmt: skip
            assert t is not None
            storage.start_trial(t.id, runner="r", host="node-7", log_path="/l", metrics_path=None)
            storage.finish_trial(t.id, ok(tflops, 50.0), value=tflops)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_same_answers_with_and_without_the_middleware(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = new_url(backend, request, tmp_path)
    _seed(url)
    fast, plain = _apps(url)
    with TestClient(fast) as f, TestClient(plain) as p:
        for path in PLAIN + LEFT:
            for _ in range(2):  # built, then kept
                a, b = f.get(V1 + path), p.get(V1 + path)
                assert (a.status_code, a.headers.items(), a.content) == (
                    b.status_code, b.headers.items(), b.content,
                ), path  # fmt: skip
        answered = fast.state.fast_reads.answered
        assert answered == 2 * len(PLAIN)
        # a reader with the token gets the routes' answer (where trials ran)
        r = f.get(V1 + "/studies/s/trials", headers={"Authorization": "Bearer x"})
        assert r.status_code == 200 and fast.state.fast_reads.answered == answered
    assert not hasattr(plain.state, "fast_reads")


def test_protected_reads_are_left_to_the_routes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _seed(url)
    fast, _ = _apps(url, api_token=TOKEN, protect_reads=True)
    with TestClient(fast) as c:
        assert c.get(V1 + "/studies/s/best").status_code == 401
        assert c.get(V1 + "/studies/s/trials").status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        page = c.get(V1 + "/studies/s/trials", headers=auth).json()
        assert page["count"] == 3 and page["data"][0]["host"] == "node-7"
        assert fast.state.fast_reads.answered == 0
