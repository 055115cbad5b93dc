"""Agents backed by Optuna samplers (TPE, GP, NSGA-II) over an in-memory Optuna study.

The project's SQL storage is the source of truth: the Optuna study lives in memory and is
rebuilt after a restart from :meth:`~dse.agents.BaseAgent.add_evaluated`.

Every knob is a ``CategoricalDistribution`` over its domain's values; a conditional knob is
suggested only when it is active (Optuna sees a define-by-run conditional space, which
``TPESampler(group=True)`` decomposes), then the configuration is canonicalized with
``space.apply_conditions``.

How feedback is told (one constraint, ``dse``, on every trial; <= 0 means feasible):

* ``complete``: state COMPLETE with the objective values; the constraint is
  ``peak_mem_gib / capacity - 1`` (<= 0) when both are known, else 0, so a constrained GP
  also learns how close to the memory limit a region is.
* ``pruned`` (stopped early, dominated by the best): as ``complete``, with its measured
  values (a shorter measurement of a configuration that lies clearly below the best; Optuna's
  own PRUNED state would need intermediate values per step, which the samplers use only to
  rank it below the complete trials anyway).
* ``infeasible`` (a rule, a predicted or a measured OOM): state COMPLETE with a placeholder
  value, the worst value seen so far (0 for a maximized objective before any), and a
  constraint > 0: ``0.1 + max(0, memory / capacity - 1)`` for OOMs (measured peak or
  predicted peak), 1 for rule violations. TPE puts infeasible trials in its "bad" group,
  the GP models P(feasible), NSGA-II ranks feasible before infeasible: all three learn the
  boundary instead of sampling into it again.
* ``failed`` (crash, hang, NaN): state FAIL, which every sampler ignores: it says nothing
  about the objective.

Before the sampler proposes anything, the baseline, the space's warm-start configurations
and a structured start from a knob-semantics prior (:mod:`dse.agents._prior`) are proposed.
When the sampler proposes a configuration already asked or evaluated, the sample is
discarded (told FAIL) and drawn again, up to ``max_retries`` times; then an unseen
neighbor (one knob changed) of the last sample is proposed, then a random unseen one.

Given the validity rules (``set_validity``, from the proposer), a sample that breaks one is
never proposed: it is marked seen and discarded (told FAIL, so the sampler's model of the
objective is not fed placeholder values for configurations the rules already exclude), and
drawn again up to :data:`MAX_INVALID_REDRAWS` times (fewer in a space of many knob values:
:data:`REDRAW_CHOICES`); the neighbor and random fallbacks pick
valid configurations. Why: on a Bridge-style space with SP on and TP in {1, 2, 4, 8}, the
start's favourite TP 1 configurations were rejected one by one, 184 in one ask.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, Trial, TrialState

from dse.agents._base import Feedback, MemoryHint, SpeedHint
from dse.agents._common import ENUMERATE_LIMIT, MAX_CONSTRAINT_WORK, SpaceAgent, canonical
from dse.agents._estimate import EstimateGuide
from dse.agents._prior import PriorGuide
from dse.core.exceptions import DSEError
from dse.core.expr import evaluated_nodes
from dse.core.records import MEASURED_STATES, OOM_CLASSES, REJECTION_KINDS, finite
from dse.space.searchspace import SearchSpace, params_key

__all__ = ["OptunaAgent", "TPEAgent", "GPAgent", "NSGA2Agent"]

log = logging.getLogger("dse.agents")

_CONSTRAINT = "dse"
_VIOLATION_ATTR = "dse:violation"
# Optuna >= 5 stores constraints per trial (Trial.set_constraint); older versions need a
# constraints_func, which reads the violation from a user attribute.
_NEW_CONSTRAINTS = hasattr(Trial, "set_constraint")

#: Samples that break a validity rule, drawn again in one ask before moving to a neighbor
#: (fewer in a space of more than :data:`REDRAW_CHOICES` choices).
MAX_INVALID_REDRAWS = 8
#: Knob values in all (the sum of the domains' sizes) up to which an ask redraws
#: :data:`MAX_INVALID_REDRAWS` times; with more, ``MAX_INVALID_REDRAWS * REDRAW_CHOICES /
#: values`` times, at least once. An Optuna draw costs time in proportion to the values (its
#: distributions are compared and copied whole): at 256 knobs of 4,096 values about 1 s a
#: draw, and an ask redrew for 20 s in a space whose draws were mostly invalid.
REDRAW_CHOICES = 65_536

#: A sample below this probability of fitting in memory (see ``OptunaAgent._fit_check``) is
#: drawn again.
P_SKIP = 0.02

#: Moves of one and two knobs the structured start looks at from one root configuration, in
#: a space of up to 8 knobs (a candidate costs time in proportion to the knobs: with more, the
#: budget is ``MAX_MOVES * 8 / knobs``). A space whose moves fit (``m * (m + 1)`` for ``m``
#: one-knob moves) is looked at whole, in the same order as always; a larger one (one knob of
#: 4,096 values has 16.8 million pairs of moves, more than 100 s per proposal) is sampled down
#: to the budget: the values next to the root's in each knob's domain and random others
#: (:data:`NEAR_VALUES` of each), half of the budget one-knob moves among those, the other
#: half random pairs of them.
MAX_MOVES = 20_000
#: Values of a knob taken on each side of the root's value, and at random, in a sampled
#: neighbourhood.
NEAR_VALUES = 8


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide Optuna's experimental / deprecation notices about options set on purpose here
    (group, constant_liar, GPSampler, ...): they are not the user's to act on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"optuna(\.|$)")
        warnings.filterwarnings("ignore", category=FutureWarning, message=r".*constraints_func")
        yield


def _constraints_func(trial: FrozenTrial) -> tuple[float, ...]:
    return (float(trial.user_attrs.get(_VIOLATION_ATTR, 0.0)),)


class OptunaAgent(SpaceAgent):
    """An agent that proposes what an Optuna sampler samples (see the module docstring).

    Args:
        space: the search space.
        seed: sampler seed (also seeds tie-breaks and fallbacks).
        prior: use the knob-semantics structured start before the sampler.
        memory_hint: predicted memory of a configuration, for the structured start and the
            sampler's fit check (see :data:`dse.agents.MemoryHint`).
        speed_hint: estimated objective of a configuration; without the prior, the start-up
            trials follow it (:mod:`dse.agents._estimate`) instead of random samples.
        max_retries: samples drawn again when the sampler repeats a known configuration or
            draws one that cannot fit (default: the class's ``default_retries``).
    """

    name = "optuna"
    default_retries = 4

    def __init__(
        self,
        space: SearchSpace,
        seed: int | None = None,
        *,
        prior: bool = True,
        max_retries: int | None = None,
        memory_hint: MemoryHint | None = None,
        speed_hint: SpeedHint | None = None,
    ) -> None:
        super().__init__(space, seed)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.max_retries = self.default_retries if max_retries is None else max_retries
        self._dists = {
            name: CategoricalDistribution(spec.values()) for name, spec in space.knobs.items()
        }
        values = sum(len(v) for v in self._values.values())
        #: invalid samples drawn again in one ask (see REDRAW_CHOICES)
        self._redraws = max(1, MAX_INVALID_REDRAWS * REDRAW_CHOICES // max(values, REDRAW_CHOICES))
        self._directions = [o.direction for o in space.objectives]
        with _quiet():
            self._sampler = self._make_sampler()
            self._study = optuna.create_study(
                storage=optuna.storages.InMemoryStorage(),
                sampler=self._sampler,
                directions=self._directions,
            )
        self._worst: list[float | None] = [None] * len(self._directions)
        guide = PriorGuide(space, self._rng, memory_hint)
        #: the structured start (knob-semantics prior), when on
        self._guide: PriorGuide | EstimateGuide | None = guide if prior and guide.enabled else None
        if self._guide is None and not prior:
            # without the prior: the cost model's speed estimate, where there is one
            estimate = EstimateGuide(space, speed_hint, guide)
            self._guide = estimate if estimate.enabled else None
        #: the memory reasoning of the sampler's fit check, with or without the start
        self._memory = guide
        self._n_prior = space.agent.n_startup_trials
        self._prior_pending: set[str] = set()
        self._start_count = 1 + len(space.agent.warm_start)
        #: random start-up trials proposed after the estimate's picks (estimate start only)
        self._random_starts = 0
        #: the structured start ended early: no valid candidate within the checks that
        #: MAX_CONSTRAINT_WORK allows
        self._start_over = False

    # --- sampler ---------------------------------------------------------------------------
    def _make_sampler(self) -> optuna.samplers.BaseSampler:  # pragma: no cover - abstract
        raise NotImplementedError

    def _constraint_kwargs(self) -> dict[str, Any]:
        return {} if _NEW_CONSTRAINTS else {"constraints_func": _constraints_func}

    # --- hooks -----------------------------------------------------------------------------
    def _suggest(self) -> tuple[dict[str, Any], Any] | None:
        if self._prior_active():
            assert self._guide is not None
            check = self._start_check()
            c = self._guide.propose(
                self._observations, self._prior_candidates(), self._seen, check
            )
            if c is None and check is not None and check.spent:
                self._start_over = True
            if c is None and isinstance(self._guide, EstimateGuide):
                # the estimate's picks are over: the rest of the start-up trials are random
                # samples, as without the estimate
                c = self._random_unseen(accept=self._fit_check())
                self._random_starts += c is not None
            if c is not None:
                trial = self._fixed(c)
                self._prior_pending.add(params_key(c))
                return c, trial
        last: dict[str, Any] | None = None
        unfit: dict[str, Any] | None = None
        fit_check = self._fit_check()
        with _quiet():
            tries = invalid = 0
            while tries <= self.max_retries:
                trial = self._study.ask()
                params = self._sample(trial)
                key = params_key(params)
                if key not in self._seen and not self._is_valid(params):
                    # breaks a rule: never proposed, never drawn again, and not told to the
                    # sampler as an objective value (the rules, not the model, know it)
                    self._seen.add(key)
                    self._study.tell(trial, state=TrialState.FAIL)
                    last = params
                    invalid += 1
                    if invalid <= self._redraws:
                        continue
                    break
                tries += 1
                if key not in self._seen:
                    if fit_check is None or fit_check(params):
                        return params, trial
                    unfit = unfit or params
                self._study.tell(trial, state=TrialState.FAIL)
                last = params
        # the sampler repeats itself (or only draws what cannot fit): a move from its last
        # draw, else a random configuration, that fits if one does
        alt = self._neighbor_unseen(last, fit_check) if last is not None else None
        if alt is None or (fit_check is not None and not fit_check(alt)):
            alt = self._random_unseen(accept=fit_check) or alt or unfit
        if alt is None:
            return None
        return alt, self._fixed(alt)

    def _start_check(self) -> _StartCheck | None:
        """The validity check of one structured-start proposal (None: no rules given)."""
        return None if self.valid is None else _StartCheck(self.valid)

    def _fit_check(self) -> Callable[[Mapping[str, Any]], bool] | None:
        """Whether a sample is worth a trial memory-wise: once an OOM was measured (or with a
        memory hint), a sample that the memory reasoning of :class:`PriorGuide` (the knobs'
        memory order, used with or without the structured start) gives under
        :data:`P_SKIP` of fitting
        (larger than a measured OOM on some memory knob and no smaller on any, or predicted
        by the memory hint far above the GPU) is drawn again, up to ``max_retries`` times, then
        replaced by an unseen neighbour or random configuration that may fit; only when no
        unseen configuration may fit is one that cannot taken."""
        guide = self._memory
        fits, ooms, cap = guide.memory_evidence(self._observations)
        if not ooms and guide.hint is None:
            return None
        return lambda p: guide.p_fits(p, fits, ooms, cap, strict=True) >= P_SKIP

    def _fixed(self, params: dict[str, Any]) -> Any:
        with _quiet():
            self._study.enqueue_trial(self.active_params(params))
            trial = self._study.ask()
            got = self._sample(trial)
        if params_key(got) != params_key(params):  # pragma: no cover - Optuna contract
            raise RuntimeError(f"enqueued {params} but Optuna suggested {got}")
        return trial

    def _sample(self, trial: Trial) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self._order:
            if self.space.knobs[name].when and not self.space.is_active(name, out):
                continue
            out[name] = trial.suggest_categorical(name, self._dists[name].choices)
        return canonical(self.space, out)

    def _finish(self, handle: Any, params: dict[str, Any], feedback: Feedback) -> None:
        self._prior_pending.discard(params_key(params))
        trial: Trial = handle
        state, values, violation = self._translate(feedback)
        with _quiet():
            if state == TrialState.COMPLETE:
                if _NEW_CONSTRAINTS:
                    trial.set_constraint(_CONSTRAINT, violation)
                else:
                    trial.set_user_attr(_VIOLATION_ATTR, violation)
                self._study.tell(trial, values=values)
            else:
                self._study.tell(trial, state=TrialState.FAIL)

    def _record(self, params: dict[str, Any], feedback: Feedback) -> None:
        state, values, violation = self._translate(feedback)
        active = self.active_params(params)
        kwargs: dict[str, Any] = {
            "state": state,
            "params": active,
            "distributions": {n: self._dists[n] for n in active},
        }
        if state == TrialState.COMPLETE:
            kwargs["values"] = values
            if _NEW_CONSTRAINTS:
                kwargs["constraints"] = {_CONSTRAINT: violation}
            else:
                kwargs["user_attrs"] = {_VIOLATION_ATTR: violation}
                kwargs["system_attrs"] = {"constraints": (violation,)}
        with _quiet():
            self._study.add_trial(optuna.trial.create_trial(**kwargs))

    # --- feedback --------------------------------------------------------------------------
    def _translate(self, fb: Feedback) -> tuple[TrialState, list[float] | None, float]:
        """(state, values, constraint violation) for a feedback (see the module docstring)."""
        cap = _capacity(self.space, fb.metrics)
        if fb.state in MEASURED_STATES:  # a pruned trial's figure is measured too
            assert fb.values is not None
            values = [float(v) for v in fb.values]
            if not all(math.isfinite(v) for v in values):
                return TrialState.FAIL, None, 0.0
            for i, v in enumerate(values):
                w = self._worst[i]
                if w is None or (v < w if self._directions[i] == "maximize" else v > w):
                    self._worst[i] = v
            mem = _num_metric(fb.metrics, "peak_mem_gib")
            violation = min(0.0, mem / cap - 1.0) if mem is not None and cap else 0.0
            return TrialState.COMPLETE, values, violation
        if fb.state == "infeasible":
            values = [
                w if w is not None else self._unseen_placeholder(i, fb.metrics)
                for i, w in enumerate(self._worst)
            ]
            return TrialState.COMPLETE, values, _violation(fb, cap)
        return TrialState.FAIL, None, 0.0

    def _unseen_placeholder(self, i: int, metrics: Mapping[str, Any]) -> float:
        if self._directions[i] == "maximize":
            return 0.0
        v = _num_metric(metrics, self.space.objectives[i].metric)
        return v if v is not None else 0.0

    # --- structured start ------------------------------------------------------------------
    def _prior_active(self) -> bool:
        if self._guide is None or self._start_over:
            return False
        if isinstance(self._guide, EstimateGuide):
            # its picks, then random start-up trials: n_startup_trials in all
            return self._random_starts + self._guide.n_picks < self._n_prior
        launched = sum(
            1 for ob in self._observations if ob.feedback.failure_class not in REJECTION_KINDS
        )
        return launched + len(self._prior_pending) < self._start_count + self._n_prior

    def _prior_candidates(self) -> Iterator[dict[str, Any]]:
        every = self.all_configs() if self.space.size() <= ENUMERATE_LIMIT // 4 else None
        if every is not None:
            yield from every
            return
        # a large space: moves of one or two knobs from the best so far (and, with the
        # prior, the ideal configuration and moves from it), and random configurations
        assert self._guide is not None
        done = [ob for ob in self._observations if ob.feedback.measured]
        sign = 1.0 if self.space.objective.direction == "maximize" else -1.0
        inc = (
            max(done, key=lambda ob: sign * float((ob.feedback.values or (0.0,))[0])).params
            if done
            else self.space.baseline()
        )
        roots = [inc]
        if isinstance(self._guide, PriorGuide):
            ideal = self._guide.ideal(inc)
            yield ideal
            roots.append(ideal)
        for root in roots:
            yield from self._bounded_moves(root)
        # the estimate looks wider without an ideal
        for _ in range(min(512, self._move_budget()) * (3 - len(roots))):
            yield self._random_config()

    def _move_budget(self) -> int:
        """Candidates looked at per root of the structured start (see :data:`MAX_MOVES`)."""
        return MAX_MOVES * 8 // max(8, len(self.space.knobs))

    def _bounded_moves(self, root: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """The one- and two-knob moves from ``root``: all of them while they fit the budget
        (:meth:`_move_budget`), else a sample of that many (see :data:`MAX_MOVES`)."""
        values = self._values
        budget = self._move_budget()
        m = sum(len(v) - 1 for v in values.values())
        if m * (m + 1) <= budget:
            yield from self._moves(root, depth=2)
            return
        import random

        rng = random.Random(f"{self.seed}:{params_key(root)}")  # the same sample each time
        near: dict[str, list[Any]] = {}
        for name, vals in values.items():
            others = [i for i, v in enumerate(vals) if v != root[name]]
            if len(others) > 3 * NEAR_VALUES:
                at = next((i for i, v in enumerate(vals) if v == root[name]), 0)
                close = sorted(others, key=lambda i: abs(i - at))[: 2 * NEAR_VALUES]
                rest = sorted(set(others) - set(close))
                others = sorted(close + rng.sample(rest, NEAR_VALUES))
            if others:
                near[name] = [vals[i] for i in others]
        singles = [(name, v) for name, vs in near.items() for v in vs]
        rng.shuffle(singles)
        firsts: list[dict[str, Any]] = []
        for name, v in singles[: max(1, budget // 2)]:
            p = canonical(self.space, {**root, name: v})
            firsts.append(p)
            yield p
        names = list(near)
        for _ in range(budget - len(firsts)):
            p = rng.choice(firsts)
            name = rng.choice(names)
            v = rng.choice(near[name])
            if v != p[name]:
                yield canonical(self.space, {**p, name: v})

    def _moves(self, root: Mapping[str, Any], depth: int) -> Iterator[dict[str, Any]]:
        for name, spec in self.space.knobs.items():
            for v in spec.values():
                if v == root[name]:
                    continue
                p = canonical(self.space, {**root, name: v})
                yield p
                if depth > 1:
                    yield from self._moves(p, depth - 1)


class _StartCheck:
    """The validity rules for one structured-start proposal: each candidate is checked once
    (sampled moves repeat), until the checks have evaluated :data:`MAX_CONSTRAINT_WORK`
    nodes of constraints; past that a candidate counts as invalid and :attr:`spent` is set."""

    def __init__(self, valid: Callable[[Mapping[str, Any]], bool]) -> None:
        self._valid = valid
        self._since = evaluated_nodes()
        self._checked: dict[str, bool] = {}
        #: a candidate was refused unchecked: the limit was reached
        self.spent = False

    def __call__(self, params: Mapping[str, Any]) -> bool:
        key = params_key(params)
        ok = self._checked.get(key)
        if ok is None:
            if evaluated_nodes() - self._since >= MAX_CONSTRAINT_WORK:
                self.spent = True
                return False
            ok = self._checked[key] = self._valid(params)
        return ok


def _num_metric(metrics: Mapping[str, Any], key: str) -> float | None:
    return finite(metrics.get(key))


def _capacity(space: SearchSpace, metrics: Mapping[str, Any]) -> float | None:
    cap = _num_metric(metrics, "gpu_memory_gib")
    return cap if cap else space.resources.gpu_memory_gib


def _violation(fb: Feedback, cap: float | None) -> float:
    if fb.failure_class in OOM_CLASSES:
        mem = None
        for key in ("predicted_peak_mem_gib", "predicted_mem_gib", "peak_mem_gib"):
            mem = _num_metric(fb.metrics, key)
            if mem is not None:
                break
        over = max(0.0, mem / cap - 1.0) if mem is not None and cap else 0.0
        return 0.1 + over
    return 1.0


class TPEAgent(OptunaAgent):
    """Optuna's TPE: multivariate, grouped when the space has conditional knobs, constant liar
    (parallel asks), constrained; ``space.agent.n_startup_trials`` start-up trials."""

    name = "tpe"
    # A repeated sample sits in the region TPE believes best; an unseen neighbor of it is
    # as good a proposal as a second full draw (measured on the bench tables) at a fraction
    # of the cost, which keeps ask() fast with a long history.
    default_retries = 0

    def _make_sampler(self) -> optuna.samplers.BaseSampler:
        conditional = any(spec.when for spec in self.space.knobs.values())
        return optuna.samplers.TPESampler(
            seed=self.seed,
            n_startup_trials=self.space.agent.n_startup_trials,
            multivariate=True,
            group=conditional,  # decomposes a conditional space; pure cost without one
            constant_liar=True,
            **self._constraint_kwargs(),
        )


class GPAgent(OptunaAgent):
    """Optuna's Gaussian-process sampler (logEI, with P(feasible) from the constraint).
    Needs scipy and torch (CPU is enough)."""

    name = "gp"
    # A discarded sample leaves the GP's data unchanged, so drawing again mostly returns the
    # same point at the price of another fit: go straight to an unseen neighbor instead.
    default_retries = 0

    def _make_sampler(self) -> optuna.samplers.BaseSampler:
        missing = [m for m in ("scipy", "torch") if importlib.util.find_spec(m) is None]
        if missing:
            raise DSEError(
                f"the gp agent needs {' and '.join(missing)} (for Optuna's GPSampler); install "
                "it (torch: the CPU build is enough) or choose agent tpe"
            )
        kwargs = self._constraint_kwargs()
        return optuna.samplers.GPSampler(
            seed=self.seed,
            n_startup_trials=self.space.agent.n_startup_trials,
            warn_independent_sampling=False,
            **kwargs,
        )


class NSGA2Agent(OptunaAgent):
    """Optuna's NSGA-II for one or two objectives (e.g. TFLOP/s up, peak memory down); a small
    population so that generations turn over within a GPU budget."""

    name = "nsga2"
    population_size = 8

    def _make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.NSGAIISampler(
            seed=self.seed,
            population_size=self.population_size,
            **self._constraint_kwargs(),
        )
