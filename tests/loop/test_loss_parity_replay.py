"""The loss-parity guard and the noise-aware best in a study, on replayed measured tables.

A table made from the measured H200 table (examples/tables) where the fastest row's loss
drifts by 1 %: the guard flags it and no best (``dse best``, ``GET .../best``, its exports,
the cross-study ``/best``) ever names it. A table with two configurations within noise: the
study re-measures them (recorded ``remeasure_of`` trials) and the best pools the runs and says
the tie. The guard's re-evaluation when the baseline finishes last, and the tolerance from
measured noise, through the controller's one place (:class:`dse.loop.loss_guard.LossGuard`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.agents import create_agent
from dse.cli.main import main
from dse.core.records import Outcome, StepMetrics
from dse.loop.context import StudyContext
from dse.loop.loss_guard import LOSS_PARITY_ATTR, LossGuard
from dse.loop.study import StudyRunner
from dse.runners import InProcessRunner
from dse.space.searchspace import params_key, parse_space
from dse.storage import Storage, open_storage
from dse.workloads.replay import ReplayTable
from tests.api.conftest import make_client
from tests.conftest import REPLAY_TABLE

#: The fastest row of the measured table (127.6 TFLOP/s) and the next one (127.0).
FASTEST = {
    "micro_batch_size": 2,
    "bias_activation_fusion": True,
    "cross_entropy_loss_fusion": True,
}
NEXT = {"micro_batch_size": 2, "bias_activation_fusion": True, "cross_entropy_loss_fusion": False}


def _drift_table(tmp_path: Path, factor: float = 1.01) -> Path:
    """The 8 rows without recompute at MBS 1 and 2; the fastest one's loss times ``factor``."""
    rows = [json.loads(x) for x in REPLAY_TABLE.read_text().splitlines() if x.strip()]
    keep = [
        r for r in rows
        if r["status"] == "ok" and r["params"]["recompute"] == "none"
        and r["params"]["micro_batch_size"] in (1, 2)
    ]  # fmt: skip
    assert len(keep) == 8
    for r in keep:
        if all(r["params"][k] == v for k, v in FASTEST.items()):
            assert r["metrics"]["tflops_per_gpu"] == 127.6
            r["metrics"]["loss"] = [x * factor for x in r["metrics"]["loss"]]
    path = tmp_path / "drift.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    return path


def _space(table: Path, study: str, tmp_path: Path, **upd: Any) -> Any:
    t = ReplayTable.load(table)
    data = t.to_space(study, agent={"name": "grid", "seed": 0}, table=str(table)).model_dump(
        mode="json"
    )
    data["runner"] = {"name": "local", "max_parallel": 2, "workdir": str(tmp_path / "runs")}
    data["budget"] = {"n_trials": len(t.rows), "remeasure": 0}
    for k, v in upd.items():
        data[k] = {**data.get(k, {}), **v}
    return parse_space(data, "test")


def _run(space: Any, st: Storage, runner: Any = None) -> Any:
    table = ReplayTable.load(space.workload.table)
    runner = runner or InProcessRunner(
        lambda s: table.outcome(s.params, s.workload.get("repeat", 0)), slots=2
    )
    loop = StudyRunner(
        space, storage=st, runner=runner, agent=create_agent(space),
        space_yaml=yaml.safe_dump(space.model_dump(mode="json")), features=None,
        progress=lambda m: None,
    )  # fmt: skip
    return loop.run()


