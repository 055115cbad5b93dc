"""The ask/tell contract, one suite parametrized over every agent of ``create_agent``."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dse.agents import AGENTS, BaseAgent, Feedback, create_agent
from dse.agents._prior import PriorGuide
from dse.space.searchspace import SearchSpace, params_key
from tests.conftest import small_space

NAMES = sorted(AGENTS)


def _space(knobs: dict[str, Any], **extra: Any) -> SearchSpace:
    space: SearchSpace = small_space("contract", knobs, **extra)
    return space


#: 3 x 3 x (1 + 2) = 27 canonical configurations; the fusion implementation is conditional.
KNOBS: dict[str, Any] = {
    "micro_batch_size": {"values": [1, 2, 4]},
    "recompute": {"values": ["none", "selective", "full"], "baseline": "full"},
    "cross_entropy_loss_fusion": {"type": "bool"},
    "cross_entropy_fusion_impl": {
        "values": ["native", "te"],
        "when": {"cross_entropy_loss_fusion": True},
    },
}


def _with_agent(space: SearchSpace, name: str, seed: int | None = 0, **agent: Any) -> SearchSpace:
    spec = space.agent.model_copy(update={"name": name, "seed": seed, **agent})
    return space.model_copy(update={"agent": spec})


def _value(p: dict[str, Any]) -> float:
    """A synthetic objective (TFLOP/s-like, larger is better)."""
    rec = {"none": 30.0, "selective": 20.0, "full": 0.0}[p["recompute"]]
    ce = 5.0 if p.get("cross_entropy_loss_fusion") else 0.0
    return 100.0 + 10.0 * p["micro_batch_size"] + rec + ce


def _feedback(p: dict[str, Any]) -> Feedback:
    """mbs 4 without recompute runs out of memory; everything else completes."""
    if p["micro_batch_size"] == 4 and p["recompute"] == "none":
        return Feedback(
            "infeasible",
            metrics={"peak_mem_gib": 79.0, "gpu_memory_gib": 80.0},
            failure_class="oom",
        )
    mem = 10.0 * p["micro_batch_size"]
    return Feedback("complete", values=(_value(p),), metrics={"peak_mem_gib": mem})


def _check_proposal(space: SearchSpace, p: dict[str, Any]) -> None:
    assert set(p) == set(space.knobs)
    for name, v in p.items():
        assert v in space.knobs[name].values()
    assert space.apply_conditions(p) == p


def _run(agent: BaseAgent, trials: int, batch: int = 1) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    while len(seen) < trials:
        props = agent.ask(min(batch, trials - len(seen)))
        if not props:
            break
        for prop in props:
            seen.append(prop.params)
            agent.tell(prop.trial_id, _feedback(prop.params))
    return seen


@pytest.fixture
def space() -> SearchSpace:
    return _space(KNOBS)


@pytest.mark.parametrize("name", NAMES)
def test_create_agent_by_name(space: SearchSpace, name: str) -> None:
    agent = create_agent(_with_agent(space, name, seed=3))
    assert agent.name == name
    assert agent.seed == 3


@pytest.mark.parametrize("name", NAMES)
def test_first_proposal_is_the_baseline(space: SearchSpace, name: str) -> None:
    agent = create_agent(_with_agent(space, name))
    (first,) = agent.ask(1)
    assert first.params == space.baseline()


@pytest.mark.parametrize("name", NAMES)
def test_warm_start_follows_the_baseline_and_skips_evaluated(
    space: SearchSpace, name: str
) -> None:
    ws = [{"micro_batch_size": 2}, {"micro_batch_size": 4, "recompute": "selective"}]
    sp = _with_agent(space, name, warm_start=ws)
    agent = create_agent(sp)
    done = sp.apply_conditions({**sp.baseline(), **ws[0]})
    agent.add_evaluated(done, _feedback(done))
    props = agent.ask(2)
    assert props[0].params == sp.baseline()
    assert props[1].params == sp.apply_conditions({**sp.baseline(), **ws[1]})


@pytest.mark.parametrize("name", NAMES)
def test_proposals_are_canonical_and_distinct(space: SearchSpace, name: str) -> None:
    agent = create_agent(_with_agent(space, name, seed=1))
    props = _run(agent, 10)
    assert len(props) == 10
    for p in props:
        _check_proposal(space, p)
    assert len({params_key(p) for p in props}) == len(props)


@pytest.mark.parametrize("name", NAMES)
def test_parallel_asks_are_distinct(space: SearchSpace, name: str) -> None:
    agent = create_agent(_with_agent(space, name, seed=2))
    first = agent.ask(3)
    second = agent.ask(3)
    for p in first + second:
        agent.tell(p.trial_id, _feedback(p.params))
    third = agent.ask(2)  # with a model now, and one of them pending while the other is drawn
    keys = [params_key(p.params) for p in first + second + third]
    assert len(keys) == 8 and len(set(keys)) == 8


@pytest.mark.parametrize("name", NAMES)
def test_infeasible_and_failed_feedback(space: SearchSpace, name: str) -> None:
    agent = create_agent(_with_agent(space, name, seed=4))
    fbs = [
        Feedback("infeasible", failure_class="invalid", metrics={"rule": "heads_tp"}),
        Feedback(
            "infeasible",
            failure_class="predicted_oom",
            metrics={"predicted_peak_mem_gib": 95.0, "gpu_memory_gib": 80.0},
        ),
        Feedback("infeasible", failure_class="oom", metrics={"peak_mem_gib": 78.0}),
        Feedback("failed", failure_class="error"),
        Feedback("failed", failure_class="hang"),
    ]
    asked = []
    for fb in fbs:  # before any complete trial: the placeholders must cope
        (prop,) = agent.ask(1)
        asked.append(prop.params)
        agent.tell(prop.trial_id, fb)
    asked += _run(agent, 8)
    assert len({params_key(p) for p in asked}) == len(asked)


def _pruning_feedback(p: dict[str, Any]) -> Feedback:
    """Full recompute is clearly slower than the best: such trials stop early, pruned,
    with their measured values (the study loop's feedback of a pruned trial)."""
    fb = _feedback(p)
    if fb.state == "complete" and p["recompute"] == "full":
        return Feedback("pruned", values=fb.values, metrics=fb.metrics)
    return fb


@pytest.mark.parametrize("name", NAMES)
def test_pruned_feedback_is_a_measured_value(space: SearchSpace, name: str) -> None:
    agent = create_agent(_with_agent(space, name, seed=8))
    asked, told = [], []
    for _ in range(12):  # live: tell
        (prop,) = agent.ask(1)
        fb = _pruning_feedback(prop.params)
        agent.tell(prop.trial_id, fb)
        asked.append(prop.params)
        told.append(fb)
    assert "pruned" in {fb.state for fb in told}
    assert len({params_key(p) for p in asked}) == 12
    restarted = create_agent(_with_agent(space, name, seed=9))  # restored: add_evaluated
    for p, fb in zip(asked, told, strict=True):
        restarted.add_evaluated(dict(p), fb)
    rest = _run(restarted, 6)
    assert not {params_key(p) for p in asked} & {params_key(p) for p in rest}
    fresh = create_agent(_with_agent(space, name))
    (prop,) = fresh.ask(1)
    with pytest.raises(ValueError, match="pruned feedback needs one value per objective"):
        fresh.tell(prop.trial_id, Feedback("pruned"))
    assert Feedback("pruned", values=(1.0,)).measured
    assert not Feedback("failed").measured


@pytest.mark.parametrize("name", NAMES)
def test_restart_never_reproposes_evaluated(name: str) -> None:
    space = _space(
        {
            "micro_batch_size": {"values": [1, 2, 4]},
            "recompute": KNOBS["recompute"],
            "bias_activation_fusion": {"type": "bool"},
        }
    )  # 18 configurations
    history = _run(create_agent(_with_agent(space, "random", seed=5)), 10)
    restarted = create_agent(_with_agent(space, name, seed=6))
    for p in history:
        restarted.add_evaluated(dict(p), _feedback(p))
    rest = _run(restarted, 100)
    done = {params_key(p) for p in history}
    assert not done & {params_key(p) for p in rest}
    assert len(rest) == 18 - len(history)  # then the space is spent
    assert restarted.ask(3) == []


@pytest.mark.parametrize("name", NAMES)
def test_tiny_space_is_exhausted(name: str) -> None:
    knobs = {"micro_batch_size": {"values": [1, 2]}, "recompute": KNOBS["recompute"]}
    sp = _with_agent(_space(knobs), name)
    agent = create_agent(sp)
    props = agent.ask(10)
    assert len(props) == 6
    assert len({params_key(p.params) for p in props}) == 6
    for p in props:
        agent.tell(p.trial_id, _feedback(p.params))
    assert agent.ask(1) == []


@pytest.mark.parametrize("name", NAMES)
def test_tell_errors(space: SearchSpace, name: str) -> None:
    agent = create_agent(_with_agent(space, name))
    (prop,) = agent.ask(1)
    with pytest.raises(KeyError, match="unknown"):
        agent.tell("nope", Feedback("failed"))
    with pytest.raises(ValueError, match="one value per objective"):
        agent.tell(prop.trial_id, Feedback("complete", values=(1.0, 2.0)))
    agent.tell(prop.trial_id, _feedback(prop.params))
    with pytest.raises(KeyError):
        agent.tell(prop.trial_id, _feedback(prop.params))


@pytest.mark.parametrize("name", NAMES)
def test_two_objectives(name: str) -> None:
    sp = _space(
        KNOBS,
        objectives=[
            {"metric": "tflops_per_gpu", "direction": "maximize"},
            {"metric": "peak_mem_gib", "direction": "minimize"},
        ],
    )
    agent = create_agent(_with_agent(sp, name, seed=7))
    seen = []
    for _ in range(7):
        (prop,) = agent.ask(1)
        p = prop.params
        seen.append(params_key(p))
        fb = _feedback(p)
        if fb.state == "complete":
            fb = Feedback("complete", values=(_value(p), 10.0 * p["micro_batch_size"]))
        agent.tell(prop.trial_id, fb)
    assert len(set(seen)) == 7


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_proposals(space: SearchSpace, name: str) -> None:
    a = _run(create_agent(_with_agent(space, name, seed=11)), 7)
    b = _run(create_agent(_with_agent(space, name, seed=11)), 7)
    assert a == b


def test_unknown_agent_name_is_rejected(space: SearchSpace) -> None:
    bad = space.model_copy(update={"agent": space.agent.model_copy(update={"name": "annealing"})})
    with pytest.raises(ValueError, match="unknown agent 'annealing'"):
        create_agent(bad)


def test_structured_start_learns_the_memory_boundary() -> None:
    """The knob-semantics start of the model-based agents: after the baseline it tries the
    most promising configuration that its memory bound says fits, and never one that uses
    at least as much memory as a measured OOM."""
    sp = _space(
        {
            "micro_batch_size": {"values": [1, 2, 4, 8]},
            "recompute": {"values": ["none", "selective", "full"]},
            "bias_activation_fusion": {"type": "bool"},
        },
        agent={"name": "tpe", "seed": 0, "n_startup_trials": 3},
    )
    agent = create_agent(sp)
    (base,) = agent.ask(1)
    assert base.params == {
        "micro_batch_size": 1,
        "recompute": "none",
        "bias_activation_fusion": False,
    }
    # 30 GiB at mbs 1 of 80: mbs 2 (<= 60 GiB) surely fits, mbs 4 may not
    agent.tell(base.trial_id, Feedback("complete", (100.0,), {"peak_mem_gib": 30.0}))
    (second,) = agent.ask(1)
    assert second.params == {
        "micro_batch_size": 2,
        "recompute": "none",
        "bias_activation_fusion": True,
    }
    agent.tell(second.trial_id, Feedback("complete", (110.0,), {"peak_mem_gib": 55.0}))
    (third,) = agent.ask(1)
    assert third.params["micro_batch_size"] == 4 and third.params["recompute"] == "none"
    oom = dict(third.params)
    guide = PriorGuide(sp, random.Random(0))
    fits = [(base.params, 30.0), (second.params, 55.0)]
    assert guide.p_fits({**oom, "micro_batch_size": 8}, fits, [oom], 80.0) == 0.0
    assert (
        guide.p_fits({**oom, "micro_batch_size": 2, "recompute": "full"}, fits, [oom], 80.0) == 1
    )
    assert guide.p_fits({**oom, "recompute": "full"}, fits, [oom], 80.0) < 1  # no bound known
    assert 0.0 < guide.p_fits(oom, fits, [], 80.0) < 1.0


def test_structured_start_weighs_a_memory_hint() -> None:
    """With a memory hint, the start goes after an OOM to the fastest configuration the hint
    says fits (here a larger TP) instead of the next smaller micro-batch; without one it
    cannot tell them apart. The hint weighs candidates and never overrides what was
    measured: a configuration at least as large as a measured OOM stays out."""
    sp = _space(
        {
            "tensor_model_parallel_size": {"values": [1, 2]},
            "micro_batch_size": {"values": [1, 2, 4]},
            "recompute": {"values": ["none", "full"]},
        },
        resources={"world_size": 2, "gpu_memory_gib": 80.0, "features": []},
        semantics={"global_batch_size": 16, "seq_length": 128},
        agent={"name": "tpe", "seed": 0, "n_startup_trials": 3},
    )
    calls: list[dict[str, Any]] = []

    def hint(p: Any) -> tuple[float, float]:
        calls.append(dict(p))
        # weights and optimizer dominate: TP1 needs over 120 GiB whatever else is set
        act = 2.0 * p["micro_batch_size"] * (0.25 if p["recompute"] == "full" else 1.0)
        return 120.0 / p["tensor_model_parallel_size"] + act, 0.05

    oom = Feedback("infeasible", metrics={"peak_mem_gib": 80.0}, failure_class="oom")
    agent = create_agent(sp, memory_hint=hint)
    (base,) = agent.ask(1)
    assert base.params["tensor_model_parallel_size"] == 1
    agent.tell(base.trial_id, oom)
    (second,) = agent.ask(1)
    assert calls, "the structured start consulted the hint"
    # the fastest configuration predicted to fit: TP2, largest micro-batch, no recompute
    assert second.params == {
        "tensor_model_parallel_size": 2,
        "micro_batch_size": 4,
        "recompute": "none",
    }
    guide = PriorGuide(sp, random.Random(0), memory_hint=hint)
    big = {"tensor_model_parallel_size": 1, "micro_batch_size": 4, "recompute": "none"}
    assert guide.p_fits(big, [], [base.params], 80.0) == 0.0  # measured OOM wins
    small = {"tensor_model_parallel_size": 2, "micro_batch_size": 1, "recompute": "full"}
    assert guide.p_fits(small, [], [base.params], 80.0) > 0.99
    # not settled by the OOM (it uses less memory on recompute), but predicted not to fit
    tp1_full = {"tensor_model_parallel_size": 1, "micro_batch_size": 1, "recompute": "full"}
    assert guide.p_fits(tp1_full, [], [base.params], 80.0) < 0.01
    assert PriorGuide(sp, random.Random(0)).p_fits(tp1_full, [], [base.params], 80.0) == 0.5
    # a measured bound that proves a fit is not overridden by a pessimistic hint
    fitted = [(small, 40.0)]
    assert guide.p_fits(small | {"micro_batch_size": 1}, fitted, [], 80.0) == 1.0


@pytest.mark.parametrize("prior", [True, False])
@pytest.mark.parametrize("name", ["tpe", "gp", "nsga2"])
def test_sampler_redraws_configurations_that_cannot_fit(name: str, prior: bool) -> None:
    """After the start, a sample larger than a measured OOM on some memory knob and no
    smaller on any is drawn again (it would run out of memory too), while fitting
    configurations remain; also without the structured start (``prior: false``): the memory
    order is what the knobs do, not a guess of what is fast."""
    sp = _space(
        {
            "micro_batch_size": {"values": [1, 2, 4, 8]},
            "recompute": {"values": ["none", "selective", "full"]},
            "bias_activation_fusion": {"type": "bool"},
            "cross_entropy_loss_fusion": {"type": "bool"},
        },
        agent={"name": name, "seed": 0, "n_startup_trials": 0, "prior": prior},
    )
    agent = create_agent(sp)
    order = {"none": 2, "selective": 1, "full": 0}

    def runs_out(p: dict[str, Any]) -> bool:
        return p["micro_batch_size"] >= 2 and order[p["recompute"]] >= 1

    ooms: list[dict[str, Any]] = []
    dominated = 0
    for _ in range(12):  # 48 configurations, 12 of them fit
        (prop,) = agent.ask(1)
        p = prop.params
        dominated += any(  # larger on one memory knob, no smaller on the other
            p["micro_batch_size"] >= o["micro_batch_size"]
            and order[p["recompute"]] >= order[o["recompute"]]
            and (p["micro_batch_size"], p["recompute"]) != (o["micro_batch_size"], o["recompute"])
            for o in ooms
        )
        if runs_out(p):
            ooms.append(p)
            agent.tell(prop.trial_id, Feedback("infeasible", metrics={"peak_mem_gib": 80.0},
                                               failure_class="oom"))  # fmt: skip
        else:
            agent.tell(prop.trial_id, Feedback("complete", (_value(p),), {"peak_mem_gib": 20.0}))
    assert ooms, "the run met the memory boundary"
    assert dominated == 0
