"""The study loop's conversation with its agent (dse/loop/agent_session.py), on real parts: a
SQLite storage, the random agent of the registry, the cost model. What storage holds is what
the agent is told on a restore or a warm start; rejections are stored as they happen;
duplicates are answered from storage; every tell reaches the agent and the calibration."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dse.agents import SpaceAgent, create_agent
from dse.core.records import PRUNED_STOP_REASON, Outcome, TrialRecord
from dse.loop.agent_session import AgentSession, outcome_of_record
from dse.loop.context import StudyContext
from dse.model.costmodel import CostModel
from dse.space.searchspace import SearchSpace, params_key
from dse.storage import Storage, open_storage
from tests.conftest import SMALL_MODEL, small_space

TP, MBS = "tensor_model_parallel_size", "micro_batch_size"
KNOBS = {TP: {"values": [1, 2]}, MBS: {"values": [1, 2, 4]}}


def P(tp: int, mbs: int) -> dict[str, Any]:  # noqa: N802 - a configuration, read as P(tp, mbs)
    return {TP: tp, MBS: mbs}


#: the six configurations of KNOBS (world size 2, GBS 8: every one passes the rules)
ALL = [P(tp, m) for tp in (1, 2) for m in (1, 2, 4)]


def _space(study: str = "s", **extra: Any) -> SearchSpace:
    extra.setdefault("agent", {"name": "random", "seed": 1})
    return small_space(study, KNOBS, world_size=2, **extra)


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Storage]:
    with open_storage(f"sqlite:///{tmp_path / 'dse.db'}") as st:
        yield st


def _study(st: Storage, sp: SearchSpace, **model: Any) -> int:
    fields = sp.study_fields()
    if model:
        fields["model"] = model
    return st.create_study(space_yaml="{}", **fields).id


def _finished(st: Storage, sid: int, params: dict[str, Any], outcome: Outcome) -> TrialRecord:
    """A trial of ``params`` claimed and finished with ``outcome``."""
    t = st.claim_trial(study_id=sid, params=params, params_key=params_key(params), budget=100,
                       allow_repeat=True)  # fmt: skip
    assert t is not None
    return st.finish_trial(t.id, outcome, value=outcome.metrics.get("tflops_per_gpu"))


def _ok(tflops: float, **metrics: Any) -> Outcome:
    return Outcome("ok", {"tflops_per_gpu": tflops, **metrics})


def _seen(agent: SpaceAgent) -> list[tuple[dict[str, Any], str, Any, Any]]:
    """What the agent was told, in order: (params, state, values, failure class)."""
    return [
        (o.params, o.feedback.state, o.feedback.values, o.feedback.failure_class)
        for o in agent.observations
    ]


def _session(
    st: Storage, sp: SearchSpace, sid: int, cost_model: Any = None
) -> tuple[AgentSession, SpaceAgent, list[str]]:
    agent = create_agent(sp)
    lines: list[str] = []
    ctx = StudyContext(sp, st, sid, features=set(), progress=lines.append)
    session = AgentSession(ctx, agent, cost_model=cost_model)
    return session, agent, lines


# --- outcome_of_record ---------------------------------------------------------------------


def test_outcome_of_record_stands_for_each_finished_state(storage: Storage) -> None:
    sp = _space()
    sid = _study(storage, sp)
    done = _finished(storage, sid, P(1, 1), _ok(50.0, peak_mem_gib=1.1))
    est = _finished(
        storage, sid, P(1, 2), Outcome("ok", {"tflops_per_gpu": 9.0}, source="estimate")
    )
    cuda_oom = Outcome.failure("oom", "CUDA out of memory", metrics={"peak_mem_gib": 79.5})
    oom = _finished(storage, sid, P(1, 4), cuda_oom)
    err = _finished(storage, sid, P(2, 1), Outcome.failure("error", "exit 1"))
    bare = _finished(storage, sid, P(2, 2), Outcome("failed"))  # no class, no reason stored
    measurement = {"stop_reason": PRUNED_STOP_REASON}
    pruned = _finished(storage, sid, P(2, 4), _ok(7.0, measurement=measurement))
    assert [t.state for t in (done, est, oom, err, bare, pruned)] == [
        "complete", "complete", "infeasible", "failed", "failed", "pruned",
    ]  # fmt: skip

    out = outcome_of_record(done)
    assert (out.status, out.source, out.failure_class) == ("ok", "measured", None)
    assert out.metrics == {"tflops_per_gpu": 50.0, "peak_mem_gib": 1.1}
    assert outcome_of_record(est).source == "estimate"
    out = outcome_of_record(oom)
    assert (out.status, out.failure_class, out.reason) == (
        "infeasible",
        "oom",
        "CUDA out of memory",
    )
    assert out.metrics == {"peak_mem_gib": 79.5}
    out = outcome_of_record(err)
    assert (out.status, out.failure_class, out.reason) == ("failed", "error", "exit 1")
    out = outcome_of_record(bare)  # a failure without a class is an error, with no reason
    assert (out.status, out.failure_class, out.reason) == ("failed", "error", "")
    out = outcome_of_record(pruned)  # measured figures, stopped as dominated
    assert out.ok and out.pruned and out.metrics["tflops_per_gpu"] == 7.0
    # a record stored before it kept a source stands for a measurement
    assert outcome_of_record(dataclasses.replace(done, source=None)).source == "measured"
    assert outcome_of_record(dataclasses.replace(err, source=None)).source == "measured"


# --- restore -------------------------------------------------------------------------------


def test_restore_tells_finished_trials_and_rejections_not_open_ones(storage: Storage) -> None:
    sp = _space()
    sid = _study(storage, sp)
    _finished(storage, sid, P(1, 1), _ok(50.0))
    _finished(storage, sid, P(1, 2), Outcome.failure("oom", "OOM", metrics={"peak_mem_gib": 81.0}))
    _finished(storage, sid, P(1, 4), Outcome.failure("hang", "no step for 300 s"))
    queued = storage.claim_trial(study_id=sid, params=P(2, 1), params_key=params_key(P(2, 1)),
                                 budget=100)  # fmt: skip
    running = storage.claim_trial(study_id=sid, params=P(2, 2), params_key=params_key(P(2, 2)),
                                  budget=100)  # fmt: skip
    assert queued is not None and running is not None
    storage.start_trial(running.id, runner="r", host="h", log_path=None, metrics_path=None)
    storage.add_rejection(study_id=sid, params=P(2, 4), params_key=params_key(P(2, 4)),
                          kind="invalid", rule="a_rule", reason="broken", values={})  # fmt: skip

    session, agent, lines = _session(storage, sp, sid)
    session.restore()
    assert _seen(agent) == [
        (P(1, 1), "complete", (50.0,), None),
        (P(1, 2), "infeasible", None, "oom"),
        (P(1, 4), "failed", None, "hang"),
        (P(2, 4), "infeasible", None, "invalid"),
    ]
    # an OOM is told with the GPU's capacity beside the peak it reached
    assert agent.observations[1].feedback.metrics == {"peak_mem_gib": 81.0, "gpu_memory_gib": 80.0}
    assert lines == ["agent restored from storage: 3 finished trials"]
    # what the agent now proposes: only what storage holds no answer for (the open trials too)
    got = session.propose(6)
    assert got.exhausted and not got.rejections and not got.duplicates
    assert sorted(params_key(s.params) for s in got) == sorted(
        params_key(p) for p in (P(2, 1), P(2, 2))
    )


def test_restore_of_a_new_study_tells_nothing_and_says_nothing(storage: Storage) -> None:
    sp = _space()
    session, agent, lines = _session(storage, sp, _study(storage, sp))
    session.restore()
    assert agent.observations == [] and lines == []
    assert session.propose(1)[0].params == sp.baseline()  # a fresh agent starts at the baseline


def test_restore_feeds_measured_peaks_to_the_cost_model(
    storage: Storage, caplog: pytest.LogCaptureFixture
) -> None:
    sp = _space()
    sid = _study(storage, sp)
    _finished(storage, sid, P(1, 1), _ok(50.0, peak_mem_gib=1.3))
    _finished(storage, sid, P(1, 2), Outcome.failure("oom", "OOM", metrics={"peak_mem_gib": 81.0}))
    _finished(storage, sid, P(1, 4), Outcome.failure("error", "x", metrics={"peak_mem_gib": 5.0}))
    _finished(storage, sid, P(2, 1), _ok(40.0))  # no peak: nothing to learn
    _finished(storage, sid, P(2, 2), Outcome("ok", {"tflops_per_gpu": 9.0, "peak_mem_gib": 9.0},
                                             source="estimate"))  # fmt: skip
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    session, _, _ = _session(storage, sp, sid, cm)
    with caplog.at_level(logging.DEBUG, logger="dse.loop.study"):
        session.restore()
    cal = cm.calibration()
    assert [(o["peak_gib"], o["oom"]) for o in cal["observations"]] == [(1.3, False), (81.0, True)]
    assert (cal["n_ok"], cal["n_oom"]) == (1, 1)
    assert "stored calibration" not in caplog.text  # none stored yet

    storage.set_study_attr(sid, "costmodel", cal)
    cm2 = CostModel(sp.model, sp.semantics, sp.resources)
    session2, _, _ = _session(storage, sp, sid, cm2)
    with caplog.at_level(logging.DEBUG, logger="dse.loop.study"):
        session2.restore()
    assert "stored calibration" in caplog.text
    assert len(cm2.calibration()["observations"]) == 2


# --- warm start ------------------------------------------------------------------------------


def test_warm_start_tells_the_fitting_answered_trials_of_the_earlier_study(
    storage: Storage,
) -> None:
    old = _space("old")
    oid = _study(storage, old)
    _finished(storage, oid, P(2, 2), _ok(60.0))  # told
    _finished(storage, oid, P(1, 1), _ok(50.0))  # the baseline: measured here again, not told
    _finished(storage, oid, P(1, 8), _ok(70.0))  # MBS 8 is outside this space's domain
    _finished(storage, oid, P(2, 4), Outcome.failure("error", "x"))  # failed: not an answer
    _finished(storage, oid, P(1, 4), Outcome.failure("oom", "OOM"))  # told, as infeasible
    _finished(storage, oid, {MBS: 2}, _ok(55.0))  # TP at this space's baseline (1)
    # settings this space fixes: told only where the earlier study ran them as fixed here
    _finished(storage, oid, {**P(2, 1), "use_distributed_optimizer": True}, _ok(65.0))
    _finished(storage, oid, {**P(2, 1), "use_distributed_optimizer": False}, _ok(66.0))

    sp = _space("new", agent={"name": "random", "seed": 1, "warm_start_study": "old"},
                fixed={"use_distributed_optimizer": False})  # fmt: skip
    assert sp.fixed == {"use_distributed_optimizer": False}
    session, agent, lines = _session(storage, sp, _study(storage, sp))
    session.restore()
    assert _seen(agent) == [
        (P(2, 2), "complete", (60.0,), None),
        (P(1, 4), "infeasible", None, "oom"),
        (P(1, 2), "complete", (55.0,), None),
        (P(2, 1), "complete", (66.0,), None),
    ]
    assert lines == ["warm start: 4 trials of study 'old' told to the agent"]
    # the baseline is still this study's first proposal
    assert session.propose(1)[0].params == sp.baseline()


def test_warm_start_after_the_restore(storage: Storage) -> None:
    old = _space("old")
    _finished(storage, _study(storage, old), P(2, 2), _ok(60.0))
    sp = _space("new", agent={"name": "random", "seed": 1, "warm_start_study": "old"})
    sid = _study(storage, sp)
    _finished(storage, sid, P(1, 1), _ok(50.0))
    session, agent, lines = _session(storage, sp, sid)
    session.restore()
    assert [o.params for o in agent.observations] == [P(1, 1), P(2, 2)]
    assert lines == [
        "agent restored from storage: 1 finished trials",
        "warm start: 1 trials of study 'old' told to the agent",
    ]


def test_warm_start_skips_a_missing_study_or_another_model(storage: Storage) -> None:
    other = _space("other-model", model={**SMALL_MODEL, "hidden_size": 512})
    _finished(storage, _study(storage, other), P(2, 2), _ok(60.0))
    for name, said in [
        ("nope", "warm start: no study 'nope' in this storage; skipped"),
        ("other-model", "warm start: study 'other-model' trains another model; skipped"),
    ]:
        sp = _space(f"new-{name}", agent={"name": "random", "seed": 1, "warm_start_study": name})
        session, agent, lines = _session(storage, sp, _study(storage, sp))
        session.restore()
        assert lines == [said] and agent.observations == []


def test_warm_start_from_a_record_without_its_sequence_length(storage: Storage) -> None:
    """A study stored before its record kept ``seq_length`` is taken as of this one's."""
    old = _space("old")
    model = {k: v for k, v in old.study_fields()["model"].items() if k != "seq_length"}
    oid = _study(storage, old, **model)
    assert "seq_length" not in storage.get_study("old").model
    _finished(storage, oid, P(2, 2), _ok(60.0))
    sp = _space("new", agent={"name": "random", "seed": 1, "warm_start_study": "old"})
    session, agent, lines = _session(storage, sp, _study(storage, sp))
    session.restore()
    assert [o.params for o in agent.observations] == [P(2, 2)]
    assert lines == ["warm start: 1 trials of study 'old' told to the agent"]
    # a record that kept it: another sequence length is another model
    _finished(storage, _study(storage, _space("kept")), P(2, 2), _ok(60.0))
    for study, seq, said in [
        ("old", 256, "warm start: 1 trials of study 'old' told to the agent"),
        ("kept", 256, "warm start: study 'kept' trains another model; skipped"),
        ("kept", 128, "warm start: 1 trials of study 'kept' told to the agent"),
    ]:
        other = _space(f"{study}-{seq}", semantics={"global_batch_size": 8, "seq_length": seq},
                       agent={"name": "random", "seed": 1, "warm_start_study": study})  # fmt: skip
        session, agent, lines = _session(storage, other, _study(storage, other))
        session.restore()
        assert lines == [said]


