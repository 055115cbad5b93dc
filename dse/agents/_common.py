"""Bookkeeping every agent shares: canonical configurations, what was already asked or
evaluated, the baseline / warm-start queue, and random unseen configurations.

Subclasses implement four hooks (:meth:`SpaceAgent._suggest`, :meth:`SpaceAgent._fixed`,
:meth:`SpaceAgent._finish`, :meth:`SpaceAgent._record`); :class:`SpaceAgent` keeps the contract
of :class:`~dse.agents.BaseAgent`: proposals are canonical, in their domains, distinct from
each other and from everything asked or evaluated before, and the first proposal of a fresh
agent is the baseline.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dse.agents._base import BaseAgent, Feedback, Proposal
from dse.core.expr import evaluated_nodes
from dse.core.records import MEASURED_STATES
from dse.space.searchspace import SearchSpace, params_key

__all__ = [
    "SpaceAgent",
    "Observation",
    "knob_order",
    "canonical",
    "in_domain",
    "MAX_CONSTRAINT_WORK",
]

log = logging.getLogger("dse.agents")

#: Spaces with at most this many raw combinations may be enumerated (exhaustion checks,
#: the grid's shuffle, the prior's candidate set).
ENUMERATE_LIMIT = 200_000
#: Unseen configurations checked against the validity rules when random draws found none,
#: and unseen neighbours of a configuration (fewer when their constraints reach
#: :data:`MAX_CONSTRAINT_WORK`).
VALIDITY_SCAN = 2_000
#: Syntax nodes of constraints (:func:`dse.core.expr.evaluated_nodes`) that the validity checks
#: of one search may evaluate: the structured start's choice of one proposal, a scan of
#: unseen neighbours or configurations. A check stops at the first rule broken, so only the
#: configurations that pass the other rules cost constraint evaluations; the most
#: constraints a space may have (64 of 200 nodes) cost 3 to 6 ms per configuration on a
#: loaded core, and a start looks at up to 50,000 candidates, a neighbour scan at up to a
#: million (256 knobs of 4,096 values): a search among configurations that its constraints
#: mostly reject took minutes per proposal. This is about 312 such configurations at the
#: most constraints (1 to 2 s); a space without constraints never reaches it. Past it a
#: candidate counts as invalid: the start proposes the best one checked, or ends there when
#: none was valid (the sampler proposes; another ask would check the same candidates again);
#: a scan gives what it found.
MAX_CONSTRAINT_WORK = 4_000_000


@dataclass(frozen=True)
class Observation:
    """A configuration and what happened to it (told or added)."""

    params: dict[str, Any]
    feedback: Feedback


def knob_order(space: SearchSpace) -> list[str]:
    """Knob names with every conditional knob after the knobs its condition names.

    Sampling in this order lets ``space.is_active`` be decided from values already chosen.
    """
    names = list(space.knobs)
    done: list[str] = []
    left = list(names)
    while left:
        progressed = False
        for name in list(left):
            deps = [d for d in (space.knobs[name].when or {}) if d in space.knobs]
            if all(d in done for d in deps):
                done.append(name)
                left.remove(name)
                progressed = True
        if not progressed:  # a cycle: keep the declared order for the rest
            done.extend(left)
            break
    return done


def canonical(space: SearchSpace, params: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical form of ``params`` (:meth:`dse.space.searchspace.SearchSpace.canonical`)."""
    return space.canonical(params)


def in_domain(space: SearchSpace, params: Mapping[str, Any]) -> bool:
    """Whether every knob value of ``params`` is one of its domain's values."""
    for name, spec in space.knobs.items():
        v = params.get(name)
        if not any(_same(v, d) for d in spec.values()):
            return False
    return True


def _same(a: Any, b: Any) -> bool:
    # True == 1 in Python; a knob domain never mixes them, but keys must not either.
    return type(a) is type(b) and a == b


