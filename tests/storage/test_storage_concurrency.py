"""Several writers on one study: 4 processes claim, run and finish trials concurrently.

Each worker opens the (fresh) database itself, so migrations race too, then creates the
study with ``get_or_create_study`` (one creator wins), then claims configurations from a
shared pool in its own shuffled order (so proposals overlap) until the budget is spent.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import time
from typing import Any

import pytest

from dse.core.records import Outcome
from dse.storage import open_storage

N_WORKERS = 4
BUDGET = 40
# 64 distinct configurations; every worker proposes all of them in its own order, so
# proposals overlap heavily and the budget (40), not the pool, ends the study.
POOL = [
    {"tp": tp, "pp": pp, "mbs": mbs, "recompute": rc}
    for tp in (1, 2, 4, 8)
    for pp in (1, 2)
    for mbs in (1, 2, 4, 8)
    for rc in (False, True)
]


def _worker(url: str, seed: int, start: Any, ready: Any, out: Any) -> None:
    storage = open_storage(url)
    start.wait(timeout=60)
    study, created = storage.get_or_create_study(
        name="shared", space_yaml="knobs: {}", space_hash="h", direction="maximize",
        metric="tflops_per_gpu", model={}, hardware={},
    )  # fmt: skip
    # all workers hold the study before any claims, so none can drain the budget while
    # another is still starting up (a spawned interpreter takes a second on a busy machine)
    ready.wait(timeout=120)
    order = list(POOL)
    random.Random(seed).shuffle(order)
    claimed: list[int] = []
    for params in order:
        t = storage.claim_trial(
            study_id=study.id, params=params, params_key=json.dumps(params, sort_keys=True),
            budget=BUDGET, runner=f"w{seed}",
        )  # fmt: skip
        if t is not None:
            claimed.append(t.number)
            storage.start_trial(
                t.id, runner=f"w{seed}", host="h", log_path=None, metrics_path=None
            )
            time.sleep(0.02)  # the trial "runs"; others claim meanwhile
            storage.finish_trial(t.id, Outcome("ok", {"v": t.number}), value=float(t.number))
        elif storage.count_trials(study.id)["total"] >= BUDGET:
            break
    storage.close()
    out.put((seed, created, claimed))


def _run_workers(url: str) -> list[tuple[int, bool, list[int]]]:
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    ready = ctx.Barrier(N_WORKERS)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, w, start, ready, out)) for w in range(N_WORKERS)
    ]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.fixture(params=["sqlite-file", pytest.param("postgresql", marks=pytest.mark.postgres)])
def shared_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite-file":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    url: str = request.getfixturevalue("fresh_pg_url")
    return url


def test_four_writers_one_study(shared_url: str) -> None:
    results = _run_workers(shared_url)
    assert sum(created for _, created, _ in results) == 1
    claimed = sorted(n for _, _, ns in results for n in ns)
    assert claimed == list(range(BUDGET))  # no number twice, none skipped
    with open_storage(shared_url) as storage:
        study = storage.get_study("shared")
        trials = storage.list_trials(study.id)
        assert [t.number for t in trials] == list(range(BUDGET))
        assert all(t.state == "complete" and t.value == t.number for t in trials)  # none lost
        keys = [t.params_key for t in trials]
        assert len(set(keys)) == len(keys)  # no configuration twice
        assert storage.count_trials(study.id)["total"] == BUDGET
    # every worker got some of the work
    assert sum(1 for _, _, ns in results if ns) >= 2