# --- propose: rejections and duplicates ----------------------------------------------------


def test_prescreen_rejections_are_stored_shown_and_restored(storage: Storage) -> None:
    """A GPU between the cost model's smallest and largest predictions: the proposals it
    predicts above the capacity are stored as rejections as they happen, the rest launch;
    a restarted session's agent knows every one of them."""
    plain = _space()
    cm0 = CostModel(plain.model, plain.semantics, plain.resources)
    pred = {params_key(p): cm0.predict_memory(plain.full_params(p)).total_gib for p in ALL}
    low, high = sorted(pred.values())[2:4]
    assert low < high
    cap = (low + high) / 2  # the usable memory: the capacity less the cost model's headroom
    resources = {"world_size": 2, "gpu_memory_gib": cap + cm0.headroom_gib, "features": []}
    sp = _space(resources=resources, prescreen={"margin": 0.0}, loss_parity={"enabled": False})
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    sid = _study(storage, sp)
    session, agent, lines = _session(storage, sp, sid, cm)
    got = session.propose(6)
    assert got.exhausted  # the agent proposed all six
    over = {k for k, v in pred.items() if v > cap}
    assert len(over) == 3
    stored = storage.list_rejections(sid)
    assert {r.params_key for r in stored} == over == {r.params_key for r in got.rejections}
    assert {(r.kind, r.rule) for r in stored} == {("predicted_oom", "prescreen")}
    for r in stored:
        assert r.values["predicted_peak_mem_gib"] == pytest.approx(pred[r.params_key], abs=1e-3)
        assert r.reason.startswith("predicted peak")
    said = [line for line in lines if line.startswith("rejected before launch")]
    assert len(said) == 3 and all(
        line.startswith("rejected before launch (predicted_oom): prescreen: predicted peak")
        for line in said
    )
    assert {s.params_key for s in got} == set(pred) - over
    # the rejected ones were told to the agent as infeasible; the launchable ones are pending
    assert {(params_key(o.params), o.feedback.state) for o in agent.observations} == {
        (k, "infeasible") for k in over
    }
    assert agent.n_pending == 3
    for s in got:
        t = storage.claim_trial(study_id=sid, params=s.params, params_key=s.params_key, budget=10)
        assert t is not None
        session.bind(t.id, s.trial_id)
        out = _ok(10.0, peak_mem_gib=pred[s.params_key])
        session.tell(storage.finish_trial(t.id, out, value=10.0), out)
    assert agent.n_pending == 0

    # a restart: a fresh agent is told all six and has nothing left to propose
    again, agent2, lines2 = _session(storage, sp, sid, CostModel(sp.model, sp.semantics,
                                                                 sp.resources))  # fmt: skip
    again.restore()
    assert all(agent2.is_seen(p) for p in ALL)
    assert (
        sorted(o.feedback.state for o in agent2.observations)
        == ["complete"] * 3 + ["infeasible"] * 3
    )
    assert lines2 == ["agent restored from storage: 3 finished trials"]
    last = again.propose(1)
    assert len(last) == 0 and last.exhausted
    assert len(storage.list_rejections(sid)) == 3  # nothing stored twice


