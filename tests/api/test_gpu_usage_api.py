"""The `gpu` object of a study summary (GET /studies, GET /studies/{name}): the same figures
as `dse status` (dse.results.gpu_usage), with each trial's start-up / measure split in its
metrics."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from dse.cli.main import main as cli_main
from dse.core.records import Outcome
from dse.results.gpu_usage import HELD_ATTR_PREFIX, held_record, study_gpu_usage_of, trial_timing
from dse.space.searchspace import params_key
from dse.storage import open_storage
from tests.api.conftest import BACKENDS, make_client, new_url
from tests.api.seed import create_study, ok

V1 = "/api/v1"


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    u = new_url(request.param, request, tmp_path)
    st = open_storage(u)
    try:
        sid = create_study(st, "timed")
        for n, (mbs, wall) in enumerate([(1, 30.0), (2, 10.0)]):
            params = {"tensor_model_parallel_size": 1, "micro_batch_size": mbs,
                      "use_distributed_optimizer": False}  # fmt: skip
            t = st.claim_trial(study_id=sid, params=params, params_key=params_key(params),
                               budget=10, allow_repeat=False, runner="c:1:x")  # fmt: skip
            assert t is not None
            st.start_trial(t.id, runner="c:1:x", host="h", log_path=None, metrics_path=None)
            out = ok(300.0 + n, 60.0)
            timing = trial_timing(wall_s=wall, devices=1, device="cuda", steps=out.steps,
                                  measured=True, gpu_slots=["h:0"])  # fmt: skip
            out = Outcome("ok", {**out.metrics, **timing}, steps=out.steps)
            st.finish_trial(t.id, out, value=300.0 + n, gpu_seconds=wall)
        st.set_study_attr(sid, HELD_ATTR_PREFIX + "c:1:x", held_record(0.0, 2, "cuda", 40.0))
    finally:
        st.close()
    return u


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested figures (the accounting's parts) as one level, for pytest.approx."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_study_summary_has_the_gpu_usage(url: str) -> None:
    with make_client(url) as client:
        one = client.get(f"{V1}/studies/timed").json()
        listed = client.get(f"{V1}/studies").json()["data"][0]
        trial = client.get(f"{V1}/studies/timed/trials/0").json()
    g = one["gpu"]
    assert listed["gpu"] == g
    steps_s = 4 * 0.5 + 0.01 * (0 + 1 + 2 + 3)  # the seeded step times of a trial
    assert g["device"] == "cuda" and g["held_basis"] == "controller"
    assert g["gpu_hours"] == pytest.approx(40.0 / 3600) == pytest.approx(one["gpu_hours"])
    assert g["gpu_hours_measure"] == pytest.approx(2 * steps_s / 3600)
    assert g["gpu_hours_startup"] + g["gpu_hours_measure"] == pytest.approx(g["gpu_hours"])
    assert g["held_gpu_hours"] == pytest.approx(80.0 / 3600)
    assert g["busy_fraction"] == pytest.approx(2 * steps_s / 80.0)
    assert g["trials_run"] == 2 and g["trials_timed"] == 2
    assert g["grid_configurations"] >= 2 and g["saved_gpu_hours"] is not None
    m = trial["metrics"]
    # slot labels hold host names: readers without the token do not see them (SECURITY.md)
    assert "gpu_slots" not in m and m["timing"]["devices"] == 1
    assert m["gpu_seconds_startup"] + m["gpu_seconds_measure"] == pytest.approx(
        trial["gpu_seconds"]
    )
    # dse status shows the same figures
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli_main(["status", "--storage", url, "--study", "timed", "--format", "json"]) == 0
    assert _flat(json.loads(buf.getvalue())["gpu"]) == pytest.approx(_flat(g))
    st = open_storage(url)
    try:
        assert _flat(study_gpu_usage_of(st, st.get_study("timed"))) == pytest.approx(_flat(g))
    finally:
        st.close()
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli_main(["status", "--storage", url, "--study", "timed"]) == 0
    assert "GPU-busy" in buf.getvalue() and "saved" in buf.getvalue()


def test_study_list_reads_gpu_totals_not_every_trial(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a write, the study list's GPU figures come from the storage's aggregate of the
    trials' columns (Storage.gpu_totals), not from reading every trial (8.2 s at 100,000
    trials before, docs/BENCHMARKS.md section 28); they are the fold over the records."""
    from dse.results.gpu_usage import gpu_totals, study_gpu_usage
    from dse.results.gpu_usage import grid_of_study as grid_of
    from dse.storage import Storage

    st = open_storage(url)
    try:
        study = st.get_study("timed")
        attrs = st.get_study_attrs(study.id)
        want = study_gpu_usage(st.list_trials(study.id), attrs, device="cuda",
                               grid=grid_of(study, attrs))  # fmt: skip
        assert st.gpu_totals(study.id).trials == gpu_totals(st.list_trials(study.id)).trials
    finally:
        st.close()

    def no_list(*a: object, **kw: object) -> None:
        raise AssertionError("the study list read every trial")

    from dse.api import views

    monkeypatch.setattr(Storage, "list_trials", no_list)
    views._GPU_CACHE.clear()  # no answer kept from an earlier test
    with make_client(url) as client:
        listed = client.get(f"{V1}/studies").json()["data"][0]["gpu"]
        one = client.get(f"{V1}/studies/timed").json()["gpu"]
    assert listed == one
    assert _flat({k: v for k, v in listed.items() if v is not None}) == pytest.approx(
        _flat({k: v for k, v in want.items() if v is not None})
    )
