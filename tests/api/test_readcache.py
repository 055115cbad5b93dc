"""Answers kept per study version: never stale after a committed write (from any process),
shared between concurrent requests, and database work off the event loop."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from dse.api import Settings, create_app
from dse.api.readcache import StudyVersions, VersionMemo
from dse.api.schemas import TrialPublic
from dse.api.views import best_public, json_bytes, page_intervals, trial_row
from dse.core.exceptions import NoCompleteTrialError
from dse.core.records import Outcome
from dse.results.run_settings import RUN_SETTINGS_ATTR, effective_space, run_settings
from dse.space.searchspace import params_key
from dse.storage import Storage, open_storage
from tests.api.conftest import BACKENDS, TOKEN, TestClient, new_url
from tests.api.live import serve
from tests.api.seed import create_study, ok, space_yaml

V1 = "/api/v1"


def _db(url: str) -> int:
    storage = open_storage(url)
    try:
        sid = create_study(storage, "s")
        _complete(storage, sid, 1, 300.0)
    finally:
        storage.close()
    return sid


def _complete(st: Storage, sid: int, mbs: int, tflops: float) -> None:
    params = {"tensor_model_parallel_size": 1, "micro_batch_size": mbs,
              "use_distributed_optimizer": False}  # fmt: skip
    t = st.claim_trial(
        study_id=sid, params=params, params_key=params_key(params), budget=1000,
        allow_repeat=True, runner="t:1:x",
    )  # fmt: skip
    assert t is not None
    st.start_trial(t.id, runner="t:1:x", host="h", log_path=None, metrics_path=None)
    out: Outcome = ok(tflops, 50.0)
    st.finish_trial(t.id, out, value=tflops, gpu_seconds=10.0)


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cache.db'}"


def test_concurrent_requests_share_one_build(tmp_path: Path) -> None:
    """30 clients asking for the same page at once: one build, 30 equal answers."""
    url = _sqlite(tmp_path)
    _db(url)
    app = create_app(settings=Settings(storage=url))
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


def test_an_unchanged_study_is_answered_from_the_cache(tmp_path: Path) -> None:
    """Same version: the kept answer (no build); a write by another connection moves the
    version: the next read is rebuilt and shows it."""
    url = _sqlite(tmp_path)
    sid = _db(url)
    app = create_app(settings=Settings(storage=url))
    answers = app.state.reads.answers
    with TestClient(app) as c:
        first = c.get(f"{V1}/studies/s/trials").content
        builds = answers.builds
        for _ in range(5):
            assert c.get(f"{V1}/studies/s/trials").content == first
        assert answers.builds == builds and answers.hits >= 5
        with open_storage(url) as storage:
            _complete(storage, sid, 2, 400.0)
        assert c.get(f"{V1}/studies/s/trials").json()["count"] == 2
        assert answers.builds == builds + 1


@pytest.mark.parametrize("cache_mib", [64, 0])
def test_a_write_by_another_connection_shows_at_once(tmp_path: Path, cache_mib: int) -> None:
    url = _sqlite(tmp_path)
    sid = _db(url)
    app = create_app(settings=Settings(storage=url, read_cache_mib=cache_mib))
    with TestClient(app) as c:
        assert c.get(f"{V1}/studies/s/trials").json()["count"] == 1
        assert c.get(f"{V1}/studies/s/best").json()["objective"]["value"] == 300.0
        with open_storage(url) as storage:
            _complete(storage, sid, 2, 400.0)
        assert c.get(f"{V1}/studies/s/trials").json()["count"] == 2
        assert c.get(f"{V1}/studies/s/best").json()["objective"]["value"] == 400.0
    if cache_mib == 0:
        assert len(app.state.reads.answers) == 0


def test_created_study_is_readable_at_once(tmp_path: Path) -> None:
    """A study created through the API is readable at once (the 404 before was not kept)."""
    url = _sqlite(tmp_path)
    app = create_app(settings=Settings(storage=url, api_token=TOKEN))
    with TestClient(app) as c:
        assert c.get(f"{V1}/studies/new/trials").status_code == 404
        assert [s["name"] for s in c.get(f"{V1}/studies").json()["data"]] == []
        r = c.post(
            f"{V1}/studies",
            headers={"Authorization": f"Bearer {TOKEN}"},
            content=space_yaml("new"),
        )
        assert r.status_code == 201, r.text
        assert c.get(f"{V1}/studies/new/trials").json() == {
            "data": [],
            "count": 0,
            "intervals": {},
        }
        assert [s["name"] for s in c.get(f"{V1}/studies").json()["data"]] == ["new"]


def test_a_stop_through_the_api_shows_at_once(tmp_path: Path) -> None:
    url = _sqlite(tmp_path)
    _db(url)
    with open_storage(url) as storage:
        storage.set_study_state("s", "running")
    app = create_app(settings=Settings(storage=url, api_token=TOKEN))
    with TestClient(app) as c:
        assert c.get(f"{V1}/studies/s").json()["state"] == "running"
        r = c.post(f"{V1}/studies/s/stop", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 202, r.text
        assert c.get(f"{V1}/studies/s").json()["state"] == "stopping"
        assert c.get(f"{V1}/studies").json()["data"][0]["state"] == "stopping"


@pytest.mark.parametrize("path", ["/studies/nope/best", "/studies/nope/trials"])
def test_errors_are_not_kept(tmp_path: Path, path: str) -> None:
    url = _sqlite(tmp_path)
    _db(url)
    app = create_app(settings=Settings(storage=url))
    with TestClient(app) as c:
        assert c.get(V1 + path).status_code == 404
        assert c.get(V1 + path).status_code == 404
    assert app.state.reads.answers.builds == 0


def test_a_page_row_has_the_fields_of_its_schema(tmp_path: Path) -> None:
    """Pages are serialized from plain dicts, not models: the dict has exactly the schema's
    fields."""
    url = _sqlite(tmp_path)
    sid = _db(url)
    with open_storage(url) as storage:
        (t,) = storage.list_trials(sid, limit=1)
    assert set(trial_row(t)) == set(TrialPublic.model_fields)
    assert "losses" not in trial_row(t)["metrics"]


# --- trial pages from row fragments -------------------------------------------------------


def _old_page(url: str, sid: int, trusted: bool, **page: Any) -> bytes:
    """A page as it was serialized before row fragments: every row as a dict, one dump."""
    with open_storage(url) as storage:
        trials = storage.list_trials(sid, **page)
        rows = [trial_row(t) for t in trials]
        count = storage.count_trials(sid)["total"]
        intervals = page_intervals(storage, storage.get_study_by_id(sid), trials)
    if not trusted:
        for row in rows:
            row["host"] = None
            row["metrics"].pop("gpu_slots", None)
    return json_bytes(
        {"data": rows, "count": count, "intervals": {str(k): v for k, v in intervals.items()}}
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_pages_from_fragments_are_the_bytes_of_whole_pages(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Every order, with and without the token: the same bytes as the page serialized whole;
    the second time every row comes from its kept fragment."""
    url = new_url(backend, request, tmp_path)
    sid = _db(url)
    with open_storage(url) as storage:
        for k in range(7):
            _complete(storage, sid, k + 2, 300.0 + (k % 3) * 50)
        t = storage.claim_trial(study_id=sid, params={"micro_batch_size": 99},
                                params_key="99", budget=1000, runner="t:1:x")  # fmt: skip
        assert t is not None
        storage.start_trial(t.id, runner="t:1:x", host="node-7", log_path=None,
                            metrics_path=None)  # fmt: skip
    app = create_app(settings=Settings(storage=url, api_token=TOKEN))
    fragments = app.state.reads.fragments
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(app) as c:
        for trusted in (False, True):
            for order in ("number", "-number", "value", "-value"):
                for limit, offset in ((100, 0), (3, 2)):
                    q = f"order={order}&limit={limit}&offset={offset}"
                    got = c.get(f"{V1}/studies/s/trials?{q}", headers=auth if trusted else {})
                    want = _old_page(url, sid, trusted, order=order, limit=limit, offset=offset)
                    assert got.content == want, (trusted, order, limit, offset)
        hosts = {
            trusted: {r["host"] for r in c.get(f"{V1}/studies/s/trials", headers=h).json()["data"]}
            for trusted, h in ((False, {}), (True, auth))
        }
        assert hosts == {False: {None}, True: {"h", "node-7"}}
        # 9 trials, a fragment each with and without the token: made once, then reused
        assert fragments.made == 18 and len(fragments) == 18
        assert fragments.reused > 0