def test_a_measured_configuration_proposed_again_is_answered_from_storage(
    storage: Storage,
) -> None:
    sp = _space()
    sid = _study(storage, sp)
    base = sp.baseline()
    _finished(storage, sid, base, _ok(50.0, peak_mem_gib=1.2))
    session, agent, _ = _session(storage, sp, sid)  # not restored: the agent starts over
    got = session.propose(1)
    assert [d.params_key for d in got.duplicates] == [params_key(base)]
    assert got.duplicates[0].outcome.metrics == {"tflops_per_gpu": 50.0, "peak_mem_gib": 1.2}
    assert len(got) == 1 and got[0].params != base  # another configuration launches instead
    assert _seen(agent) == [(base, "complete", (50.0,), None)]  # told from storage
    assert storage.list_rejections(sid) == []

    # a failed measurement is no answer: the configuration is proposed to run again
    sid2 = _study(storage, _space("failed"))
    _finished(storage, sid2, base, Outcome.failure("error", "exit 1"))
    got = _session(storage, sp, sid2)[0].propose(1)
    assert not got.duplicates and got[0].params == base


def test_with_repeats_a_measured_configuration_runs_again(storage: Storage) -> None:
    sp = _space(budget={"n_trials": 12, "repeats": True})
    sid = _study(storage, sp)
    _finished(storage, sid, sp.baseline(), _ok(50.0))
    session, agent, _ = _session(storage, sp, sid)
    got = session.propose(1)
    assert not got.duplicates and got[0].params == sp.baseline()
    assert agent.observations == [] and agent.n_pending == 1


