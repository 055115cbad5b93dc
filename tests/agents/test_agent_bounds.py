"""The agents' first proposals on spaces at the documented bounds (dse/core/bounds.py: one knob of
MAX_DOMAIN_VALUES values, MAX_KNOBS knobs, both at once, MAX_KNOBS fixed knobs,
MAX_LIST_ITEMS warm-start configurations, MAX_CONSTRAINTS constraints of
MAX_CONSTRAINT_NODES nodes, a file of MAX_SPACE_BYTES with nearly MAX_YAML_NODES nodes):
each proposal looks at a bounded number of candidates and checks a bounded number against
the rules and constraints, and comes back (a hang guard stops the test, rather than timing
it); ``dse start`` on such a space stops on SIGTERM while it proposes."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.agents import create_agent
from dse.agents._base import Feedback
from dse.agents._common import MAX_CONSTRAINT_WORK, VALIDITY_SCAN
from dse.agents._optuna import MAX_INVALID_REDRAWS, MAX_MOVES, REDRAW_CHOICES
from dse.core import bounds as B
from dse.core.expr import node_count
from tests.conftest import EXAMPLES, REPO, small_space


def _bench() -> Any:
    """bench/agent_bounds.py, whose spaces at the bounds these tests share."""
    spec = importlib.util.spec_from_file_location(
        "agent_bounds", REPO / "bench" / "agent_bounds.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()

_INT = {"type": "int", "low": 1, "high": B.MAX_DOMAIN_VALUES}

SPACES: dict[str, dict[str, Any]] = {
    "one knob, every value": {"micro_batch_size": _INT},
    "one choice knob, every value": {
        "micro_batch_size": {"values": list(range(1, B.MAX_DOMAIN_VALUES + 1))}
    },
    "every knob, 16 values": {
        f"env.NCCL_X{i}": {"type": "int", "low": 1, "high": 16} for i in range(B.MAX_KNOBS)
    },
    "every knob, every value": {f"env.NCCL_X{i}": _INT for i in range(B.MAX_KNOBS)},
}


@pytest.fixture
def hang_guard() -> Iterator[None]:
    """Fail (not time) a test whose proposals hang: before the bound one knob of 4,096 values
    took over 100 s per proposal, every knob at every value did not answer at all."""

    def fire(_s: int, _f: Any) -> None:
        raise TimeoutError("a proposal hung (hang guard: 480 s for the whole test)")

    old = signal.signal(signal.SIGALRM, fire)
    # at load 12-13 on 2 cores the every-value TPE case took over 240 s
    signal.alarm(480)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("agent", ["tpe", "tpe-estimate", "gp", "nsga2", "random", "grid"])
@pytest.mark.parametrize("case", sorted(SPACES))
def test_first_proposals_at_every_bound(
    case: str, agent: str, hang_guard: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if agent in ("gp", "nsga2", "grid") and case.startswith("every knob, every"):
        pytest.skip("as tpe there (one sampler path); kept short on a shared machine")
    name, prior = ("tpe", False) if agent == "tpe-estimate" else (agent, True)
    space = small_space("b", SPACES[case], agent={"name": name, "prior": prior, "seed": 3})
    # the prior's value preferences read a knob's numbers: from a cache, not by a pass over
    # its domain per candidate (16.8 million steps per proposal at one knob of 4,096 values)
    from dse.agents import _prior

    passes: list[int] = []
    numeric = _prior._numeric

    def counted_numeric(values: Any) -> list[float]:
        if getattr(values, "numeric", None) is None:
            passes.append(len(values))
        return numeric(values)

    monkeypatch.setattr(_prior, "_numeric", counted_numeric)
    a = create_agent(space)
    looked: list[int] = []
    cands = getattr(a, "_prior_candidates", None)
    if cands is not None:

        def counted() -> Iterator[dict[str, Any]]:
            looked.append(0)
            for c in cands():
                looked[-1] += 1
                yield c

        a._prior_candidates = counted  # type: ignore[attr-defined]
    seen = set()
    for i in range(4):  # the baseline, then the structured start
        (p,) = a.ask(1)
        key = tuple(sorted(p.params.items()))
        assert key not in seen
        seen.add(key)
        a.tell(p.trial_id, Feedback("complete", values=(100.0 + i,), metrics={"peak_mem_gib": 9}))
    # the candidates of one proposal: two roots' moves within the budget, random configs
    per_root = MAX_MOVES * 8 // max(8, len(space.knobs))
    assert all(n <= max(B.MAX_DOMAIN_VALUES, 2 * per_root + 512) for n in looked), looked
    assert sum(passes) <= sum(len(k.values()) for k in space.knobs.values()), len(passes)


def test_warm_start_at_its_bound(hang_guard: None) -> None:
    ws = [{"micro_batch_size": v} for v in range(1, B.MAX_LIST_ITEMS + 1)]
    space = small_space("b", {"micro_batch_size": _INT}, agent={"name": "tpe", "warm_start": ws})
    a = create_agent(space)
    got = [a.ask(1)[0] for _ in range(3)]
    assert len({p.params["micro_batch_size"] for p in got}) == 3


def test_sigterm_stops_dse_start_while_it_proposes(tmp_path: Path) -> None:
    """``dse start`` of a space at the bounds (simulated trials) stops on SIGTERM: the study
    is left stopped and the process exits with 128 + SIGTERM."""
    d = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    d.update(study="bounds", workload={"name": "sim"}, budget={"n_trials": 500})
    d["knobs"] = {f"env.NCCL_X{i}": dict(_INT) for i in range(B.MAX_KNOBS)}
    d["runner"] = {"name": "local", "workdir": str(tmp_path / "runs")}
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(d))
    url = f"sqlite:///{tmp_path / 'b.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse.cli", "start", "--space", str(space), "--storage", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        # wait until the first trial finished: the agent is proposing from then on
        from dse.storage import open_storage

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            st = open_storage(url)
            try:
                done = [t for t in st.list_trials(st.get_study("bounds").id) if t.finished_at]
            except Exception:  # noqa: BLE001 - the study is not created yet
                done = []
            finally:
                st.close()
            if done:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)  # a hang guard, not a timing
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    st = open_storage(url)
    try:
        assert st.get_study("bounds").state == "stopped"
    finally:
        st.close()


#: Constraint nodes one ask may evaluate: the start's choice, a neighbour scan and a random
#: scan each up to MAX_CONSTRAINT_WORK (and the check that crosses it), 64 random draws and
#: the sampler's redraws each one check of every constraint at its largest.
ASK_WORK = 3 * MAX_CONSTRAINT_WORK + 100 * B.MAX_CONSTRAINTS * B.MAX_CONSTRAINT_NODES


@pytest.mark.parametrize("case", sorted(BENCH.E2E_CASES))
def test_dry_run_at_every_bound(case: str, tmp_path: Path, hang_guard: None) -> None:
    """What ``dse start --dry-run`` does, in process, on each space of ``bench/agent_bounds.py
    --end-to-end`` (its file read with the parser's bounds): the baseline and the agent's
    next two proposals, each ask evaluating at most ASK_WORK nodes of constraints and
    checking a bounded number of candidates. Before the bound, 64 constraints of 200 nodes
    took 33 s to the first proposal (3,398 checks, each evaluating every constraint), and a
    start whose favourites the constraints reject checked 8,000 candidates per proposal."""
    from dse.core.expr import evaluated_nodes
    from dse.loop.proposer import Proposer, cost_model_memory_hint, cost_model_speed_hint
    from dse.model.costmodel import CostModel
    from dse.space.searchspace import load_space

    path = BENCH.write_space(case, tmp_path)
    if case == "all":  # the file and YAML bounds at their maximum too
        assert path.stat().st_size > B.MAX_SPACE_BYTES - 4096
        assert _yaml_nodes(path) > B.MAX_YAML_NODES - 500
    space = load_space(path)
    cm = CostModel(space.model, space.semantics, space.resources)
    hints = cost_model_memory_hint(space, cm), cost_model_speed_hint(space, cm)
    agent = create_agent(space, *hints)
    proposer = Proposer(space, agent, space.resources.features)
    checks = [0]

    def counted(params: Any) -> bool:
        checks[0] += 1
        return proposer.is_valid(params)

    agent.set_validity(counted)
    draws = [0]  # Optuna samples (each costs time in proportion to the knob values)
    sample = agent._sample  # type: ignore[attr-defined]

    def counted_sample(trial: Any) -> Any:
        draws[0] += 1
        return sample(trial)

    agent._sample = counted_sample  # type: ignore[attr-defined]
    ask = agent.ask
    per_ask: list[tuple[int, int, int]] = []  # (checks, constraint nodes evaluated, draws)

    def counted_ask(n: int = 1) -> Any:
        c, w, d = checks[0], evaluated_nodes(), draws[0]
        got = ask(n)
        per_ask.append((checks[0] - c, evaluated_nodes() - w, draws[0] - d))
        return got

    agent.ask = counted_ask  # type: ignore[method-assign]
    for i in range(3):  # the baseline, then the agent's own next two (or the warm start)
        got = proposer.propose(1)
        assert len(got) == 1, (case, i, got.message, per_ask)
        agent.tell(got[0].trial_id, Feedback("complete", values=(1.0 + i,),
                                             metrics={"peak_mem_gib": 1}))  # fmt: skip
    values = sum(len(k.values()) for k in space.knobs.values())
    redraws = max(1, MAX_INVALID_REDRAWS * REDRAW_CHOICES // max(values, REDRAW_CHOICES))
    for n_checks, work, n_draws in per_ask:
        assert work <= ASK_WORK, (case, per_ask)
        # candidates of a start (two roots' moves, random ones), a scan, the redraws
        assert n_checks <= 2 * MAX_MOVES + 512 + 2 * VALIDITY_SCAN + 64 + MAX_INVALID_REDRAWS
        # the redraws of invalid samples, a repeat, the proposal registered with Optuna
        assert n_draws <= redraws + 3, (case, per_ask)


def _yaml_nodes(path: Path) -> int:
    def size(node: Any) -> int:
        if isinstance(node, yaml.MappingNode):
            return 1 + sum(size(k) + size(v) for k, v in node.value)
        if isinstance(node, yaml.SequenceNode):
            return 1 + sum(size(v) for v in node.value)
        return 1

    return size(yaml.compose(path.read_text()))


#: A global batch of 1,600 divisors (the most of any 32-bit integer): micro-batch sizes
#: that divide it pass the batch rule and reach the constraints.
_GBS = 2_095_133_040


def _rejecting_space() -> Any:
    """One knob of the micro-batch sizes below 2**15 that divide :data:`_GBS` (the
    constraints multiply it by 2**240 within their 256 bits), and MAX_CONSTRAINTS
    constraints of MAX_CONSTRAINT_NODES nodes; the last allows only size 1 (the baseline):
    every other configuration is checked against every constraint before it is found
    invalid."""
    sizes = [d for d in range(1, 2**15) if _GBS % d == 0]
    knobs = {n: {"values": [1]} for n in BENCH._CONSTRAINT_KNOBS[1:]}
    cons = [BENCH.constraint(i) for i in range(B.MAX_CONSTRAINTS - 1)]
    return small_space(
        "b",
        {"micro_batch_size": {"values": sizes}, **knobs},
        constraints=[*cons, "micro_batch_size == 1"],
        semantics={"global_batch_size": _GBS, "seq_length": 128},
        agent={"name": "tpe", "seed": 3},
    )


@pytest.mark.parametrize("scan", ["neighbours", "random", "grid"])
def test_fallback_scans_bounded_by_constraints(scan: str, hang_guard: None) -> None:
    """The scans for an unseen valid configuration (a sampler's neighbours, random unseen
    configurations, the grid's next one) evaluate at most MAX_CONSTRAINT_WORK nodes of
    constraints: about 312 configurations at the most constraints, not all 741 neighbours
    here (a million at 256 knobs of 4,096 values), each of 64 evaluations."""
    from dse.agents._simple import GridAgent
    from dse.core.expr import evaluated_nodes
    from dse.loop.proposer import Proposer

    space = _rejecting_space()
    nodes = sum(node_count(e) for e in space.constraints)
    assert nodes > B.MAX_CONSTRAINTS * B.MAX_CONSTRAINT_NODES - 200
    agent = GridAgent(space, seed=3) if scan == "grid" else create_agent(space)
    proposer = Proposer(space, agent, space.resources.features)
    base = space.baseline()
    agent.ask(1)  # the baseline, the one valid configuration: none is left
    checks: list[int] = []

    def counted(params: Any) -> bool:
        checks.append(0)
        return proposer.is_valid(params)

    agent.set_validity(counted)
    before = evaluated_nodes()
    if scan == "neighbours":
        assert agent._neighbor_unseen({**base, "micro_batch_size": 2}) is None  # cut short
    elif scan == "random":
        assert agent._random_unseen() is not None  # an invalid one, after the scan
    else:
        assert agent.ask(1)  # handed out after the scan, invalid
    work = evaluated_nodes() - before
    # each check reached the constraints: the work, not the count of checks, stopped it
    assert MAX_CONSTRAINT_WORK - 65 * nodes <= work <= MAX_CONSTRAINT_WORK + 65 * nodes, work
    assert len(checks) <= 64 + MAX_CONSTRAINT_WORK // (nodes - 200) + 1, len(checks)


def test_is_valid_agrees_with_check() -> None:
    """``rules.is_valid`` (the agents' check: first rule broken, constraints last, each up
    to the first that fails) says what ``not rules.check`` says, also for a constraint that
    cannot be evaluated."""
    from dse.model.rules import check, is_valid

    space = small_space(
        "b",
        {"micro_batch_size": {"values": [1, 2, 3, 4, 8]},
         "tensor_model_parallel_size": {"values": [1, 2]}},
        world_size=2,
        constraints=["8 // (micro_batch_size - 3) >= -8", "micro_batch_size <= 4"],
    )  # fmt: skip
    seen = set()
    for p in space.iter_configs():
        want = not check(space, p, [])
        assert is_valid(space, p, []) == want, p
        seen.add(want)
    assert seen == {True, False}
