"""The study version: moved by every write a reader can see, in the write's transaction."""

from __future__ import annotations

import threading

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from dse.core.records import Outcome, StepMetrics
from dse.storage import Storage, head_revision, open_storage
from dse.storage._engine import alembic_config
from tests.storage.conftest import FILE_BACKENDS
from tests.storage.test_storage_contract import claim, make_study


def _version(storage: Storage, name: str = "s") -> int:
    return storage.study_versions()[name][1]


def test_every_visible_write_moves_the_version(storage: Storage) -> None:
    """Each write of trials, rejections, state or attributes moves the version once;
    heartbeats and writes that change nothing leave it; other studies keep theirs."""
    study = make_study(storage)
    other = make_study(storage, "other")
    assert storage.study_versions() == {"s": (study.id, 0), "other": (other.id, 0)}
    assert storage.get_study("s").version == 0
    seen = [0]

    def moved(what: str) -> None:
        v = _version(storage)
        assert v > seen[-1], f"{what} did not move the version ({v})"
        assert storage.get_study("s").version == v
        seen.append(v)

    def kept(what: str) -> None:
        assert _version(storage) == seen[-1], f"{what} moved the version"

    storage.set_study_state("s", "running")
    moved("set_study_state")
    storage.set_study_attr(study.id, "calibration", {"a": 1})
    moved("set_study_attr")
    t = claim(storage, study.id, 1)
    assert t is not None
    moved("claim_trial")
    storage.heartbeat([t.id])
    kept("heartbeat")
    storage.start_trial(t.id, runner="r", host="h", log_path=None, metrics_path=None)
    moved("start_trial")
    storage.requeue_trial(t.id, reason="node lost")
    moved("requeue_trial")
    assert storage.acquire_queued_trial(study.id, runner="r2") is not None
    moved("acquire_queued_trial")
    steps = (StepMetrics(1, 1.0, 300.0, 40.0, 41.0, 7.0, 1.0),)
    storage.finish_trial(t.id, Outcome("ok", {"tflops_per_gpu": 300.0}, steps=steps), value=300.0)
    moved("finish_trial")
    storage.finish_trial(t.id, Outcome("ok", {"tflops_per_gpu": 1.0}), value=1.0)
    kept("finish_trial of a complete trial (returned unchanged)")
    storage.set_trial_numerics(t.id, {"status": "changed"})
    moved("set_trial_numerics")
    storage.add_rejection(
        study_id=study.id, params={"tp": 3}, params_key="k", kind="invalid", rule="r",
        reason="why", values={},
    )  # fmt: skip
    moved("add_rejection")
    assert _version(storage, "other") == 0
    assert seen == list(range(10))  # one step per write
    # best_version: all of them but claim, start, requeue and acquire (unfinished trials)
    assert storage.study_change_counters()["s"].best_version == 9 - 4
    assert storage.study_change_counters()["other"] == (other.id, 0, 0)


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_a_rolled_back_write_does_not_move_the_version(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The version moves in the write's transaction: a write that fails leaves it."""
    url = _url(backend, request, tmp_path_factory)
    with open_storage(url) as storage:
        study = make_study(storage)
        with pytest.raises(ValueError):  # refused before any change
            storage.claim_trial(
                study_id=study.id, params={"x": object()}, params_key="k", budget=10
            )
        assert claim(storage, study.id, 1, budget=1) is not None
        v = _version(storage)
        assert claim(storage, study.id, 2, budget=1) is None  # budget spent: nothing written
        assert _version(storage) == v


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_concurrent_writers_each_move_the_version(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two writers (their own engines, as two processes would have) finishing trials at once:
    no increment is lost, and none deadlocks."""
    url = _url(backend, request, tmp_path_factory)
    with open_storage(url) as storage:
        study = make_study(storage)
        trials = [claim(storage, study.id, tp) for tp in range(40)]
        base = _version(storage)
    errors: list[BaseException] = []

    def finish(part: list[int]) -> None:
        try:
            with open_storage(url) as st:
                for tid in part:
                    st.start_trial(tid, runner="w", host="h", log_path=None, metrics_path=None)
                    st.finish_trial(tid, Outcome("ok", {}), value=1.0)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ids = [t.id for t in trials if t is not None]
    threads = [threading.Thread(target=finish, args=(ids[k::2],)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors
    with open_storage(url) as storage:
        assert _version(storage) == base + 2 * len(ids)


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_upgrade_from_0002_starts_studies_at_version_0(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A database of the previous schema keeps its studies; they read as version 0 and move
    from there."""
    url = _url(backend, request, tmp_path_factory)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0002")
            conn.execute(
                text(
                    "INSERT INTO studies (name, space_yaml, space_hash, state, direction, "
                    "metric, model, hardware, created_at, updated_at) VALUES ('old', '', 'h', "
                    "'created', 'maximize', 'tflops_per_gpu', '{}', '{}', 0, 0)"
                )
            )
    finally:
        engine.dispose()
    with open_storage(url) as storage:
        assert storage.revision == head_revision()
        assert storage.get_study("old").version == 0
        storage.set_study_state("old", "running")
        assert storage.study_versions()["old"][1] == 1
        assert storage.study_change_counters()["old"].best_version == 1


def _url(backend: str, request: pytest.FixtureRequest, tmp: pytest.TempPathFactory) -> str:
    if backend == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        return url
    return f"sqlite:///{tmp.mktemp('v') / 'v.db'}"