# --- tell, not_run, the calibration ----------------------------------------------------------


def test_tell_answers_the_bound_proposal_and_stores_the_calibration(storage: Storage) -> None:
    sp = _space()
    sid = _study(storage, sp)
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    session, agent, _ = _session(storage, sp, sid, cm)
    got = session.propose(2)
    trials = []
    for s in got:
        t = storage.claim_trial(study_id=sid, params=s.params, params_key=s.params_key, budget=10)
        assert t is not None
        session.bind(t.id, s.trial_id)
        trials.append(t)
    assert agent.n_pending == 2

    ok = _ok(42.0, peak_mem_gib=1.3)
    session.tell(storage.finish_trial(trials[0].id, ok, value=42.0), ok)
    assert agent.n_pending == 1
    assert _seen(agent) == [(got[0].params, "complete", (42.0,), None)]
    stored = storage.get_study_attrs(sid)["costmodel"]
    assert stored == cm.calibration()
    assert [(o["peak_gib"], o["oom"]) for o in stored["observations"]] == [(1.3, False)]

    oom = Outcome.failure("oom", "CUDA out of memory", metrics={"peak_mem_gib": 80.5})
    session.tell(storage.finish_trial(trials[1].id, oom, value=None), oom)
    assert agent.n_pending == 0
    assert _seen(agent)[-1] == (got[1].params, "infeasible", None, "oom")
    stored = storage.get_study_attrs(sid)["costmodel"]
    assert [(o["peak_gib"], o["oom"]) for o in stored["observations"]] == [
        (1.3, False), (80.5, True),
    ]  # fmt: skip

    # a trial of an earlier run (re-queued, never asked by this agent) is told as history
    free = next(p for p in ALL if not agent.is_seen(p))
    earlier = _finished(storage, sid, free, _ok(33.0))
    session.tell(earlier, outcome_of_record(earlier))
    assert agent.n_pending == 0 and agent.is_seen(free)
    assert _seen(agent)[-1] == (free, "complete", (33.0,), None)


