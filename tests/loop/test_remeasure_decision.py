"""Re-measure to a decision (issue 35), through the study loop on a replayed table whose rows
are runs: MBS 1 and MBS 2 lie 10 % apart, within the run-to-run prior of one run each, so the
answer after the budget's trials is a tie; the loop re-measures the best and the one it cannot
yet separate, the re-measures show runs agree to 0.2 %, the intervals narrow and the best is
separated: the loop stops there, with re-measures of budget.remeasure left, and says "best"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dse.results.best_formats import best_payload
from dse.results.noise import study_best
from dse.storage import open_storage
from tests.conftest import REPLAY_TABLE
from tests.loop.test_loss_parity_replay import _run, _space


def _table(tmp_path: Path) -> Path:
    rows = [json.loads(x) for x in REPLAY_TABLE.read_text().splitlines() if x.strip()]
    first = next(r for r in rows if r["status"] == "ok")
    times = [2.0, 1.5, 1.0, 1.01, 0.99, 1.0]

    def row(mbs: int, tflops: float) -> dict[str, Any]:
        r = json.loads(json.dumps(first))
        r["params"] = {**r["params"], "micro_batch_size": mbs}
        m = r["metrics"]
        m["tflops_per_gpu"] = tflops
        m["step_times_s"] = [t * m["step_time_s"] for t in times]
        return r

    table = [row(1, 100.0), row(2, 90.0), row(4, 60.0), row(1, 100.2), row(2, 90.1),
             row(4, 60.1), row(1, 99.8), row(2, 89.9)]  # fmt: skip
    path = tmp_path / "decide.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in table))
    return path


def test_re_measures_stop_once_the_best_is_separated(tmp_path: Path) -> None:
    space = _space(_table(tmp_path), "decide", tmp_path, budget={"remeasure": 6})
    url = f"sqlite:///{tmp_path / 'decide.db'}"
    with open_storage(url) as st:
        # what one run each says: a tie (10 % apart, the prior's +-8 % each)
        res = _run(space, st)
        assert not res.stopped
        study = st.get_study("decide")
        trials = st.list_trials(study.id)
        first = [t for t in trials if t.remeasure_of is None]
        again = [t for t in trials if t.remeasure_of is not None]
        nb = study_best(st, study, space)
        p = best_payload(st, study)
    assert len(first) == 3
    # the tie was re-measured (the best and MBS 2, not the clearly slower MBS 4), then the
    # loop stopped: the best separated with 4 of the 6 re-measures left
    assert sorted(t.params["micro_batch_size"] for t in again) == [1, 2]
    assert nb is not None and nb.best.params["micro_batch_size"] == 1 and nb.tied == ()
    assert nb.model.dof == 2 and nb.model.basis == "re-measures"
    assert p["noise"]["verdict"] == "best" and p["noise"]["answer"].startswith("best: trial ")
    assert p["noise"]["message"] == ""