def test_a_changed_trial_gets_a_new_fragment_the_others_are_reused(tmp_path: Path) -> None:
    """After a write, a page is rebuilt (new version) but re-serializes only the rows that
    changed: the finished trial, and the new one."""
    url = _sqlite(tmp_path)
    sid = _db(url)
    with open_storage(url) as storage:
        for k in range(5):
            _complete(storage, sid, k + 2, 300.0 + k)
        running = storage.claim_trial(study_id=sid, params={"micro_batch_size": 50},
                                      params_key="50", budget=1000, runner="t:1:x")  # fmt: skip
        assert running is not None
        storage.start_trial(running.id, runner="t:1:x", host="h", log_path=None,
                            metrics_path=None)  # fmt: skip
    app = create_app(settings=Settings(storage=url))
    fragments, answers = app.state.reads.fragments, app.state.reads.answers
    with TestClient(app) as c:
        page = c.get(f"{V1}/studies/s/trials").json()
        assert [r["state"] for r in page["data"]][-1] == "running"
        assert fragments.made == 7
        with open_storage(url) as storage:
            storage.finish_trial(running.id, ok(480.0, 50.0), value=480.0, gpu_seconds=10.0)
            _complete(storage, sid, 60, 310.0)
        builds = answers.builds
        page = c.get(f"{V1}/studies/s/trials").json()
        assert answers.builds == builds + 1  # a new version: the page was rebuilt
        assert page["count"] == 8
        assert [r["state"] for r in page["data"]] == ["complete"] * 8
        assert page["data"][6]["value"] == 480.0
        assert fragments.made == 7 + 2  # the finished trial and the new one; 6 reused
        # another order of the same rows: all reused
        made = fragments.made
        assert c.get(f"{V1}/studies/s/trials?order=-value").json()["data"][0]["value"] == 480.0
        assert fragments.made == made