def test_tell_without_a_cost_model_stores_no_calibration(storage: Storage) -> None:
    sp = _space()
    sid = _study(storage, sp)
    session, agent, _ = _session(storage, sp, sid)
    s = session.propose(1)[0]
    t = storage.claim_trial(study_id=sid, params=s.params, params_key=s.params_key, budget=10)
    assert t is not None
    session.bind(t.id, s.trial_id)
    ok = _ok(42.0, peak_mem_gib=1.3)
    session.tell(storage.finish_trial(t.id, ok, value=42.0), ok)
    assert agent.n_pending == 0 and len(agent.observations) == 1
    assert "costmodel" not in storage.get_study_attrs(sid)


def test_a_proposal_that_got_no_trial_is_answered_as_failed(storage: Storage) -> None:
    sp = _space()
    session, agent, _ = _session(storage, sp, _study(storage, sp))
    got = session.propose(2)
    session.not_run(got[1].trial_id, "budget spent")
    assert agent.n_pending == 1
    assert _seen(agent) == [(got[1].params, "failed", None, "error")]
    with pytest.raises(KeyError):  # answered once only
        session.not_run(got[1].trial_id, "again")


def test_the_cost_model_observes_measured_peaks_only(storage: Storage) -> None:
    sp = _space(fixed={"use_distributed_optimizer": True})
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    session, _, _ = _session(storage, sp, _study(storage, sp), cm)
    ignored = [
        Outcome("ok", {"tflops_per_gpu": 1.0, "peak_mem_gib": 9.0}, source="estimate"),
        _ok(1.0),  # no peak
        Outcome.failure("error", "crash", metrics={"peak_mem_gib": 9.0}),
        Outcome.failure("oom", "predicted", metrics={"peak_mem_gib": 99.0}, source="estimate"),
    ]
    for out in ignored:
        session.observe_cost(P(1, 1), out)
    assert cm.calibration()["observations"] == []
    session.observe_cost(P(2, 4), _ok(1.0, peak_mem_gib=1.25))
    session.observe_cost(P(1, 4), Outcome.failure("oom", "OOM", metrics={"peak_mem_gib": 80.0}))
    obs = cm.calibration()["observations"]
    assert [(o["peak_gib"], o["oom"]) for o in obs] == [(1.25, False), (80.0, True)]
    # observed with the space's full parameters (fixed settings included), not the knobs alone
    assert obs[0]["params"] == {**P(2, 4), "use_distributed_optimizer": True}
    assert obs[1]["params"] == {**P(1, 4), "use_distributed_optimizer": True}
    # without a cost model nothing is observed, and nothing breaks
    bare, _, _ = _session(storage, sp, _study(storage, _space("bare")))
    bare.observe_cost(P(2, 4), _ok(1.0, peak_mem_gib=1.25))
