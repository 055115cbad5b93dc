"""The Proposer: rules, pre-screen and duplicate screening between an agent and the runner."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dse.agents import BaseAgent, Feedback, Proposal, create_agent
from dse.core.records import Outcome
from dse.loop.proposer import (
    UNCALIBRATED_SD,
    Proposed,
    Proposer,
    cost_model_memory_hint,
    feedback_from_outcome,
)
from dse.model.costmodel import CostModel
from dse.model.rules import check
from dse.space.searchspace import SearchSpace, params_key, parse_space
from tests.conftest import small_space


def _space(**extra: Any) -> SearchSpace:
    knobs = {
        "tensor_model_parallel_size": {"values": [1, 2, 4]},
        "micro_batch_size": {"values": [1, 2, 4, 8]},
    }
    space: SearchSpace = small_space("proposer", knobs, world_size=2, **extra)
    return space


class Scripted(BaseAgent):
    """Proposes a fixed list, records what it is told."""

    name = "scripted"

    def __init__(self, space: SearchSpace, script: list[dict[str, Any]]) -> None:
        super().__init__(space)
        self.script = list(script)
        self.told: dict[str, Feedback] = {}
        self.asked: dict[str, dict[str, Any]] = {}
        self.added: list[tuple[dict[str, Any], Feedback]] = []

    def ask(self, n: int = 1) -> list[Proposal]:
        out = []
        while self.script and len(out) < n:
            p = self.script.pop(0)
            tid = f"t{len(self.asked)}"
            self.asked[tid] = p
            out.append(Proposal(tid, p))
        return out

    def tell(self, trial_id: str, feedback: Feedback) -> None:
        assert trial_id in self.asked and trial_id not in self.told
        self.told[trial_id] = feedback

    def add_evaluated(self, params: dict[str, Any], feedback: Feedback) -> None:
        self.added.append((params, feedback))


def P(tp: int, mbs: int) -> dict[str, Any]:
    return {"tensor_model_parallel_size": tp, "micro_batch_size": mbs}


def test_rule_rejections_are_told_and_recorded() -> None:
    sp = _space()
    agent = Scripted(sp, [P(4, 1), P(1, 1), P(1, 8), P(1, 2)])
    prop = Proposer(sp, agent, features=[])
    got = prop.propose(2)
    assert isinstance(got, Proposed)
    assert [s.params for s in got] == [P(1, 1), P(1, 2)]
    assert len(got) == 2 and got[0].params == P(1, 1)
    assert [(r.kind, r.rule) for r in got.rejections] == [
        ("invalid", "world_divisible"),
        ("invalid", "gbs_divisible"),
    ]
    r = got.rejections[0]
    assert r.params_key == params_key(P(4, 1))
    assert r.values == {"world_size": 2, "tp": 4, "pp": 1, "cp": 1}
    assert "world_divisible" in r.reason
    fb = agent.told["t0"]
    assert (fb.state, fb.failure_class) == ("infeasible", "invalid")
    assert prop.rejections == list(got.rejections)
    assert not got.exhausted


def test_prescreen_rejections() -> None:
    sp = _space()
    agent = Scripted(sp, [P(1, 4), P(1, 1)])

    def screen(params: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
        if params["micro_batch_size"] >= 4:
            return ("predicted_oom", "predicted 150.2 GiB > 80 GiB", {"predicted_mem_gib": 150.2})
        return None

    got = Proposer(sp, agent, features=[], prescreen=screen).propose(1)
    assert [s.params for s in got] == [P(1, 1)]
    (r,) = got.rejections
    assert (r.kind, r.rule, r.reason) == (
        "predicted_oom",
        "prescreen",
        "predicted 150.2 GiB > 80 GiB",
    )
    assert r.values == {"predicted_mem_gib": 150.2}
    fb = agent.told["t0"]
    assert (fb.state, fb.failure_class) == ("infeasible", "predicted_oom")
    assert fb.metrics["predicted_mem_gib"] == 150.2 and fb.metrics["gpu_memory_gib"] == 80.0


def test_measured_duplicates_are_answered_not_launched() -> None:
    sp = _space()
    agent = Scripted(sp, [P(1, 1), P(1, 2)])
    done = {params_key(P(1, 1)): Outcome("ok", {"tflops_per_gpu": 99.0})}
    got = Proposer(sp, agent, features=[]).propose(1, lookup=done.get)
    assert [s.params for s in got] == [P(1, 2)]
    assert [d.params for d in got.duplicates] == [P(1, 1)]
    assert agent.told["t0"] == Feedback(
        "complete", values=(99.0,), metrics={"tflops_per_gpu": 99.0}
    )


def test_repeats_allowed_launches_duplicates() -> None:
    sp = _space(budget={"repeats": True})
    agent = Scripted(sp, [P(1, 1)])
    done = {params_key(P(1, 1)): Outcome("ok", {"tflops_per_gpu": 99.0})}
    got = Proposer(sp, agent, features=[]).propose(1, lookup=done.get)
    assert [s.params for s in got] == [P(1, 1)]


def test_exhausted_agent_and_rejection_cap() -> None:
    sp = _space()
    got = Proposer(sp, Scripted(sp, [P(1, 1)]), features=[]).propose(3)
    assert len(got) == 1 and got.exhausted
    agent = Scripted(sp, [P(4, m) for m in (1, 2, 4, 8)] + [P(1, 1)])
    lines: list[str] = []
    prop = Proposer(sp, agent, features=[], max_rejections=3, on_progress=lines.append)
    got = prop.propose(1)
    # the cap hands control back with a message; the next call goes on
    assert len(got) == 0 and got.capped and not got.exhausted and len(got.rejections) == 3
    assert "world_divisible 3" in got.message and "derived:" in got.message
    assert lines == [got.message]
    got = prop.propose(1)
    assert len(got) == 1 and not got.capped and len(got.rejections) == 1


def test_a_stop_between_proposals_ends_the_call_at_once() -> None:
    """Told to stop after its first rejection (a SIGTERM while the agent searches a mostly
    invalid space), the call asks the agent no more and hands back what it has."""
    sp = _space()
    agent = Scripted(sp, [P(4, m) for m in (1, 2, 4, 8)] * 5)
    stop: list[str] = []
    prop = Proposer(sp, agent, features=[], on_reject=lambda r: stop.append("SIGTERM"),
                    stopping=lambda: bool(stop))  # fmt: skip
    got = prop.propose(1)
    assert len(agent.asked) == 1 and len(got.rejections) == 1
    assert len(got) == 0 and not got.capped and not got.exhausted


def test_the_rejection_cap_is_tens_and_stalled_calls_end_the_search() -> None:
    from dse.loop.proposer import MAX_REJECTIONS

    assert 10 <= MAX_REJECTIONS <= 100
    sp = _space()
    agent = Scripted(sp, [P(4, 1)] * 10)
    prop = Proposer(sp, agent, features=[], max_rejections=2, max_stalled_calls=3)
    flags = [(r.capped, r.exhausted) for r in (prop.propose(1) for _ in range(3))]
    assert flags == [(True, False), (True, False), (True, True)]


def test_rejections_are_reported_as_they_happen() -> None:
    """Each rejection reaches ``on_reject`` before the call returns (the study stores it
    then), in the order made."""
    sp = _space()
    seen_during: list[int] = []
    agent = Scripted(sp, [P(4, 1), P(4, 2), P(1, 1)])
    prop: Proposer

    def on_reject(rej: Any) -> None:
        seen_during.append(len(agent.told))  # the call is still running: not all told yet
        assert rej in prop.rejections

    prop = Proposer(sp, agent, features=[], on_reject=on_reject)
    got = prop.propose(1)
    assert len(got) == 1 and len(got.rejections) == 2
    assert seen_during == [0, 1]


def test_equivalent_configurations_are_one_duplicate() -> None:
    """The distributed optimizer does nothing at DP 1 (TP 2 on 2 GPUs): a proposal that only
    differs there is answered from the measured twin, not run."""
    data = _space().model_dump()
    data["knobs"]["use_distributed_optimizer"] = {"domain": {"type": "bool"}, "baseline": False}
    sp = parse_space(data)
    twin_a = {**P(2, 1), "use_distributed_optimizer": False}
    twin_b = {**P(2, 1), "use_distributed_optimizer": True}
    assert params_key(sp.apply_conditions(twin_a)) == params_key(sp.apply_conditions(twin_b))
    measured: dict[str, Outcome] = {}
    agent = Scripted(sp, [twin_a, twin_b, {**P(1, 1), "use_distributed_optimizer": True}])
    prop = Proposer(sp, agent, features=[])
    first = prop.propose(1)
    measured[first[0].params_key] = Outcome("ok", {"tflops_per_gpu": 1.0})
    second = prop.propose(1, lookup=measured.get)
    assert len(second.duplicates) == 1 and second.duplicates[0].params == first[0].params
    # at DP 2 the optimizer shards its state: a different configuration
    assert second[0].params["use_distributed_optimizer"] is True


def test_with_a_real_agent_every_launch_passes_the_rules() -> None:
    sp = _space(agent={"name": "tpe", "seed": 0, "n_startup_trials": 2})
    agent = create_agent(sp)
    proposer = Proposer(sp, agent, features=[])
    launched: list[dict[str, Any]] = []
    while True:
        got = proposer.propose(2)
        if not got:
            break
        for s in got:
            assert check(sp, s.params, []) == []
            launched.append(s.params)
            tflops = 100.0 / s.params["tensor_model_parallel_size"] + s.params["micro_batch_size"]
            agent.tell(s.trial_id, Feedback("complete", values=(tflops,)))
    # world 2: TP 4 never fits; GBS 8 with DP 2 rules out MBS 8 at TP 1
    assert len(launched) == 7
    assert {r.rule for r in proposer.rejections} == {"world_divisible", "gbs_divisible"}


@pytest.mark.parametrize(
    ("outcome", "state", "values", "failure_class"),
    [
        (
            Outcome("ok", {"tflops_per_gpu": 120.0, "peak_mem_gib": 40.0}),
            "complete",
            (120.0, 40.0),
            None,
        ),
        (Outcome("ok", {"peak_mem_gib": 40.0}), "failed", None, "error"),
        (
            Outcome.failure("oom", "CUDA OOM", metrics={"peak_mem_gib": 79.0}),
            "infeasible",
            None,
            "oom",
        ),
        (Outcome.failure("predicted_oom", "predicted"), "infeasible", None, "predicted_oom"),
        (Outcome.failure("invalid", "heads_tp"), "infeasible", None, "invalid"),
        (Outcome.failure("error", "crash"), "failed", None, "error"),
        (Outcome.failure("hang", "no step for 300 s"), "failed", None, "hang"),
        (Outcome.failure("nan", "loss is nan"), "failed", None, "nan"),
        # the cluster can never start it: infeasible here (the agent avoids it)
        (
            Outcome.failure("unschedulable", "Slurm's reason: PartitionNodeLimit"),
            "infeasible",
            None,
            "unschedulable",
        ),
        # it waited in a busy queue: a failure, not a property of the configuration
        (Outcome.failure("timeout", "Slurm's reason: Resources"), "failed", None, "timeout"),
    ],
)
def test_feedback_from_outcome(
    outcome: Outcome, state: str, values: tuple[float, ...] | None, failure_class: str | None
) -> None:
    sp = _space(
        objectives=[
            {"metric": "tflops_per_gpu", "direction": "maximize"},
            {"metric": "peak_mem_gib", "direction": "minimize"},
        ]
    )
    fb = feedback_from_outcome(sp, outcome)
    assert (fb.state, fb.values, fb.failure_class) == (state, values, failure_class)
    if outcome.failure_class == "oom":
        assert fb.metrics == {"peak_mem_gib": 79.0, "gpu_memory_gib": 80.0}


def test_feedback_derives_tokens_per_second() -> None:
    sp = _space(objective={"metric": "tokens_per_s_per_gpu"})
    fb = feedback_from_outcome(sp, Outcome("ok", {"step_time_s": 0.5}))
    assert fb.values == (8 * 128 / 0.5 / 2,)


def test_cost_model_memory_hint() -> None:
    sp = _space()
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    hint = cost_model_memory_hint(sp, cm)
    assert hint is not None
    pred, sd = hint(P(1, 8))
    assert pred == pytest.approx(cm.predict_memory(sp.full_params(P(1, 8))).total_gib)
    assert sd == UNCALIBRATED_SD
    assert hint(P(2, 8))[0] < pred  # TP 2 halves the weights' share
    # calibrated on measurements 20% above its prediction: predicts higher, and more surely
    for p in (P(1, 1), P(1, 2), P(2, 4), P(4, 8)):
        cm.observe(sp.full_params(p), 1.2 * cm.predict_memory(sp.full_params(p)).total_gib, False)
    pred2, sd2 = hint(P(1, 8))
    assert pred2 > pred and 0.03 <= sd2 < UNCALIBRATED_SD
    # no GPU memory known, or no cost model: no hint
    no_cap = _space(resources={"world_size": 2, "features": []})
    assert cost_model_memory_hint(no_cap, cm) is None
    assert cost_model_memory_hint(sp, None) is None


def _bridge_space(derived: bool) -> SearchSpace:
    import yaml

    from tests.conftest import EXAMPLES

    d = yaml.safe_load((EXAMPLES / "bridge_moe_sim.yaml").read_text())
    if not derived:
        del d["derived"]  # the recipe's SP stays on at TP 1: a quarter of the space is invalid
    return parse_space(d)


@pytest.mark.parametrize("derived", [False, True])
def test_bridge_style_space_is_searched_within_the_rules(derived: bool) -> None:
    """The 16-knob Bridge-style MoE space: 30 launches of the TPE agent (with its prior and
    the cost model's memory hint) cost few rejections; once the prior's favourite TP 1
    configurations drew 184 rejections in one call."""
    sp = _bridge_space(derived)
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    agent = create_agent(sp, cost_model_memory_hint(sp, cm))
    prop = Proposer(sp, agent, features=["transformer_engine"])
    launched = 0
    while launched < 30:
        got = prop.propose(1)
        assert not got.capped and len(got.rejections) <= 3
        for s in got:
            launched += 1
            full = sp.full_params(s.params)
            assert check(sp, s.params, ["transformer_engine"]) == []
            thr = cm.estimate_throughput(full)
            out = Outcome("ok", {"tflops_per_gpu": float(thr["tflops_per_gpu"])})
            agent.tell(s.trial_id, feedback_from_outcome(sp, out))
    assert len(prop.rejections) <= 5
    tp1 = [
        p for p in (o.params for o in agent.observations) if p["tensor_model_parallel_size"] == 1
    ]
    if derived:
        assert tp1  # TP 1 (SP derived off there) is explored again


def test_progress_lines_while_the_agent_searches(monkeypatch: pytest.MonkeyPatch) -> None:
    import dse.loop.proposer as proposer_mod

    monkeypatch.setattr(proposer_mod, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(proposer_mod, "SLOW_CALL_S", 0.0)
    sp = _space()
    agent = Scripted(sp, [P(4, 1), P(4, 2), P(4, 4), P(1, 1)])
    lines: list[str] = []
    got = Proposer(sp, agent, features=[], on_progress=lines.append).propose(1)
    assert len(got) == 1
    searching = [ln for ln in lines if ln.startswith("agent searching:")]
    assert len(searching) == 4 and "world_divisible 3" in searching[-1]
    assert "3 proposals rejected" in searching[-1]
    assert lines[-1].startswith("agent asked: 1 launchable in")


class SlowAgent(Scripted):
    """An agent whose every ask takes a while (as a GP sampler's model fit does)."""

    name = "slow"

    def ask(self, n: int = 1) -> list[Proposal]:
        time.sleep(0.4)
        return super().ask(n)


def test_a_slow_agent_is_not_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    """No rejection, one ask that takes long: lines say the agent is still at work (the GP
    agent on the Bridge-style space: one call of 33-85 s with no line before it returned)."""
    import dse.loop.proposer as proposer_mod

    monkeypatch.setattr(proposer_mod, "ASK_HEARTBEAT_S", 0.1)
    sp = _space()
    lines: list[str] = []
    got = Proposer(sp, SlowAgent(sp, [P(1, 1)]), features=[], on_progress=lines.append).propose(1)
    assert len(got) == 1
    still = [ln for ln in lines if "the slow agent is still proposing" in ln]
    assert 2 <= len(still) <= 5, lines
    assert "0 rejected, 0 launchable so far" in still[0]
    n = len(lines)
    time.sleep(0.3)
    assert len(lines) == n  # the helper stops with the call


@pytest.mark.parametrize("guard", [True, False])
def test_the_loss_reference_is_never_kept_out_by_a_prediction(guard: bool) -> None:
    """With the loss-parity guard on, the baseline's loss is every trial's reference: the
    pre-screen does not keep it from running (a validity rule still would)."""
    sp = _space(loss_parity={"enabled": guard})
    base = sp.baseline()
    agent = Scripted(sp, [base, P(1, 2)])

    def everything_oom(params: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
        return ("predicted_oom", "predicted 999 GiB > 80 GiB", {})

    got = Proposer(sp, agent, features=[], prescreen=everything_oom).propose(2)
    assert [s.params for s in got] == ([base] if guard else [])
    if guard:
        assert [r.params for r in got.rejections] == [P(1, 2)]
    else:  # nothing launchable in the enumerated space: said at once, the agent not asked
        assert got.exhausted and got.message.startswith("0 launchable configurations")
        assert agent.asked == {}


def test_an_enumerable_space_with_nothing_launchable_is_said_at_once() -> None:
    """Issue 39 item 4: every configuration of a small space breaks a rule or is predicted
    out of memory: the first call says so (counts per rule, the estimate labelled) and asks
    the agent nothing (before, it asked until the rejection cap, call after call)."""
    sp = _space()
    agent = Scripted(sp, [P(1, m) for m in (1, 2, 4, 8)] * 20)
    lines: list[str] = []

    def big(params: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
        if params["micro_batch_size"] >= 2:
            return ("predicted_oom", "predicted 999 GiB > 80 GiB", {})
        return None

    prop = Proposer(sp, agent, features=[], prescreen=big, on_progress=lines.append)
    census = prop.census()
    assert census is not None and census.configurations == 12
    assert census.invalid == {"world_divisible": 4, "gbs_divisible": 1}  # tp 4; tp 1 mbs 8
    assert census.predicted_oom == 5 and len(census.launchable) == 2  # mbs 1 fits
    got = prop.propose(1)
    assert [s.params for s in got] == [P(1, 1)]  # launchable ones left: asked as before
    measured = {params_key(P(1, 1)), params_key(P(2, 1))}
    got = prop.propose(1, lookup=lambda k: Outcome("ok", {}) if k in measured else None)
    assert len(got) == 0 and got.exhausted and not got.rejections
    assert got.message.startswith("0 launchable configurations: of the space's 12")
    assert (
        "world_divisible 4" in got.message and "5 of them predicted out of memory" in got.message
    )
    assert "cost-model estimate" in got.message and "already measured" in got.message
    assert len(agent.asked) == 1 and lines[-1] == got.message


def test_a_space_beyond_the_enumerable_bound_is_not_enumerated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dse.loop import proposer

    monkeypatch.setattr(proposer, "ENUMERABLE_MAX", 11)
    sp = _space()
    assert Proposer(sp, Scripted(sp, []), features=[]).census() is None


def test_a_stop_while_the_agent_asks_ends_the_wait() -> None:
    """Issue 39 item 4: a stop (SIGTERM) that comes while the agent is inside one ``ask``
    (a GP fit: seconds each on a loaded machine) ends the call without waiting for the
    agent's answer, which is dropped (before, the call waited for the ask to end)."""
    import threading

    sp = _space()
    release = threading.Event()
    entered = threading.Event()

    class Slow(Scripted):
        def ask(self, n: int = 1) -> list[Proposal]:
            entered.set()
            release.wait(60)
            return super().ask(n)

    agent = Slow(sp, [P(1, 1)])
    stop: list[bool] = []
    threading.Thread(target=lambda: (entered.wait(60), stop.append(True)), daemon=True).start()
    prop = Proposer(sp, agent, features=[], stopping=lambda: bool(stop))
    got = prop.propose(1)
    still_asking = not release.is_set()
    release.set()
    assert still_asking and stop == [True]
    assert len(got) == 0 and not got.rejections and not got.exhausted


def test_the_deepseek_v3_grid_says_nothing_is_launchable_at_once(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 item 4 end to end: CloudAI's DeepSeek-V3 Bayesian scenario as `dse cloudai
    import` writes it on a 48 GiB card (GP agent; 192 configurations, 60 valid with the
    pipeline layouts Bridge's DeepSeek-V3 recipe derives from (PP, VP), all predicted out of
    memory but the baseline, which runs as the loss reference), on the sim
    workload: `dse start` runs the baseline, then says "0 launchable configurations" without
    one rejected proposal (before: rounds of 50 rejected proposals, minutes of GP asks)."""
    import importlib.util
    from pathlib import Path

    import yaml

    from dse.cli.main import main
    from dse.storage import open_storage

    bench = Path(__file__).resolve().parents[2] / "bench" / "agent_stop.py"
    spec = importlib.util.spec_from_file_location("agent_stop", bench)
    assert spec is not None and spec.loader is not None
    agent_stop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_stop)
    path = agent_stop.space_file(tmp_path, extra_knob=False)
    doc = yaml.safe_load(path.read_text())
    assert doc["agent"]["name"] == "gp"
    # on a 48 GiB card: with Multi-Latent Attention modelled (issue 38), Bridge's layouts and
    # FP8 weights (issue 37) most configurations fit a GB200's 184 GiB (84 GiB the least,
    # estimates); on 48 GiB none does
    doc["resources"]["gpu_memory_gib"] = 48.0
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["start", "--space", str(path)]) == 0
    out = capsys.readouterr()
    said = [ln for ln in (out.out + out.err).splitlines() if "0 launchable configurations" in ln]
    assert said and "192 configurations" in said[0] and "60 pass the rules" in said[0]
    assert "59 of them predicted out of memory (cost-model estimate)" in said[0]
    with open_storage(f"sqlite:///{tmp_path / 'study.db'}") as st:
        study = st.list_studies()[0]
        assert st.count_trials(study.id)["total"] == 1  # the baseline
        assert sum(st.count_rejections(study.id).values()) == 0