def _is(params: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(params[k] == v for k, v in want.items())


def test_a_one_percent_drift_of_the_fastest_row_never_makes_it_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'drift.db'}"
    table = _drift_table(tmp_path)
    with open_storage(url) as st:
        res = _run(_space(table, "drift", tmp_path), st)
        assert not res.stopped and res.counts["complete"] == 8
        trials = st.list_trials(st.get_study("drift").id)
        attrs = st.get_study_attrs(st.get_study("drift").id)
    assert trials[0].metrics["numerics"]["status"] == "baseline"  # the baseline ran first
    fast = next(t for t in trials if _is(t.params, FASTEST))
    v = fast.metrics["numerics"]
    assert v["status"] == "changed" and v["drift"] == pytest.approx(0.01, abs=0.002)
    assert v["tolerance"] == 0.005 and v["baseline_trial"] == 0 and v["steps_compared"] == 6
    others = [t.metrics["numerics"]["status"] for t in trials if t is not fast]
    assert others == ["baseline"] + ["ok"] * 6  # execution knobs: within 0.14 % in bf16
    assert attrs[LOSS_PARITY_ATTR]["tolerance"] == 0.005
    assert res.best is not None and _is(res.best.params, NEXT)

    # dse best: the next-fastest row, in every format
    assert main(["best", "--storage", url, "--format", "json"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert _is(best["params"], NEXT) and best["objective"]["value"] == 127.0
    assert best["numerics"]["status"] == "ok" and best["trial"] != fast.number
    assert main(["best", "--storage", url, "--format", "megatron"]) == 0
    assert "--cross-entropy-loss-fusion" not in capsys.readouterr().out

    # dse status: the flag, in text and JSON
    assert main(["status", "--storage", url]) == 0
    text = capsys.readouterr().out
    assert "loss parity: 6 ok, 1 numerics changed, 0 unchecked; baseline trial 0" in text
    row = next(x for x in text.splitlines() if x.strip().startswith(f"{fast.number} "))
    assert "numerics changed (drift 1% > 0.5%)" in row
    assert main(["status", "--storage", url, "--format", "json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["numerics"]["counts"] == {"ok": 6, "changed": 1, "unchecked": 0, "baseline": 1}
    assert status["trials"][fast.number]["numerics"]["status"] == "changed"
    assert _is(status["best"]["params"], NEXT)

    # the API: best, the study's counts, the trial page, the cross-study best
    with make_client(url) as client:
        b = client.get("/api/v1/studies/drift/best").json()
        assert _is(b["params"], NEXT) and b["numerics"]["status"] == "ok"
        assert "--cross-entropy-loss-fusion" not in b["exports"]["megatron"]
        s = client.get("/api/v1/studies/drift").json()
        assert s["numerics_counts"]["changed"] == 1 and s["best_trial"] == best["trial"]
        page = client.get("/api/v1/studies/drift/trials?limit=100").json()["data"]
        flagged = [t["number"] for t in page if (t["numerics"] or {}).get("status") == "changed"]
        assert flagged == [fast.number]
        detail = client.get(f"/api/v1/studies/drift/trials/{fast.number}").json()
        assert detail["numerics"]["drift"] == pytest.approx(0.01, abs=0.002)
        cross = client.get("/api/v1/best?num_layers=16&gpu=nvidia h200").json()
        assert cross["matched"] == ["drift"] and _is(cross["best"]["params"], NEXT)
        text_best = client.get("/api/v1/studies/drift/best?format=yaml").text
        assert yaml.safe_load(text_best)["trial"] == best["trial"]


def test_a_flagged_configuration_may_be_best_when_the_space_allows_it(tmp_path: Path) -> None:
    table = _drift_table(tmp_path)
    url = f"sqlite:///{tmp_path / 'allow.db'}"
    space = _space(table, "allow", tmp_path, loss_parity={"allow_changed_in_best": True})
    with open_storage(url) as st:
        res = _run(space, st)
    assert res.best is not None and _is(res.best.params, FASTEST)
    assert res.best.metrics["numerics"]["status"] == "changed"  # still flagged, and shown
    with make_client(url) as client:
        assert _is(client.get("/api/v1/studies/allow/best").json()["params"], FASTEST)


def test_the_guard_off_judges_nothing(tmp_path: Path) -> None:
    table = _drift_table(tmp_path)
    with open_storage(f"sqlite:///{tmp_path / 'off.db'}") as st:
        res = _run(_space(table, "off", tmp_path, loss_parity={"enabled": False}), st)
        trials = st.list_trials(st.get_study("off").id)
    assert all("numerics" not in t.metrics for t in trials)
    assert res.best is not None and _is(res.best.params, FASTEST)


# --- the guard's one place: verdicts from storage ----------------------------------------


def _steps(losses: list[float]) -> tuple[StepMetrics, ...]:
    return tuple(StepMetrics(i, 1.0, 100.0, 1.0, 1.0, x) for i, x in enumerate(losses))


def _finish(st: Storage, sid: int, params: dict[str, Any], losses: list[float],
            remeasure_of: int | None = None) -> Any:  # fmt: skip
    t = st.claim_trial(study_id=sid, params=params, params_key=params_key(params), budget=99,
                       remeasure_of=remeasure_of, allow_repeat=True)  # fmt: skip
    assert t is not None
    out = Outcome("ok", {"tflops_per_gpu": 100.0, "step_time_s": 1.0, "peak_mem_gib": 1.0,
                         "losses": losses}, steps=_steps(losses))  # fmt: skip
    return st.finish_trial(t.id, out, value=100.0)


def test_the_baseline_finishing_last_judges_the_others_again(tmp_path: Path) -> None:
    space = _space(_drift_table(tmp_path), "late", tmp_path)
    base = space.baseline()
    other = {**base, "micro_batch_size": 2}
    curve = [10.0, 9.0, 8.0]
    with open_storage(f"sqlite:///{tmp_path / 'late.db'}") as st:
        rec, _ = st.get_or_create_study(space_yaml="{}", **space.study_fields())
        guard = LossGuard(StudyContext(space, st, rec.id))
        # trials run in parallel: the other one finishes before the baseline
        t1 = guard.on_finished(_finish(st, rec.id, other, [10.0, 9.1, 8.0]))
        assert t1.metrics["numerics"]["status"] == "unchecked"
        b = guard.on_finished(_finish(st, rec.id, base, curve))
        assert b.metrics["numerics"] == {"status": "baseline", "drift": 0.0,
                                         "tolerance": 0.005, "baseline_trial": 1,
                                         "steps_compared": 3}  # fmt: skip
        again = st.get_trial(t1.id).metrics["numerics"]
        assert again["status"] == "changed" and again["baseline_trial"] == 1
        assert again["drift"] == pytest.approx(0.1 / 9.0)
        assert st.count_numerics(rec.id) == {"ok": 0, "changed": 1, "unchecked": 0,
                                             "baseline": 1, "remeasure": 0}  # fmt: skip
        # a near trial is ok; a baseline repeat measures noise, the tolerance follows it
        near = guard.on_finished(_finish(st, rec.id, {**base, "micro_batch_size": 4},
                                         [10.0, 9.0, 8.056]))  # fmt: skip
        assert near.metrics["numerics"]["status"] == "changed"  # 0.7 % > 0.5 %
        guard.on_finished(_finish(st, rec.id, base, [10.0, 9.0, 8.024], remeasure_of=1))
        tol = st.get_study_attrs(rec.id)[LOSS_PARITY_ATTR]
        assert tol["noise"] == pytest.approx(0.003) and tol["noise_pairs"] == 1
        assert tol["tolerance"] == pytest.approx(0.009)  # 3 x the measured noise > the floor
        assert st.get_trial(near.id).metrics["numerics"]["status"] == "ok"
        assert st.get_trial(t1.id).metrics["numerics"]["status"] == "changed"  # 1.1 % still


def test_baseline_repeats_are_recorded_remeasurements(tmp_path: Path) -> None:
    table = _drift_table(tmp_path)
    space = _space(table, "reps", tmp_path, loss_parity={"baseline_repeats": 1},
                   budget={"n_trials": 4})  # fmt: skip
    with open_storage(f"sqlite:///{tmp_path / 'reps.db'}") as st:
        res = _run(space, st)
        trials = st.list_trials(st.get_study("reps").id)
        attrs = st.get_study_attrs(st.get_study("reps").id)
    assert res.counts["total"] == 5  # 4 proposed + 1 baseline repeat on top
    again = [t for t in trials if t.remeasure_of is not None]
    assert len(again) == 1 and again[0].remeasure_of == 0 and again[0].params == trials[0].params
    assert attrs[LOSS_PARITY_ATTR]["noise_pairs"] == 1
    assert attrs[LOSS_PARITY_ATTR]["noise"] == 0.0  # a replayed row repeats exactly


# --- the noise-aware best ----------------------------------------------------------------


def _noise_table(tmp_path: Path) -> Path:
    """Three configurations: a slow baseline and two within noise of each other, each of
    those measured twice (per-step times +-2 %; the second run of MBS 4 is the better one)."""
    rows = [json.loads(x) for x in REPLAY_TABLE.read_text().splitlines() if x.strip()]
    first = next(r for r in rows if r["status"] == "ok")
    times = [2.0, 1.5, 1.0, 1.02, 0.98, 1.0]

    def row(mbs: int, tflops: float) -> dict[str, Any]:
        r = json.loads(json.dumps(first))
        r["params"] = {**r["params"], "micro_batch_size": mbs}
        m = r["metrics"]
        m["tflops_per_gpu"] = tflops
        m["step_times_s"] = [t * m["step_time_s"] for t in times]
        return r

    table = [row(1, 100.0), row(2, 120.0), row(4, 120.5), row(2, 121.5), row(4, 119.0)]
    path = tmp_path / "noise.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in table))
    return path


def test_configurations_within_noise_are_remeasured_and_the_tie_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The local runner (real replay trial processes): MBS 4 leads after one run each
    (120.5 vs 120.0), both intervals overlap, so both run again (budget.remeasure 2);
    pooled, MBS 2 is ahead (120.75 vs 119.75) and still within noise: tied."""
    from dse.runners.local import LocalRunner

    space = _space(_noise_table(tmp_path), "noisy", tmp_path, budget={"remeasure": 2})
    url = f"sqlite:///{tmp_path / 'noisy.db'}"
    with open_storage(url) as st:
        res = _run(space, st, LocalRunner(device="cpu", world_size=1, max_parallel=2))
        trials = st.list_trials(st.get_study("noisy").id)
    assert not res.stopped and len(trials) == 5
    first = {t.params["micro_batch_size"]: t.number for t in trials if t.remeasure_of is None}
    again = sorted((t.remeasure_of, t.metrics["tflops_per_gpu"]) for t in trials
                   if t.remeasure_of is not None)  # fmt: skip
    assert again == sorted([(first[2], 121.5), (first[4], 119.0)])  # the table's 2nd runs
    assert all(t.metrics["numerics"]["status"] in ("baseline", "ok") for t in trials)

    assert main(["best", "--storage", url, "--format", "json"]) == 0
    best = json.loads(capsys.readouterr().out)
    noise = best["noise"]
    assert best["trial"] == first[2] and best["objective"]["value"] == pytest.approx(120.75)
    assert sorted(noise["trials"]) == sorted([first[2], 4 if first[2] != 4 else 3])
    lo, hi = noise["figures"]["tflops_per_gpu"]["ci"]
    assert lo < 120.75 < hi and noise["interval_source"] == "steps"
    assert noise["message"].startswith(
        f"tied within noise: trial {first[2]} and trial {first[4]}; "
    )
    assert [t["trial"] for t in noise["tied"]] == [first[4]]
    assert noise["tied"][0]["value"] == pytest.approx(119.75)
    assert main(["best", "--storage", url, "--format", "bridge"]) == 0
    assert "tied within noise" in capsys.readouterr().err
    with make_client(url) as client:
        s = client.get("/api/v1/studies/noisy").json()
        assert s["remeasure_trials"] == 2 and s["best_tied"] == [first[4]]
        assert s["best_value"] == pytest.approx(120.75) and s["best_ci"][0] < 120.75
        page = client.get("/api/v1/studies/noisy/trials").json()["data"]
        assert sorted(t["remeasure_of"] for t in page if t["remeasure_of"] is not None) == sorted(
            [first[2], first[4]]
        )


def test_configurations_equal_in_effect_are_pooled_as_one(tmp_path: Path) -> None:
    """Trials stored before a knob was known to be inert (or imported): the distributed
    optimizer at DP 1 does nothing, so both runs are one configuration of the best."""
    space = parse_space(
        {**yaml.safe_load(Path(REPLAY_TABLE.parent.parent / "replay_llama1b.yaml").read_text()),
         "knobs": {"micro_batch_size": {"values": [1, 2]},
                   "use_distributed_optimizer": {"type": "bool"}},
         "fixed": {"attention_backend": "unfused", "tensor_model_parallel_size": 1}},
        "test",
    )  # fmt: skip
    url = f"sqlite:///{tmp_path / 'twins.db'}"
    with open_storage(url) as st:
        rec = st.create_study(space_yaml=yaml.safe_dump(space.model_dump(mode="json")),
                              **space.study_fields())  # fmt: skip
        for distopt, tflops in ((False, 120.0), (True, 121.0)):
            p = {"micro_batch_size": 2, "use_distributed_optimizer": distopt}
            t = st.claim_trial(study_id=rec.id, params=p, params_key=params_key(p), budget=9)
            assert t is not None
            st.finish_trial(t.id, Outcome("ok", {"tflops_per_gpu": tflops, "step_time_s": 1.0,
                                                 "peak_mem_gib": 1.0}), value=tflops)  # fmt: skip
    with make_client(url) as client:
        b = client.get(f"/api/v1/studies/{space.study}/best").json()
    assert b["noise"]["trials"] == [0, 1] and b["objective"]["value"] == 120.5
    assert b["noise"]["tied"] == []


def test_a_trial_cannot_certify_its_own_numerics_and_bad_ones_never_break_reads(
    tmp_path: Path,
) -> None:
    """A metrics file's own ``numerics`` is dropped at finish (the verdict is the
    controller's); an imported study's malformed verdict reads as null, never a 500."""
    from dse.storage import read_export_text

    space = _space(_drift_table(tmp_path), "self", tmp_path)
    url = f"sqlite:///{tmp_path / 'self.db'}"
    p = space.baseline()
    with open_storage(url) as st:
        rec = st.create_study(space_yaml=yaml.safe_dump(space.model_dump(mode="json")),
                              **space.study_fields())  # fmt: skip
        t = st.claim_trial(study_id=rec.id, params=p, params_key=params_key(p), budget=9)
        assert t is not None
        m = {"tflops_per_gpu": 1.0, "step_time_s": 1.0, "peak_mem_gib": 1.0,
             "numerics": {"status": "baseline"}}  # fmt: skip
        done = st.finish_trial(t.id, Outcome("ok", m), value=1.0)
        assert "numerics" not in done.metrics and st.count_numerics(rec.id)["baseline"] == 0
        export = st.export_study("self")
        export["trials"][0]["metrics"]["numerics"] = {"status": "ok", "drift": "none at all"}
        st.import_study(read_export_text(json.dumps(export)), name="imported")
        assert st.count_numerics(st.get_study("imported").id)["ok"] == 1
    with make_client(url) as client:
        detail = client.get("/api/v1/studies/imported/trials/0")
        assert detail.status_code == 200 and detail.json()["numerics"] is None
        best = client.get("/api/v1/studies/imported/best")
        assert best.status_code == 200 and best.json()["numerics"] is None


def test_a_failed_baseline_runs_again_and_becomes_the_reference(tmp_path: Path) -> None:
    """Its loss is every trial's reference: when its run crashes, the controller runs the
    baseline again (within the budget); the others are judged once it completes."""
    table = _drift_table(tmp_path)
    space = _space(table, "again", tmp_path, budget={"n_trials": 4})
    replay = ReplayTable.load(table)
    base_key = params_key(space.baseline())
    crashes = [1]

    def answer(spec: Any) -> Outcome:
        if params_key(space.canonical(spec.params)) == base_key and crashes:
            crashes.pop()
            return Outcome.failure("error", "the first run of the baseline crashed")
        return replay.outcome(spec.params)

    with open_storage(f"sqlite:///{tmp_path / 'again.db'}") as st:
        res = _run(space, st, InProcessRunner(answer, slots=1))
        trials = st.list_trials(st.get_study("again").id)
    assert res.counts["total"] == 4
    assert (trials[0].state, trials[1].state) == ("failed", "complete")
    assert trials[1].params == trials[0].params and trials[1].remeasure_of is None
    assert [t.metrics["numerics"]["status"] for t in trials[1:]] == ["baseline", "ok", "ok"]
    assert all(t.metrics["numerics"]["baseline_trial"] == 1 for t in trials[1:])