class SpaceAgent(BaseAgent):
    """Base of the dse agents: the shared bookkeeping of the ask/tell contract."""

    name = "base"

    def __init__(self, space: SearchSpace, seed: int | None = None) -> None:
        super().__init__(space, seed)
        self._rng = random.Random(seed)
        self._order = knob_order(space)
        #: each knob's values, built once (an int domain of 4,096 values is a list of them)
        self._values: dict[str, list[Any]] = {n: k.values() for n, k in space.knobs.items()}
        self._seen: set[str] = set()
        self._pending: dict[str, tuple[dict[str, Any], Any]] = {}
        self._observations: list[Observation] = []
        self._all: list[dict[str, Any]] | None = None
        start = [space.baseline()]
        base = start[0]
        for ws in space.agent.warm_start:
            start.append(canonical(space, {**base, **ws}))
        self._start: list[dict[str, Any]] = start

    # --- public contract -------------------------------------------------------------------
    @property
    def observations(self) -> list[Observation]:
        """Everything told or added so far, in that order."""
        return list(self._observations)

    @property
    def n_pending(self) -> int:
        """Proposals asked and not yet told."""
        return len(self._pending)

    def is_seen(self, params: Mapping[str, Any]) -> bool:
        """Whether the canonical form of ``params`` was asked or evaluated already."""
        return params_key(canonical(self.space, params)) in self._seen

    def ask(self, n: int = 1) -> list[Proposal]:
        """Up to ``n`` new, distinct, canonical proposals (fewer only when the space is spent)."""
        if n < 0:
            raise ValueError(f"n must be >= 0 (n={n})")
        out: list[Proposal] = []
        for _ in range(n):
            params = self._next_start()
            if params is not None:
                handle = self._fixed(params)
            else:
                got = self._suggest()
                if got is None:
                    break
                params, handle = got
            key = params_key(params)
            if key in self._seen:  # a bug in a subclass: never hand out a repeat
                raise RuntimeError(f"{self.name} agent proposed a known configuration {key}")
            self._seen.add(key)
            tid = uuid.uuid4().hex
            self._pending[tid] = (params, handle)
            out.append(Proposal(tid, dict(params)))
        return out

    def tell(self, trial_id: str, feedback: Feedback) -> None:
        """The outcome of a proposal of :meth:`ask` (each is told exactly once)."""
        if trial_id not in self._pending:
            raise KeyError(f"unknown or already told trial id {trial_id!r}")
        _check_feedback(self.space, feedback)
        params, handle = self._pending.pop(trial_id)
        self._observations.append(Observation(params, feedback))
        self._finish(handle, params, feedback)

    def add_evaluated(self, params: dict[str, Any], feedback: Feedback) -> None:
        """History from storage or an earlier study; values outside the domains are ignored."""
        p = canonical(self.space, params)
        if not in_domain(self.space, p):
            log.debug("%s agent: ignoring an evaluated configuration outside the space", self.name)
            return
        _check_feedback(self.space, feedback)
        self._seen.add(params_key(p))
        self._observations.append(Observation(p, feedback))
        self._record(p, feedback)

    # --- hooks -----------------------------------------------------------------------------
    def _suggest(self) -> tuple[dict[str, Any], Any] | None:
        """A new unseen canonical configuration and an opaque handle; None when spent."""
        p = self._random_unseen()
        return None if p is None else (p, None)

    def _fixed(self, params: dict[str, Any]) -> Any:
        """Register a configuration the agent chose itself (baseline, warm start)."""
        return None

    def _finish(self, handle: Any, params: dict[str, Any], feedback: Feedback) -> None:
        """Learn from the outcome of a proposal."""

    def _record(self, params: dict[str, Any], feedback: Feedback) -> None:
        """Learn from a configuration evaluated elsewhere."""

    # --- helpers ---------------------------------------------------------------------------
    def _next_start(self) -> dict[str, Any] | None:
        while self._start:
            p = self._start.pop(0)
            if params_key(p) not in self._seen:
                return p
        return None

    def _random_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self._order:
            spec = self.space.knobs[name]
            if spec.when and not self.space.is_active(name, out):
                continue
            out[name] = self._rng.choice(self._values[name])
        return canonical(self.space, out)

    def all_configs(self) -> list[dict[str, Any]] | None:
        """Every canonical configuration (cached), or None when the space is too large."""
        if self._all is None:
            if self.space.size() > ENUMERATE_LIMIT:
                return None
            self._all = list(self.space.iter_configs())
        return self._all

    def _unseen_configs(self) -> Iterator[dict[str, Any]]:
        for p in self.all_configs() or []:
            if params_key(p) not in self._seen:
                yield p

    def _is_valid(self, params: Mapping[str, Any]) -> bool:
        """Whether ``params`` passes the validity rules the agent was given (True: unknown)."""
        return self.valid is None or self.valid(params)

    def _random_unseen(
        self, tries: int = 64, accept: Callable[[Mapping[str, Any]], bool] | None = None
    ) -> dict[str, Any] | None:
        """A uniformly drawn unseen valid configuration (with ``accept``: the first of
        ``tries`` draws it accepts, else the first valid unseen draw, else the first unseen
        draw); None when the space is spent."""
        first: dict[str, Any] | None = None
        first_valid: dict[str, Any] | None = None
        for _ in range(tries):
            p = self._random_config()
            if params_key(p) in self._seen:
                continue
            ok = self._is_valid(p)
            if ok and (accept is None or accept(p)):
                return p
            if ok and first_valid is None:
                first_valid = p
            first = first or p
        if first_valid is not None:
            return first_valid
        left = list(self._unseen_configs())
        self._rng.shuffle(left)
        since = evaluated_nodes()
        for p in left[:VALIDITY_SCAN]:
            if evaluated_nodes() - since >= MAX_CONSTRAINT_WORK:
                break
            if self._is_valid(p):
                return p
        return first or (left[0] if left else None)

    def _neighbor_unseen(
        self,
        params: Mapping[str, Any],
        accept: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> dict[str, Any] | None:
        """An unseen valid configuration one knob away from ``params`` (random knob and
        value); with ``accept``, the first that it accepts, else the first valid unseen one,
        else the first unseen one. At most :data:`VALIDITY_SCAN` unseen neighbours are
        checked in a space of up to 8 knobs, ``VALIDITY_SCAN * 8 / knobs`` with more (each
        costs time in proportion to the knobs), fewer when their constraints reach
        :data:`MAX_CONSTRAINT_WORK`: a space of 256 knobs of 4,096 values has a million
        neighbours, 2,000 of them took 10 s, and a check of the most constraints a space may
        have takes milliseconds. A scan cut short without a valid neighbour gives None (the
        caller draws at random)."""
        names = list(self.space.knobs)
        self._rng.shuffle(names)
        first: dict[str, Any] | None = None
        first_valid: dict[str, Any] | None = None
        left = VALIDITY_SCAN * 8 // max(8, len(names))
        since = evaluated_nodes()
        for name in names:
            if left <= 0:
                break
            values = [v for v in self.space.knobs[name].values() if not _same(v, params[name])]
            self._rng.shuffle(values)
            for v in values:
                p = canonical(self.space, {**params, name: v})
                if params_key(p) in self._seen:
                    continue
                if evaluated_nodes() - since >= MAX_CONSTRAINT_WORK:
                    left = 0
                if left <= 0:
                    break
                left -= 1
                ok = self._is_valid(p)
                if ok and (accept is None or accept(p)):
                    return p
                if ok and first_valid is None:
                    first_valid = p
                if first is None:
                    first = p
        if left <= 0 and first_valid is None:
            return None
        return first_valid if first_valid is not None else first

    def active_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The knobs of ``params`` that are active (what a sampler decides)."""
        out: dict[str, Any] = {}
        for name in self._order:
            if self.space.knobs[name].when and not self.space.is_active(name, params):
                continue
            out[name] = params[name]
        return out


def _check_feedback(space: SearchSpace, fb: Feedback) -> None:
    if fb.state in MEASURED_STATES:
        if fb.values is None or len(fb.values) != len(space.objectives):
            raise ValueError(
                f"{fb.state} feedback needs one value per objective "
                f"(values={fb.values}, objectives={len(space.objectives)})"
            )