def test_fragments_stay_within_their_memory(tmp_path: Path) -> None:
    url = _sqlite(tmp_path)
    sid = _db(url)
    with open_storage(url) as storage:
        for k in range(20):
            _complete(storage, sid, k + 2, 300.0 + k)
    app = create_app(settings=Settings(storage=url))
    fragments = app.state.reads.fragments
    fragments.max_bytes = 3 * 1500  # about three rows
    with TestClient(app) as c:
        first = c.get(f"{V1}/studies/s/trials").content
        assert 0 < len(fragments) <= 3
        assert c.get(f"{V1}/studies/s/trials?order=-number").json()["count"] == 21
        assert json.loads(first)["count"] == 21
        assert fragments._bytes <= fragments.max_bytes


# --- version reads -------------------------------------------------------------------------


def test_version_reads_start_after_the_request_and_are_shared() -> None:
    """Every caller gets versions from a read that started after it called (so a write
    committed before the call is in them); concurrent callers share reads."""
    starts: list[float] = []

    def read() -> dict[str, tuple[int, int]]:
        starts.append(time.monotonic())
        time.sleep(0.01)
        return {"s": (1, len(starts) - 1)}  # the version says which read answered

    versions = StudyVersions(read)

    async def call(delay: float) -> tuple[float, int]:
        await asyncio.sleep(delay)
        called = time.monotonic()
        got = await versions.get()
        return called, got["s"][1]

    async def main() -> list[tuple[float, int]]:
        return await asyncio.gather(*(call(0.001 * (k % 40)) for k in range(200)))

    results = asyncio.run(main())
    for called, read_no in results:
        assert starts[read_no] >= called, "answered by a read that started before the call"
    assert versions.reads == len(starts) < 200 / 4  # shared


def test_a_failed_version_read_fails_its_callers_only() -> None:
    """The callers of a read that fails get its error (a 503); those that came while it ran
    get the next read."""
    calls = []

    def read() -> dict[str, tuple[int, int]]:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.05)
            raise RuntimeError("database down")
        return {}

    versions = StudyVersions(read)

    async def main() -> list[Any]:
        first = asyncio.ensure_future(versions.get())
        await asyncio.sleep(0.01)  # the first read is running
        later = [versions.get() for _ in range(4)]
        return await asyncio.gather(first, *later, return_exceptions=True)

    out = asyncio.run(main())
    assert isinstance(out[0], RuntimeError) and out[1:] == [{}] * 4
    assert versions.reads == 2


