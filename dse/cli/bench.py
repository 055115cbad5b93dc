"""``dse bench``: how many trials each agent needs to find a near-best configuration.

Each agent runs once per seed on a measured table through the study loop itself
(:class:`dse.loop.study.StudyRunner`: validity rules, optional cost-model pre-screen, claims,
budget, storage), with in-memory storage and an in-process runner that answers every
launched trial by :meth:`ReplayTable.outcome` instead of a GPU run. Per agent the report
gives the median number of trials (baseline included) until a configuration within
``--target-gap`` of the table's best was measured, and the fraction of seeds that got there
within the budget.

Counting. A *trial* is what would have cost a GPU run, as in a study: an ``ok`` row, an
``oom`` or ``error`` row, an ``invalid`` row the rules did not catch, and a combination the
table has no row for. Proposals rejected before launch (a rule, the pre-screen) are told to
the agent as infeasible and are not trials.

``n_valid`` (the default budget) is the number of configurations of the table's space that
pass :func:`dse.model.rules.check` and have a row whose status is not ``invalid``: the trials an
exhaustive search would spend. ``best_value`` is the best objective value among ``ok``
rows that pass the rules.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dse.agents import AGENTS, create_agent
from dse.core.exceptions import DSEError
from dse.core.records import Outcome
from dse.loop.agent_session import outcome_of_record
from dse.loop.proposer import cost_model_memory_hint, cost_model_speed_hint
from dse.loop.study import Progress, StudyRunner
from dse.model.rules import check
from dse.runners import InProcessRunner
from dse.space.searchspace import SearchSpace
from dse.workloads.replay import ReplayTable

__all__ = ["register", "run", "bench", "RunStats"]


@dataclass(frozen=True)
class RunStats:
    """One agent on one seed."""

    agent: str
    seed: int
    trials_to_target: int | None
    trials_run: int
    oom_trials_run: int
    oom_after_first_oom: int
    error_trials_run: int
    rule_rejections: int
    prescreen_rejections: int
    prescreen_saved: int
    seconds: float


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "bench",
        help="trials each agent needs to get near the best of a measured table",
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("--table", required=True, help="measured table (replay JSONL)")
    p.add_argument(
        "--agents",
        default="tpe,gp,random,grid",
        help="comma-separated agents (default: %(default)s)",
    )
    p.add_argument("--seeds", type=int, default=20, help="runs per agent, seeds 0..N-1")
    p.add_argument("--budget", type=int, help="trials per run (default: n_valid)")
    p.add_argument(
        "--target-gap",
        type=float,
        default=0.02,
        help="relative distance to the best that counts as reached (default: %(default)s)",
    )
    p.add_argument(
        "--n-startup-trials",
        type=int,
        default=None,
        help="agent.n_startup_trials (default: the space default)",
    )
    p.add_argument(
        "--prescreen", action="store_true", help="screen with the cost model before launch"
    )
    p.add_argument(
        "--full-budget",
        action="store_true",
        help="keep running after the target until the budget is spent (OOM accounting)",
    )
    p.add_argument(
        "--no-prior",
        action="store_true",
        help="tpe/gp/nsga2 without the knob-semantics start (random start-up trials)",
    )
    p.add_argument(
        "--no-estimate",
        action="store_true",
        help="with --no-prior: random start-up trials, not the cost model's speed estimate",
    )
    p.add_argument(
        "--no-memory-hint",
        action="store_true",
        help="tpe/gp/nsga2 start without the cost model's memory predictions",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(fn=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 on success, 2 on bad input (message on stderr)."""

    agents = [a.strip() for a in str(args.agents).split(",") if a.strip()]
    bad = [a for a in agents if a not in AGENTS]
    if not agents or bad:
        return _fail(f"unknown agent(s) {bad or agents}; known: {', '.join(AGENTS)}")
    if args.seeds < 1:
        return _fail(f"--seeds must be >= 1 (seeds={args.seeds})")
    if args.budget is not None and args.budget < 1:
        return _fail(f"--budget must be >= 1 (budget={args.budget})")
    if not 0 <= args.target_gap < 1:
        return _fail(f"--target-gap must be in [0, 1) (target_gap={args.target_gap})")
    try:
        report = bench(
            args.table,
            agents,
            seeds=args.seeds,
            budget=args.budget,
            target_gap=args.target_gap,
            prescreen=args.prescreen,
            n_startup_trials=getattr(args, "n_startup_trials", None),
            prior=not getattr(args, "no_prior", False),
            full_budget=getattr(args, "full_budget", False),
            memory_hint=not getattr(args, "no_memory_hint", False),
            estimate=not getattr(args, "no_estimate", False),
        )
    except DSEError as e:
        return _fail(str(e))
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        sys.stdout.write(format_report(report))
    return 0


