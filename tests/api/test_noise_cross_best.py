"""The cross-study answer pools evidence (issue 35): ``GET /api/v1/best`` over a study, its
imported copy and a second run of it gives one answer whose best configuration pools the
runs of both runs of the study, the copy's runs not counted again (they are the same runs:
same knobs, same figures, same per-step metrics); the trials page's interval of a trial is
the one the best carries. Real app, SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from dse.storage import open_storage
from tests.api.conftest import make_client
from tests.api.seed_noise import RUNS_A, _fill, seed_noise

V1 = "/api/v1"
QUERY = {"num_layers": 4, "world_size": 2, "metric": "tflops_per_gpu"}
#: The best configuration's runs in noise-a (trials 0, 3 and 5).
BEST_RUNS = [i for i, (p, _, _) in enumerate(RUNS_A) if p == RUNS_A[0][0]]


def _flat(figures: dict[str, Any]) -> list[float]:
    """Each figure's value and bounds (the same within rounding: the study's noise comes
    from SQL aggregates, the pooled one from the runs)."""
    out: list[float] = []
    for k in sorted(figures):
        f = figures[k]
        out += [f["value"], *(f["ci"] or [])]
    return out


def _url(tmp_path: Path, name: str, *, copy: bool, rerun: bool) -> str:
    url = f"sqlite:///{tmp_path / name}"
    with open_storage(url) as st:
        seed_noise(st)
        if copy:
            st.import_study(st.export_study("noise-a"), name="noise-a-copy")
        if rerun:  # the same configurations measured again: other runs, other figures
            _fill(st, "noise-a-again", RUNS_A, 7)
    return url


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(_url(tmp_path, "all.db", copy=True, rerun=True)) as c:
        yield c


def test_cross_study_best_pools_runs_and_counts_a_copy_once(
    client: TestClient, tmp_path: Path
) -> None:
    r = client.get(f"{V1}/best", params=QUERY)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body["matched"]) >= {"noise-a", "noise-a-copy", "noise-a-again"}
    noise = body["best"]["noise"]
    evidence = {(e["study"], e["trial"]) for e in noise["evidence"]}
    # both runs of the study pooled: the original's three runs and the second run's three
    assert evidence == {(s, n) for s in ("noise-a", "noise-a-again") for n in BEST_RUNS}
    assert noise["n_trials"] == 2 * len(BEST_RUNS) == len(noise["evidence"])
    assert body["best"]["study"] == "noise-a"  # the first study holding it
    # the copy adds nothing: the answer without it is the same answer, figure and interval
    with make_client(_url(tmp_path, "nocopy.db", copy=False, rerun=True)) as c:
        alone = c.get(f"{V1}/best", params=QUERY).json()["best"]
    assert alone["objective"] == body["best"]["objective"]
    assert alone["noise"]["figures"] == noise["figures"]
    assert [t["trial"] for t in alone["noise"]["tied"]] == [t["trial"] for t in noise["tied"]]
    # ties across studies follow the one rule: each tied configuration's interval overlaps
    lo, hi = noise["figures"]["tflops_per_gpu"]["ci"]
    for t in noise["tied"]:
        assert t["ci"][0] <= hi and lo <= t["ci"][1], t
        assert (t["study"], t["trial"]) != ("noise-a-copy", t["trial"])


def test_a_study_and_its_copy_alone_answer_as_the_study(tmp_path: Path) -> None:
    """Over a study and its imported copy, the pooled answer is the study's own best."""
    with make_client(_url(tmp_path, "copy.db", copy=True, rerun=False)) as c:
        cross = c.get(f"{V1}/best", params=QUERY).json()["best"]
        own = c.get(f"{V1}/studies/noise-a/best").json()
        page = c.get(f"{V1}/studies/noise-a/trials").json()
    assert cross["noise"]["n_trials"] == own["noise"]["n_trials"] == len(BEST_RUNS)
    assert cross["objective"]["value"] == pytest.approx(own["objective"]["value"])
    assert _flat(cross["noise"]["figures"]) == pytest.approx(_flat(own["noise"]["figures"]))
    # the trials page's interval of the best's runs is the best's
    for n in BEST_RUNS:
        iv = page["intervals"][str(n)]
        assert iv["figures"]["tflops_per_gpu"] == own["noise"]["figures"]["tflops_per_gpu"]
        assert iv["n"] == len(BEST_RUNS) and iv["kind"] == "measured"
