"""The read cache of the hot endpoints: shared answers, single flight, freshness bounds."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from dse.api import Settings, create_app
from dse.records import Outcome
from dse.space import params_key
from dse.storage import Storage, open_storage
from tests.api.conftest import TOKEN, TestClient
from tests.api.live import serve
from tests.api.seed import create_study, ok, space_yaml

V1 = "/api/v1"


def _db(tmp_path: Path) -> tuple[str, int]:
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    storage = open_storage(url)
    try:
        sid = create_study(storage, "s")
        _complete(storage, sid, 1, 300.0)
    finally:
        storage.close()
    return url, sid


def _complete(st: Storage, sid: int, mbs: int, tflops: float) -> None:
    params = {"tensor_model_parallel_size": 1, "micro_batch_size": mbs,
              "use_distributed_optimizer": False}  # fmt: skip
    t = st.claim_trial(
        study_id=sid, params=params, params_key=params_key(params), budget=100,
        allow_repeat=True, runner="t:1:x",
    )  # fmt: skip
    assert t is not None
    st.start_trial(t.id, runner="t:1:x", host="h", log_path=None, metrics_path=None)
    out: Outcome = ok(tflops, 50.0)
    st.finish_trial(t.id, out, value=tflops)


def test_concurrent_requests_share_one_build(tmp_path: Path) -> None:
    """30 clients asking for the same page at once: one build, 30 equal answers."""
    url, _ = _db(tmp_path)
    app = create_app(settings=Settings(storage=url, read_cache_s=30))
    bodies: list[bytes] = []
    with serve("", app=app) as base:
        barrier = threading.Barrier(30)

        def get() -> None:
            with httpx.Client(base_url=base, timeout=30) as c:
                barrier.wait()
                r = c.get(f"{V1}/studies/s/trials?limit=5&order=-value")
                assert r.status_code == 200
                bodies.append(r.content)

        threads = [threading.Thread(target=get) for _ in range(30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(bodies) == 30 and len(set(bodies)) == 1
    assert app.state.reads.answers.builds == 1


def test_answers_follow_other_writers_within_the_ttl(tmp_path: Path) -> None:
    """A controller (another connection) finishes a better trial: /best and the page show it
    within DSE_READ_CACHE_S, not before the answer was reused."""
    url, sid = _db(tmp_path)
    app = create_app(settings=Settings(storage=url, read_cache_s=0.5))
    with TestClient(app) as c:
        assert c.get(f"{V1}/studies/s/best").json()["objective"]["value"] == 300.0
        assert c.get(f"{V1}/studies/s/trials").json()["count"] == 1
        storage = open_storage(url)
        try:
            _complete(storage, sid, 2, 400.0)
        finally:
            storage.close()
        written = time.monotonic()
        while c.get(f"{V1}/studies/s/best").json()["objective"]["value"] != 400.0:
            assert time.monotonic() - written < 2.0, "the better trial did not show in 2 s"
            time.sleep(0.05)
        while c.get(f"{V1}/studies/s/trials").json()["count"] != 2:
            assert time.monotonic() - written < 2.0, "the new trial did not show in 2 s"
            time.sleep(0.05)


def test_no_reuse_with_zero_ttl(tmp_path: Path) -> None:
    url, sid = _db(tmp_path)
    with TestClient(create_app(settings=Settings(storage=url, read_cache_s=0))) as c:
        assert c.get(f"{V1}/studies/s/trials").json()["count"] == 1
        storage = open_storage(url)
        try:
            _complete(storage, sid, 2, 400.0)
        finally:
            storage.close()
        assert c.get(f"{V1}/studies/s/trials").json()["count"] == 2
        assert c.get(f"{V1}/studies/s/best").json()["objective"]["value"] == 400.0


def test_created_study_is_readable_at_once(tmp_path: Path) -> None:
    """A study created through the API is readable at once (the 404 before was not kept)."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    app = create_app(settings=Settings(storage=url, api_token=TOKEN, read_cache_s=60))
    with TestClient(app) as c:
        assert c.get(f"{V1}/studies/new/trials").status_code == 404
        r = c.post(
            f"{V1}/studies",
            headers={"Authorization": f"Bearer {TOKEN}"},
            content=space_yaml("new"),
        )
        assert r.status_code == 201, r.text
        assert c.get(f"{V1}/studies/new/trials").json() == {"data": [], "count": 0}


@pytest.mark.parametrize("path", ["/studies/nope/best", "/studies/nope/trials"])
def test_errors_are_not_kept(tmp_path: Path, path: str) -> None:
    url, _ = _db(tmp_path)
    app = create_app(settings=Settings(storage=url, read_cache_s=60))
    with TestClient(app) as c:
        assert c.get(V1 + path).status_code == 404
        assert c.get(V1 + path).status_code == 404
    assert app.state.reads.answers.builds == 0
