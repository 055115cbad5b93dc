"""Issue 39 item 2: a public read costs a bounded amount. ``/insights`` reads a sample of at
most ``INSIGHTS_SAMPLE`` complete trials (never the whole study's list of trial records),
says so in ``importance_how``, and is built in the heavy reads' own thread, so that however
many are asked for at once the builds that ``/best`` needs are never queued behind them."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from dse.api.readcache import ReadCache
from dse.core.records import sample_numbers
from dse.report import plots
from dse.space.searchspace import params_key
from dse.storage import Storage, open_storage
from tests.api.conftest import BACKENDS, make_client, new_url
from tests.api.seed import create_study, ok

V1 = "/api/v1"


def _fill(st: Storage, sid: int, n: int) -> None:
    for i in range(n):
        params = {"tensor_model_parallel_size": 1 + i % 2, "micro_batch_size": 1 + i % 4,
                  "use_distributed_optimizer": i % 3 == 0}  # fmt: skip
        t = st.claim_trial(
            study_id=sid, params=params, params_key=params_key(params), budget=10_000,
            allow_repeat=True, runner="t:1:x",
        )  # fmt: skip
        assert t is not None
        st.start_trial(t.id, runner="t:1:x", host="h", log_path=None, metrics_path=None)
        tflops = 200.0 + 10 * (i % 4) + i % 7
        st.finish_trial(t.id, ok(tflops, 50.0), value=tflops, gpu_seconds=10.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_insights_read_a_bounded_sample_not_the_whole_study(
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = new_url(backend, request, tmp_path_factory.mktemp("insights"))
    with open_storage(url) as st:
        sid = create_study(st, "big")
        _fill(st, sid, 40)
    monkeypatch.setattr(plots, "INSIGHTS_SAMPLE", 12)
    listed: list[Any] = []
    real_list = Storage.list_trials

    def counted(self: Storage, *a: Any, **k: Any) -> Any:
        listed.append(k)
        return real_list(self, *a, **k)

    monkeypatch.setattr(Storage, "list_trials", counted)
    with make_client(url) as c:
        r = c.get(f"{V1}/studies/big/insights")
    assert r.status_code == 200, r.text
    body = r.json()
    assert listed == []  # the whole study was never listed as trial records
    assert "a uniform sample of 12 of the 40 complete trials" in body["importance_how"]
    assert set(body["importance"]) == {"tensor_model_parallel_size", "micro_batch_size",
                                       "use_distributed_optimizer"}  # fmt: skip
    for points in body["slices"].values():
        assert len(points) == 12
    numbers = [p["number"] for p in body["slices"]["micro_batch_size"]]
    assert numbers == sample_numbers(range(40), 12)  # the storage's sample is the rule's
    assert body["projection"]["best"]["step_time_s"] > 0  # from the best: not sampled
    assert body["gpu"]["spent_gpu_hours"] == pytest.approx(40 * 10.0 / 3600)


def test_a_sample_moves_by_at_most_one_trial_per_new_trial() -> None:
    before = sample_numbers(range(5000), 200)
    after = sample_numbers(range(5001), 200)
    assert len(before) == len(after) == 200 and before == sorted(before)
    assert len(set(before) - set(after)) <= 1
    assert sample_numbers(range(50), 200) == list(range(50))  # all when there are few
    # uniform: each tenth of the numbers holds about a tenth of the sample
    tenths = [sum(1 for n in sample_numbers(range(100_000), 2000) if n // 10_000 == k)
              for k in range(10)]  # fmt: skip
    assert all(140 <= c <= 260 for c in tenths), tenths


def test_heavy_builds_never_hold_the_builds_of_the_polls() -> None:
    """Three heavy builds asked for at once while one poll build is needed, with one
    builder thread: the poll's build runs while the heavy ones are still stuck (before the
    fix it queued behind them in the builders' pool), and the heavy ones run one at a
    time."""
    cache = ReadCache(builders=1)
    release = threading.Event()
    running: list[str] = []
    lock = threading.Lock()
    at_once = [0]

    def heavy(k: int) -> bytes:
        with lock:
            running.append(f"heavy{k}")
            at_once[0] = max(at_once[0], sum(1 for x in running if x.startswith("heavy")))
        release.wait(30)
        with lock:
            running.remove(f"heavy{k}")
        return b"heavy"

    def poll() -> bytes:
        return b"best"

    async def main() -> tuple[bytes, bool]:
        tasks = [
            asyncio.ensure_future(cache.get(("ins", k), 1, lambda k=k: heavy(k), heavy=True))
            for k in range(3)
        ]
        await asyncio.sleep(0.05)
        best = await asyncio.wait_for(cache.get("best", 1, poll), timeout=20)
        stuck = not release.is_set() and not any(t.done() for t in tasks)
        release.set()
        assert [await t for t in tasks] == [b"heavy"] * 3
        return best, stuck

    best, stuck = asyncio.run(main())
    assert best == b"best" and stuck
    assert at_once[0] == 1


def test_a_rebuilt_best_does_not_canonicalize_every_configuration_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39 item 8: under a writer, ``/best`` is rebuilt after every finished trial, and
    each rebuild canonicalized every configuration of the study (a quarter of the server's
    CPU under 100 readers, py-spy). Now a configuration is canonicalized once per space: the
    rebuild after one more trial canonicalizes at most that trial's configuration, and the
    answer is the one computed from scratch."""
    from dse.results import noise
    from dse.results.best_formats import best_payload
    from dse.space.searchspace import SearchSpace

    url = f"sqlite:///{tmp_path / 'best.db'}"
    calls: list[int] = []
    real = SearchSpace.canonical

    def counted(self: SearchSpace, params: Any) -> Any:
        calls.append(1)
        return real(self, params)

    monkeypatch.setattr(SearchSpace, "canonical", counted)
    monkeypatch.setattr(noise, "_CANONICAL", {})  # none kept from other tests' studies
    with open_storage(url) as st:
        sid = create_study(st, "s")
        _fill(st, sid, 30)  # 8 configurations, each repeated
        first = best_payload(st, st.get_study("s"))
        assert len(calls) >= 8
        calls.clear()
        _fill(st, sid, 1)
        again = best_payload(st, st.get_study("s"))
        assert len(calls) <= 1, len(calls)
        noise._CANONICAL.clear()  # from scratch: the same answer
        assert best_payload(st, st.get_study("s")) == again
    assert first["trial"] is not None