def _fail(msg: str) -> int:
    sys.stderr.write(f"dse bench: {msg}\n")
    return 2


def bench(
    table_path: str,
    agents: Sequence[str],
    *,
    seeds: int = 20,
    budget: int | None = None,
    target_gap: float = 0.02,
    prescreen: bool = False,
    n_startup_trials: int | None = None,
    prior: bool = True,
    full_budget: bool = False,
    memory_hint: bool = True,
    estimate: bool = True,
) -> dict[str, Any]:
    """The benchmark as a dict (the ``--json`` object)."""

    table = ReplayTable.load(table_path)
    space = table.to_space(study="bench")
    features = (
        set(space.resources.features) if isinstance(space.resources.features, list) else None
    )
    obj = space.objective
    n_valid = 0
    for p in space.iter_configs():
        row = table.lookup(p)
        if row is not None and row.status != "invalid" and not check(space, p, features):
            n_valid += 1
    ok = [
        float(r.metrics[obj.metric])
        for r in table.rows
        if r.status == "ok" and obj.metric in r.metrics and not check(space, r.params, features)
    ]
    if not ok:
        raise DSEError(f"table {table_path}: no ok row with {obj.metric} passes the rules")
    maximize = obj.direction == "maximize"
    best = max(ok) if maximize else min(ok)
    target = best * (1 - target_gap) if maximize else best * (1 + target_gap)
    n_budget = budget if budget is not None else n_valid

    def reached(out: Outcome) -> bool:
        v = out.metrics.get(obj.metric) if out.ok else None
        if not isinstance(v, int | float):
            return False
        return v >= target - 1e-12 if maximize else v <= target + 1e-12

    from dse.storage import open_storage

    storage = open_storage("sqlite://")  # in memory: one study per agent and seed
    try:
        per_agent: dict[str, Any] = {}
        for name in agents:
            runs = [
                run_one(
                    space,
                    table,
                    name,
                    seed,
                    n_budget,
                    reached,
                    prescreen,
                    n_startup_trials,
                    prior,
                    full_budget,
                    memory_hint,
                    storage,
                    estimate,
                )
                for seed in range(seeds)
            ]
            ttt = [r.trials_to_target for r in runs]
            per_agent[name] = {
                "median_trials_to_target": _median(ttt),
                "reached_fraction": sum(t is not None for t in ttt) / len(ttt),
                "trials_to_target": ttt,
                "oom_trials_run": sum(r.oom_trials_run for r in runs),
                "oom_after_first_oom": sum(r.oom_after_first_oom for r in runs),
                "error_trials_run": sum(r.error_trials_run for r in runs),
                "rule_rejections": sum(r.rule_rejections for r in runs),
                "prescreen_rejections": sum(r.prescreen_rejections for r in runs),
                "prescreen_saved": sum(r.prescreen_saved for r in runs),
                "seconds": round(sum(r.seconds for r in runs), 3),
            }
    finally:
        storage.close()
    return {
        "table": str(table_path),
        "metric": obj.metric,
        "direction": obj.direction,
        "n_valid": n_valid,
        "best_value": best,
        "target_gap": target_gap,
        "target_value": target,
        "seeds": seeds,
        "budget": n_budget,
        "prescreen": prescreen,
        "prior": prior,
        "full_budget": full_budget,
        "memory_hint": memory_hint,
        "estimate": estimate,
        "agents": per_agent,
    }


def _median(xs: Sequence[int | None]) -> float | None:
    """Median with unreached runs as +inf; None when the median itself is unreached."""
    vals = sorted(math.inf if x is None else float(x) for x in xs)
    m = statistics.median(vals)
    return None if math.isinf(m) else m


def _cost_model_class() -> Any:
    from dse.model.costmodel import CostModel

    return CostModel