# --- across processes, every endpoint the dashboard reads ------------------------------------


def _controller(url: str, sid: int, n: int, done: Any, go: Any) -> None:
    """A controller in another process: one better trial (and one rejection) per step; says
    which step has committed, then waits for the reader."""
    storage = open_storage(url)
    try:
        for k in range(n):
            _complete(storage, sid, 10 + k, 500.0 + k)
            storage.add_rejection(
                study_id=sid, params={"micro_batch_size": 99 + k}, params_key=f"r{k}",
                kind="invalid", rule="r", reason="why", values={},
            )  # fmt: skip
            done.put(k)
            if not go.wait(60):
                return
            go.clear()
    finally:
        storage.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_read_after_a_committed_write_sees_it(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A controller process writes; right after each commit, every endpoint the dashboard
    reads answers with it, while other clients keep the same answers hot in the cache."""
    url = new_url(backend, request, tmp_path)
    sid = _db(url)
    n = 6
    ctx = mp.get_context("spawn")
    done, go = ctx.Queue(), ctx.Event()
    stop = threading.Event()
    paths = ["/studies", "/studies/s", "/studies/s/best", "/studies/s/trials?order=-value",
             "/studies/s/pareto", "/studies/s/rejections", "/best?num_layers=4"]  # fmt: skip
    with serve(url) as base:

        def hammer() -> None:  # keeps every answer cached between the writes
            with httpx.Client(base_url=base + V1, timeout=30) as c:
                while not stop.is_set():
                    for p in paths:
                        c.get(p)

        threads = [threading.Thread(target=hammer, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        writer = ctx.Process(target=_controller, args=(url, sid, n, done, go))
        writer.start()
        try:
            with httpx.Client(base_url=base + V1, timeout=30) as c:
                for k in range(n):
                    assert done.get(timeout=120) == k
                    trials, value = k + 2, 500.0 + k
                    listed = c.get("/studies").json()["data"][0]
                    assert listed["counts"]["total"] == trials
                    assert listed["best_value"] == value
                    study = c.get("/studies/s").json()
                    assert study["counts"]["complete"] == trials
                    assert study["rejections"] == k + 1
                    assert c.get("/studies/s/best").json()["objective"]["value"] == value
                    page = c.get("/studies/s/trials?order=-value").json()
                    assert page["count"] == trials and page["data"][0]["value"] == value
                    pareto = c.get("/studies/s/pareto").json()
                    assert len(pareto["points"]) == trials + k + 1
                    assert c.get("/studies/s/rejections").json()["count"] == k + 1
                    cross = c.get("/best?num_layers=4").json()
                    assert cross["best"]["objective"]["value"] == value
                    go.set()
        finally:
            stop.set()
            go.set()
            writer.join(timeout=60)
            for t in threads:
                t.join(timeout=30)
    assert writer.exitcode == 0


# --- a slow read does not stall /health ----------------------------------------------------


@pytest.mark.postgres
def test_health_answers_while_reads_are_stuck(pg_url: str) -> None:
    """Forty page requests blocked on a lock held elsewhere (more than the build threads):
    /health still answers at once, the blocked pages finish when the lock goes."""
    _db(pg_url)
    admin = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    results: list[int] = []
    with serve(pg_url) as base:
        with httpx.Client(base_url=base + V1, timeout=60) as c:
            assert c.get("/health").status_code == 200
        conn = admin.connect()
        trans = conn.begin()
        conn.execute(text("LOCK TABLE trials IN ACCESS EXCLUSIVE MODE"))
        try:

            def page(k: int) -> None:
                with httpx.Client(base_url=base + V1, timeout=60) as c:
                    results.append(c.get(f"/studies/s/trials?offset={k}").status_code)

            threads = [threading.Thread(target=page, args=(k,)) for k in range(40)]
            for t in threads:
                t.start()
            time.sleep(1.0)  # every page request is in and waiting on the lock
            assert results == []
            with httpx.Client(base_url=base + V1, timeout=60) as c:
                for _ in range(3):  # answered while every page still waits (order, not time)
                    r = c.get("/health")
                    assert r.status_code == 200 and r.json()["status"] == "ok"
                    assert results == [], "/health waited for the stuck reads"
            assert results == []
        finally:
            trans.rollback()
            conn.close()
        for t in threads:
            t.join(timeout=60)
    admin.dispose()
    assert results == [200] * 40


# --- the best's own counter: claims and starts keep the best, and nothing else may -------------


def _fresh_best(storage: Storage) -> bytes | None:
    """The study's best as ``GET .../best`` answers it, built from scratch (None: 404)."""
    try:
        study = storage.get_study("s")
        return json_bytes(best_public(storage, study).model_dump(mode="json"))
    except NoCompleteTrialError:
        return None


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_best_is_kept_only_across_writes_that_cannot_change_it(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Every kind of write, in turn; after each, ``best_version`` moved unless the best cannot
    have changed (then the best built from scratch is the same bytes as before), and
    ``GET .../best``, kept warm in the cache before every write, answers the fresh best at
    once. A write that changes the best without moving ``best_version`` fails here: the
    sequence changes the best by finishing a trial, by its loss-parity verdict, by the
    study's attributes (the verdict allowed), and keeps it across a controller's claims,
    acquisitions, starts and re-queues (those rebuild nothing)."""
    url = new_url(backend, request, tmp_path)
    storage = open_storage(url)
    sid = create_study(storage, "s")
    app = create_app(settings=Settings(storage=url))
    answers = app.state.reads.answers
    seen: list[tuple[str, int, int, bytes | None]] = []

    def counters() -> tuple[int, int]:
        c = storage.study_change_counters()["s"]
        return c.version, c.best_version

    with TestClient(app) as client:

        def best_answer() -> bytes | None:
            r = client.get(f"{V1}/studies/s/best")
            assert r.status_code in (200, 404), r.text
            return r.content if r.status_code == 200 else None

        def step(what: str, write: Any, *, best_moves: bool, best_changes: bool) -> Any:
            before = best_answer()  # warm: kept at the current best_version
            builds = answers.builds
            version, best_version = counters()
            out = write()
            v, bv = counters()
            fresh = _fresh_best(storage)
            assert v > version, f"{what} did not move the version"
            if best_moves:
                assert bv > best_version, f"{what} did not move best_version"
            else:
                assert bv == best_version, f"{what} moved best_version"
                # the promise best_version keeps: nothing it does not count changes the best
                assert fresh == before, f"{what} changed the best without moving best_version"
            assert (fresh != before) == best_changes, what
            assert best_answer() == fresh, f"GET .../best after {what}"
            if not best_moves and before is not None:
                assert answers.builds == builds, f"{what} rebuilt the best"
            seen.append((what, v, bv, fresh))
            return out

        def claim(mbs: int) -> Any:
            params = {"tensor_model_parallel_size": 1, "micro_batch_size": mbs,
                      "use_distributed_optimizer": False}  # fmt: skip
            return storage.claim_trial(
                study_id=sid, params=params, params_key=params_key(params), budget=100,
                allow_repeat=True, runner="t:1:x",
            )  # fmt: skip

        def start(tid: int) -> Any:
            return storage.start_trial(tid, runner="t:1:x", host="h", log_path=None,
                                       metrics_path=None)  # fmt: skip

        t1 = step("claim_trial", lambda: claim(1), best_moves=False, best_changes=False)
        step("start_trial", lambda: start(t1.id), best_moves=False, best_changes=False)
        step("finish_trial (a first best)",
             lambda: storage.finish_trial(t1.id, ok(300.0, 50.0), value=300.0),
             best_moves=True, best_changes=True)  # fmt: skip
        t2 = step("claim_trial", lambda: claim(2), best_moves=False, best_changes=False)
        step("start_trial", lambda: start(t2.id), best_moves=False, best_changes=False)
        step("requeue_trial", lambda: storage.requeue_trial(t2.id, reason="node lost"),
             best_moves=False, best_changes=False)  # fmt: skip
        step("acquire_queued_trial",
             lambda: storage.acquire_queued_trial(sid, runner="t:2:y"),
             best_moves=False, best_changes=False)  # fmt: skip
        step("start_trial", lambda: start(t2.id), best_moves=False, best_changes=False)
        step("finish_trial (a better one)",
             lambda: storage.finish_trial(t2.id, ok(400.0, 50.0), value=400.0),
             best_moves=True, best_changes=True)  # fmt: skip
        step("set_trial_numerics (the best's loss changed: left out)",
             lambda: storage.set_trial_numerics(t2.id, {"status": "changed"}),
             best_moves=True, best_changes=True)  # fmt: skip
        step("set_study_attr (changed numerics allowed in the best)",
             lambda: storage.set_study_attr(sid, RUN_SETTINGS_ATTR, _allow_changed(storage)),
             best_moves=True, best_changes=True)  # fmt: skip
        step("add_rejection",
             lambda: storage.add_rejection(
                 study_id=sid, params={"micro_batch_size": 99}, params_key="r", kind="invalid",
                 rule="r", reason="why", values={},
             ), best_moves=True, best_changes=False)  # fmt: skip
        step("set_study_state", lambda: storage.set_study_state("s", "running"),
             best_moves=True, best_changes=False)  # fmt: skip
        t3 = step("claim_trial", lambda: claim(3), best_moves=False, best_changes=False)
        step("start_trial", lambda: start(t3.id), best_moves=False, best_changes=False)
        step("finish_trial (failed)",
             lambda: storage.finish_trial(t3.id, Outcome("failed", {}, failure_class="crash",
                                                          reason="OOM"), value=None),
             best_moves=True, best_changes=False)  # fmt: skip
    storage.close()
    assert [s[3] is None for s in seen[:2]] == [True, True]


def _allow_changed(storage: Storage) -> dict[str, Any]:
    """The study's run settings with numerics-changed trials allowed in the best."""
    study = storage.get_study("s")
    space = effective_space(study.space_yaml, "s", storage.get_study_attrs(study.id))
    settings = run_settings(space)
    settings["loss_parity"] = {**settings["loss_parity"], "allow_changed_in_best": True}
    return settings


# --- values shared per version: computed once, however many builds want them ----------------


def test_a_shared_value_is_computed_once_by_concurrent_builds() -> None:
    """Eight threads want the counts of one version while they are being computed: one
    computation, eight equal values; a failed one is not kept (the next caller computes)."""
    memo = VersionMemo()
    gate = threading.Event()
    calls: list[int] = []

    def compute() -> dict[str, int]:
        calls.append(1)
        gate.wait(10)
        return {"total": 7}

    got: list[dict[str, int]] = []
    threads = [
        threading.Thread(target=lambda: got.append(memo.get("counts", (1, 5), compute)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and got == [{"total": 7}] * 8
    assert memo.get("counts", (1, 5), compute) == {"total": 7} and len(calls) == 1

    def fail() -> dict[str, int]:
        raise RuntimeError("database gone")

    with pytest.raises(RuntimeError):
        memo.get("counts", (1, 6), fail)
    assert memo.get("counts", (1, 6), lambda: {"total": 8}) == {"total": 8}


@pytest.mark.parametrize(
    ("url", "env", "threads"),
    [
        ("sqlite:///dse.db", None, 2),
        ("postgresql+psycopg://dse@127.0.0.1:5432/dse", None, 8),
        ("sqlite:///dse.db", "4", 4),
        ("postgresql+psycopg://dse@127.0.0.1:5432/dse", "2", 2),
    ],
)
def test_read_threads_follow_the_database_kind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str, env: str | None, threads: int
) -> None:
    """Unset, SQLite gets two read threads (its reads are CPU work in the server's process:
    more pass the interpreter lock between cores; one would queue every build behind a
    heavy one) and a database server eight (BENCHMARKS 20); DSE_READ_THREADS wins."""
    monkeypatch.chdir(tmp_path)
    if env is None:
        monkeypatch.delenv("DSE_READ_THREADS", raising=False)
    else:
        monkeypatch.setenv("DSE_READ_THREADS", env)
    settings = Settings(storage=url)
    assert settings.effective_read_threads == threads
    app = create_app(settings=settings)  # opens no database until the first request
    assert app.state.reads.answers._pool._max_workers == threads