def run_one(
    space: SearchSpace,
    table: Any,
    agent_name: str,
    seed: int,
    budget: int,
    reached: Callable[[Outcome], bool],
    prescreen: bool = False,
    n_startup_trials: int | None = None,
    prior: bool = True,
    full_budget: bool = False,
    memory_hint: bool = False,
    storage: Any = None,
    estimate: bool = False,
) -> RunStats:
    """One agent, one seed: the study loop (:class:`dse.loop.study.StudyRunner`) on an in-process
    runner that answers each trial from the table, with in-memory storage, until the target
    is measured (or, with ``full_budget``, until ``budget`` trials ran) or the agent is spent.
    """
    from dse.storage import open_storage

    t0 = time.perf_counter()
    upd: dict[str, Any] = {"name": agent_name, "seed": seed, "prior": prior, "estimate": estimate}
    if n_startup_trials is not None:
        upd["n_startup_trials"] = n_startup_trials
    sp = space.model_copy(
        update={
            "study": f"bench-{agent_name}-{seed}",
            "agent": space.agent.model_copy(update=upd),
            "budget": space.budget.model_copy(update={"n_trials": budget}),
            "prescreen": space.prescreen.model_copy(update={"enabled": prescreen}),
        }
    )
    features = set(sp.resources.features) if isinstance(sp.resources.features, list) else None
    cm = None
    if prescreen or memory_hint or (estimate and not prior):
        cm = _cost_model_class()(sp.model, sp.semantics, sp.resources)
    # as in a study: the agent may weigh the calibrated cost model's memory predictions (and,
    # without the prior, order its start by the speed estimate)
    agent = create_agent(
        sp,
        cost_model_memory_hint(sp, cm) if memory_hint else None,
        cost_model_speed_hint(sp, cm) if estimate else None,
    )
    own = storage is None
    st = open_storage("sqlite://") if own else storage
    hit: list[int] = []

    def on_trial(rec: Any) -> None:
        out = _outcome(rec)
        if not hit and reached(out):
            hit.append(rec.number + 1)
            if not full_budget:
                loop.request_stop("target reached")

    loop = StudyRunner(
        sp,
        storage=st,
        runner=InProcessRunner(lambda spec: table.outcome(spec.params)),
        agent=agent,
        space_yaml=sp.model_dump_json(),
        features=features,
        progress=Progress(quiet=True),
        cost_model=cm,
        on_trial=on_trial,
    )
    try:
        loop.run()
        rec = st.get_study(sp.study)
        trials = sorted(st.list_trials(rec.id), key=lambda t: t.number)
        rejections = st.list_rejections(rec.id)
    finally:
        if own:
            st.close()
    ooms = errors = ooms_after = 0
    for t in trials:
        ooms_after += t.failure_class == "oom" and ooms > 0
        ooms += t.failure_class == "oom"
        errors += t.failure_class == "error"
    pre = [r for r in rejections if r.rule == "prescreen"]
    saved = 0
    for r in pre:
        row = table.lookup(r.params)
        saved += row is not None and row.status == "oom"
    return RunStats(
        agent=agent_name,
        seed=seed,
        trials_to_target=hit[0] if hit else None,
        trials_run=len(trials),
        oom_trials_run=ooms,
        oom_after_first_oom=ooms_after,
        error_trials_run=errors,
        rule_rejections=sum(r.kind == "invalid" for r in rejections),
        prescreen_rejections=len(pre),
        prescreen_saved=saved,
        seconds=time.perf_counter() - t0,
    )


def _outcome(rec: Any) -> Outcome:
    return outcome_of_record(rec)


def format_report(report: dict[str, Any]) -> str:
    """The readable form of :func:`bench`'s dict."""
    arrow = ">=" if report["direction"] == "maximize" else "<="
    lines = [
        f"table {report['table']}",
        f"  {report['n_valid']} valid configurations, best {report['metric']} "
        f"{report['best_value']:g}, target {arrow} {report['target_value']:.4g} "
        f"(gap {report['target_gap']:.1%}), {report['seeds']} seeds, budget "
        f"{report['budget']} trials, prescreen {'on' if report['prescreen'] else 'off'}, "
        f"prior {'on' if report.get('prior', True) else 'off'}"
        + (
            ""
            if report.get("prior", True)
            else f" (speed estimate {'on' if report.get('estimate', True) else 'off'})"
        )
        + ", "
        f"memory hint {'on' if report.get('memory_hint', True) else 'off'}"
        + (", full budget" if report.get("full_budget") else ""),
        "",
        f"{'agent':<8} {'median':>7} {'reached':>8} {'% valid':>8} {'OOM run':>8} "
        f"{'OOM 2nd+':>8} {'rejected':>9} {'saved':>6} {'time s':>7}   "
        "trials to target per seed",
    ]
    n_valid = report["n_valid"] or 1
    for name, a in report["agents"].items():
        med = a["median_trials_to_target"]
        med_s = "-" if med is None else f"{med:g}"
        pct = "-" if med is None else f"{med / n_valid:.0%}"
        per = " ".join("-" if t is None else str(t) for t in a["trials_to_target"])
        lines.append(
            f"{name:<8} {med_s:>7} {a['reached_fraction']:>8.0%} {pct:>8} "
            f"{a['oom_trials_run']:>8} {a['oom_after_first_oom']:>8} "
            f"{a['rule_rejections'] + a['prescreen_rejections']:>9} "
            f"{a['prescreen_saved']:>6} {a['seconds']:>7.1f}   {per}"
        )
    lines += [
        "",
        "median: trials (baseline included) until one within the gap of the best was measured;",
        "OOM run: OOM trials launched, all seeds; OOM 2nd+: of those, launched after the",
        "run had already measured an OOM; rejected: before launch (rules, prescreen);",
        "saved: prescreen rejections that the table measured as OOM.",
    ]
    return "\n".join(lines) + "\n"
