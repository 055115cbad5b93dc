"""Between an agent and the runner: screen proposals before a GPU is spent on them.

:class:`Proposer` asks the agent, rejects proposals that break a validity rule
(:func:`dse.model.rules.check`) or that a pre-screen (the cost model) predicts will run out of
memory, answers proposals already measured from what was measured, and hands back only
launchable ones. Every rejection and every duplicate is told to the agent, so it learns the
boundary and never proposes the same configuration again. Used by the study loop and by
``dse bench``. Pure Python: no storage, no runner.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from dse.agents import BaseAgent, Feedback, MemoryHint, Proposal, SpeedHint
from dse.core.records import (
    ESTIMATE_WORKLOADS,
    OOM_CLASSES,
    SPEED_METRICS,
    FinishedState,
    Outcome,
    RejectionKind,
    finite,
)
from dse.model.rules import check, is_valid
from dse.space.searchspace import SearchSpace, params_key

__all__ = [
    "Census",
    "ENUMERABLE_MAX",
    "Proposer",
    "Proposed",
    "Screened",
    "Rejection",
    "Duplicate",
    "Prescreen",
    "Lookup",
    "feedback_from_outcome",
    "cost_model_prescreen",
    "cost_model_memory_hint",
    "cost_model_speed_hint",
    "UNCALIBRATED_SD",
]

#: ``prescreen(params) -> (failure_class, reason, metrics)`` to reject, None to pass.
Prescreen = Callable[[dict[str, Any]], "tuple[RejectionKind, str, dict[str, Any]] | None"]
#: ``lookup(params_key) -> Outcome`` of a configuration already measured, or None.
Lookup = Callable[[str], "Outcome | None"]

#: Rejections + duplicates in one :meth:`Proposer.propose` call before it hands control back
#: (the study loop polls its trials, then asks again).
MAX_REJECTIONS = 50
#: Calls in a row that hit :data:`MAX_REJECTIONS` without a launchable proposal before the
#: proposer declares the space spent (the agent cannot find a valid configuration).
MAX_STALLED_CALLS = 10
#: Seconds between progress lines while one call keeps rejecting.
PROGRESS_EVERY_S = 2.0
#: A space of at most this many knob combinations is enumerated before the agent is first
#: asked (every configuration through the rules and the pre-screen: a fraction of a
#: second for a few hundred), so that one with nothing launchable is said at once instead of
#: after rounds of rejected proposals (CloudAI's DeepSeek-V3 grid: 192 combinations, 4
#: valid, all predicted out of memory).
ENUMERABLE_MAX = 2048
#: How often a waiting ``ask`` looks whether the study was told to stop (seconds).
STOP_POLL_S = 0.2
#: A call that took this long says so when it returns (a slow sampler is not a hang).
SLOW_CALL_S = 5.0
#: While one call runs this long without a progress line (a sampler that fits a model for
#: every ask: the GP on 16 knobs took tens of seconds per ask on a loaded machine), a line says
#: the agent is still at work, again after as long.
ASK_HEARTBEAT_S = 10.0


@dataclass(frozen=True)
class Screened:
    """A proposal that passed the screen: launch it, then tell ``trial_id``'s outcome."""

    trial_id: str
    params: dict[str, Any]
    params_key: str

    @property
    def proposal(self) -> Proposal:
        return Proposal(self.trial_id, self.params)


@dataclass(frozen=True)
class Rejection:
    """A proposal rejected before launch.

    Attributes:
        kind: ``invalid`` (a validity rule) or ``predicted_oom`` (the pre-screen).
        rule: the rule's name (the first one broken), or ``prescreen`` for the pre-screen.
        reason: a message naming the rule(s) and the values involved.
        values: the values the (first) rule names, or the pre-screen's metrics.
    """

    params: dict[str, Any]
    params_key: str
    kind: RejectionKind
    rule: str
    reason: str
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Census:
    """An enumerable space through the rules and the pre-screen (:meth:`Proposer.census`).

    Attributes:
        combinations: the knob combinations (``space.size()``).
        configurations: the distinct configurations they make (conditions applied).
        invalid: configurations breaking a rule, by the first rule broken.
        predicted_oom: valid configurations the pre-screen predicts out of memory.
        launchable: the ``params_key`` of every other configuration.
    """

    combinations: int
    configurations: int
    invalid: dict[str, int]
    predicted_oom: int
    launchable: tuple[str, ...]

    def left(self, lookup: Lookup | None) -> list[str]:
        """The launchable configurations not measured yet (``lookup``: None when a
        configuration may run again)."""
        if lookup is None:
            return list(self.launchable)
        return [k for k in self.launchable if lookup(k) is None]

    def nothing_left_message(self, measured: bool) -> str:
        valid = self.configurations - sum(self.invalid.values())
        rules = ", ".join(f"{r} {n}" for r, n in sorted(self.invalid.items(), key=lambda x: -x[1]))
        text = (
            f"0 launchable configurations: of the space's {self.configurations} "
            f"configurations ({self.combinations} knob combinations, all checked), "
            f"{valid} pass the rules" + (f" (the others break {rules})" if rules else "")
        )
        if self.predicted_oom:
            text += f", {self.predicted_oom} of them predicted out of memory (cost-model estimate)"
        if self.launchable and measured:
            text += f", and the remaining {len(self.launchable)} already measured"
        return text + (
            "; nothing is left to ask the agent for: widen the knobs, relax the memory "
            "(prescreen.margin, more GPUs) or declare derived settings (dse validate "
            "counts the valid configurations)"
        )


@dataclass(frozen=True)
class Duplicate:
    """A proposal equal to a measured configuration: answered from ``outcome``, not run."""

    params: dict[str, Any]
    params_key: str
    outcome: Outcome


@dataclass(frozen=True)
class Proposed(Sequence[Screened]):
    """What one :meth:`Proposer.propose` call produced (a sequence of the launchable ones).

    Attributes:
        proposals: launchable proposals, at most the ``n`` asked for.
        rejections: proposals rejected before launch in this call.
        duplicates: proposals answered from an earlier measurement in this call.
        exhausted: the agent has nothing left to propose, or :data:`MAX_STALLED_CALLS` calls
            in a row found nothing launchable.
        capped: this call stopped at the rejection cap.
        message: why nothing launchable came back (cap or exhaustion), for the user.
    """

    proposals: tuple[Screened, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    duplicates: tuple[Duplicate, ...] = ()
    exhausted: bool = False
    capped: bool = False
    message: str = ""

    @overload
    def __getitem__(self, i: int) -> Screened: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Screened]: ...
    def __getitem__(self, i: int | slice) -> Screened | Sequence[Screened]:
        return self.proposals[i]

    def __len__(self) -> int:
        return len(self.proposals)

    def __iter__(self) -> Iterator[Screened]:
        return iter(self.proposals)


def feedback_from_outcome(space: SearchSpace, outcome: Outcome) -> Feedback:
    """The agent's view of a trial outcome.

    * ``ok`` -> ``complete`` with one value per ``space.objectives`` (in order) taken from
      ``outcome.metrics``; ``tokens_per_s_per_gpu`` is derived from ``step_time_s`` when
      missing. An ok outcome without a finite objective value -> ``failed`` (``error``).
      A pruned trial (stopped early as dominated) -> ``pruned`` with its measured values,
      which agents take as they take a complete trial's (its figure is a measurement, if a
      shorter one: Optuna's pruned trials keep their last value the same way).
    * ``infeasible`` (``invalid``, ``predicted_oom``, ``oom``, ``unschedulable``) ->
      ``infeasible`` with the outcome's metrics (the GPU capacity is added as
      ``gpu_memory_gib`` when the space knows it, so OOMs can be scaled by peak vs capacity).
    * ``failed`` (``error``, ``timeout``, ``hang``, ``nan``, ``interrupted``, ``node_fail``,
      ``preempted``, ``cancelled``) -> ``failed``.
    """
    metrics = dict(outcome.metrics)
    if outcome.ok:
        values: list[float] = []
        for obj in space.objectives:
            v = _metric(space, metrics, obj.metric)
            if v is None:
                return Feedback("failed", metrics=metrics, failure_class="error")
            values.append(v)
        state: FinishedState = "pruned" if outcome.pruned else "complete"
        return Feedback(state, values=tuple(values), metrics=metrics)
    if outcome.status == "infeasible":
        cap = space.resources.gpu_memory_gib
        if cap is not None and outcome.failure_class in OOM_CLASSES:
            metrics.setdefault("gpu_memory_gib", cap)
        return Feedback("infeasible", metrics=metrics, failure_class=outcome.failure_class)
    return Feedback("failed", metrics=metrics, failure_class=outcome.failure_class or "error")


def cost_model_prescreen(space: SearchSpace, cost_model: Any) -> Prescreen | None:
    """The pre-screen of a cost model (``fits(params, margin)``, ``margin(initial)``): a
    configuration predicted above the GPU's memory by more than the margin is rejected as
    ``predicted_oom``. None when the space turns it off or knows no GPU memory."""
    cap = space.resources.gpu_memory_gib
    if cost_model is None or not space.prescreen.enabled or cap is None:
        return None

    # The sim answers from this very memory model: a margin for its uncertainty would only
    # let through configurations the sim then reports as out of memory.
    exact = space.workload.name in ESTIMATE_WORKLOADS
    usable = float(getattr(cost_model, "usable_gib", None) or cap)

    def screen(params: dict[str, Any]) -> tuple[RejectionKind, str, dict[str, Any]] | None:
        margin = 0.0 if exact else float(cost_model.margin(space.prescreen.margin))
        ok, pred = cost_model.fits(space.full_params(params), margin)
        if ok:
            return None
        return (
            "predicted_oom",
            f"predicted peak {pred:.1f} GiB > {usable:.1f} GiB usable of {cap:.1f} GiB x "
            f"(1 + margin {margin:.2f}) (cost-model estimate)",
            {"predicted_peak_mem_gib": round(float(pred), 3), "margin": round(margin, 4)},
        )

    return screen


#: Relative uncertainty of the cost model's memory prediction before any calibration (its
#: uncalibrated median error on measured tables is a few percent, its worst near 12%).
UNCALIBRATED_SD = 0.10


def cost_model_memory_hint(space: SearchSpace, cost_model: Any) -> MemoryHint | None:
    """The memory hint (:data:`dse.agents.MemoryHint`) of a cost model: its predicted peak
    of a configuration, with a relative uncertainty of :data:`UNCALIBRATED_SD` until a
    trial ran, then 1.5x the calibrated model's median error on the trials that ran (at
    least 3%). None without a cost model or a known GPU memory. Unlike the pre-screen it
    works whether or not the pre-screen is on."""
    if cost_model is None or space.resources.gpu_memory_gib is None:
        return None

    def hint(params: Any) -> tuple[float, float] | None:
        try:
            pred = float(cost_model.predict_memory(space.full_params(params)).total_gib)
        except (KeyError, ValueError, ArithmeticError):
            return None
        err = cost_model.peak_error
        sd = UNCALIBRATED_SD if err is None else max(0.03, 1.5 * float(err))
        return pred, sd

    return hint


def cost_model_speed_hint(space: SearchSpace, cost_model: Any) -> SpeedHint | None:
    """The speed hint (:data:`dse.agents.SpeedHint`) of a cost model: its estimate of the
    study's first objective (TFLOP/s per GPU, tokens/s per GPU or step time) for a
    configuration. None without a cost model or for an objective it does not estimate."""
    metric = space.objective.metric
    if cost_model is None or metric not in SPEED_METRICS:
        return None

    def hint(params: Any) -> float | None:
        try:
            est = cost_model.estimate_throughput(space.full_params(params))
        except (KeyError, ValueError, ArithmeticError):
            return None
        return _metric(space, est, metric)

    return hint


def _metric(space: SearchSpace, metrics: dict[str, Any], name: str) -> float | None:
    v = metrics.get(name)
    if v is None and name == "tokens_per_s_per_gpu":
        st = metrics.get("step_time_s")
        if isinstance(st, int | float) and st > 0:
            sem = space.semantics
            v = sem.global_batch_size * sem.seq_length / st / space.resources.world_size
    return finite(v)


class Proposer:
    """Asks an agent for proposals and screens them (rules, pre-screen, measured duplicates).

    Args:
        space: the search space.
        agent: the agent to ask and tell.
        features: optional software present where trials run (None: unknown; the feature
            rule is then left to the trial).
        prescreen: ``prescreen(params) -> (failure_class, reason, metrics) | None`` with the
            proposal's knob values (e.g. the cost model:
            ``('predicted_oom', 'predicted 150.2 GiB > 139.8 GiB', {...})``).
        max_rejections: rejections + duplicates in one call before it stops asking.
        on_reject: called with each rejection as it happens (the study stores and shows it).
        on_progress: called with a progress line every :data:`PROGRESS_EVERY_S` seconds
            while one call keeps rejecting, every :data:`ASK_HEARTBEAT_S` seconds while one
            call runs without another line (from a helper thread), and with the message of a
            capped call.
        stopping: asked before each ``ask`` of the agent; True (the study was told to stop: a
            signal, a stop request) ends the call at once with what it has.

    Proposals are screened in their canonical form (``space.canonical``: inactive
    and inert knobs at their baseline, derived settings applied), so a configuration that
    only differs in a knob Megatron ignores is a duplicate. An agent that can take the
    rules (``set_validity``) gets them, to sample within them.
    """

    def __init__(
        self,
        space: SearchSpace,
        agent: BaseAgent,
        features: Iterable[str] | None,
        prescreen: Prescreen | None = None,
        *,
        max_rejections: int = MAX_REJECTIONS,
        max_stalled_calls: int = MAX_STALLED_CALLS,
        on_reject: Callable[[Rejection], None] | None = None,
        on_progress: Callable[[str], None] | None = None,
        stopping: Callable[[], bool] | None = None,
    ) -> None:
        self.space = space
        self.agent = agent
        self.stopping = stopping
        self.features = None if features is None else set(features)
        self.prescreen = prescreen
        self.max_rejections = max_rejections
        self.max_stalled_calls = max_stalled_calls
        self.on_reject = on_reject
        self.on_progress = on_progress
        self._stalled = 0
        self._said = time.monotonic()  # when the last progress line was said
        self._baseline_key: str | None = None
        #: every rejection made by this proposer, in order
        self.rejections: list[Rejection] = []
        #: every duplicate answered from an earlier measurement, in order
        self.duplicates: list[Duplicate] = []
        #: the enumerated space (:meth:`census`), made at the first call
        self._census: Census | None = None
        self._census_done = False
        set_validity = getattr(agent, "set_validity", None)
        if callable(set_validity):
            set_validity(self.is_valid)

    def is_valid(self, params: Mapping[str, Any]) -> bool:
        """Whether a configuration passes the validity rules (what the agent samples in)."""
        return is_valid(self.space, params, self.features)

    def propose(self, n: int, lookup: Lookup | None = None) -> Proposed:
        """Up to ``n`` launchable proposals (fewer when the agent is spent or the cap is hit).

        ``lookup(params_key)`` returns the outcome of an earlier measurement of the same
        configuration (or None); when ``space.budget.repeats`` is False such a proposal is
        answered with that outcome and not launched.
        """
        launch: list[Screened] = []
        rejected: list[Rejection] = []
        dups: list[Duplicate] = []
        exhausted = capped = False
        message = ""
        t0 = last = time.monotonic()
        census = self.census()
        if census is not None:
            left = census.left(lookup if not self.space.budget.repeats else None)
            if not left:
                message = census.nothing_left_message(lookup is not None)
                self._say(message)
                return Proposed((), (), (), True, False, message)

        def still() -> str:
            return (
                f"agent searching: the {self.agent.name} agent is still proposing "
                f"({time.monotonic() - t0:.0f} s in this call, {len(rejected)} rejected, "
                f"{len(launch)} launchable so far)"
            )

        with self._heartbeat(still):
            while len(launch) < n:
                if self.stopping is not None and self.stopping():
                    break  # a stop between proposals: no more asking
                if len(rejected) + len(dups) >= self.max_rejections:
                    capped = True
                    break
                props = self._ask(n - len(launch))
                if props is None:
                    break  # told to stop while the agent was asking: its answer is dropped
                if not props:
                    exhausted = True
                    message = "the agent has no configuration left to propose"
                    break
                for prop in props:
                    s = self._screen(prop, lookup, rejected, dups)
                    if s is not None:
                        launch.append(s)
                now = time.monotonic()
                if rejected and self.on_progress is not None and now - last >= PROGRESS_EVERY_S:
                    last = now
                    self._say(
                        f"agent searching: {len(rejected)} proposals rejected in "
                        f"{now - t0:.1f} s ({_tally(rejected)}), {len(launch)} launchable so far"
                    )
        self.duplicates.extend(dups)
        took = time.monotonic() - t0
        if self.on_progress is not None and took >= SLOW_CALL_S and not capped:
            self._say(
                f"agent asked: {len(launch)} launchable in {took:.1f} s"
                + (f" ({len(rejected)} rejected: {_tally(rejected)})" if rejected else "")
            )
        if launch:
            self._stalled = 0
        elif capped:
            self._stalled += 1
            message = (
                f"{len(rejected) + len(dups)} proposals in a row were rejected before launch "
                f"({_tally(rejected)}{', ' if rejected and dups else ''}"
                f"{f'{len(dups)} already measured' if dups else ''})"
            )
            if rejected and len(rejected) >= len(dups):
                message += (
                    ": most of this space breaks the rules; declare derived settings "
                    "(derived:), narrow the knobs or add constraints (dse validate counts "
                    "the valid configurations)"
                )
            if self._stalled >= self.max_stalled_calls:
                exhausted = True
                message += (
                    f"; stopped asking after {self._stalled} such rounds "
                    f"({self._stalled * self.max_rejections} proposals)"
                )
            if self.on_progress is not None:
                self._say(message)
        return Proposed(tuple(launch), tuple(rejected), tuple(dups), exhausted, capped, message)

    def census(self) -> Census | None:
        """The space enumerated through the rules and the pre-screen (made once, at the first
        call), or None when it has more than :data:`ENUMERABLE_MAX` knob combinations."""
        if self._census_done:
            return self._census
        self._census_done = True
        size = self.space.size()
        if size > ENUMERABLE_MAX:
            return None
        invalid: Counter[str] = Counter()
        oom = 0
        launchable: list[str] = []
        configs = 0
        for params in self.space.iter_configs():
            configs += 1
            key = params_key(params)
            broken = check(self.space, params, self.features)
            if broken:
                invalid[broken[0].rule] += 1
                continue
            if (
                self.prescreen is not None
                and not self._is_reference(key)
                and self.prescreen(dict(params)) is not None
            ):
                oom += 1
                continue
            launchable.append(key)
        self._census = Census(size, configs, dict(invalid), oom, tuple(launchable))
        return self._census

    def _ask(self, n: int) -> list[Proposal] | None:
        """``agent.ask(n)``; without a stop check, in this thread. With one, in a helper
        thread that this one watches: a stop while the agent is at work (a GP fit takes
        seconds per ask on a loaded machine) ends the wait within :data:`STOP_POLL_S`
        (None; the agent's answer, when it comes, is dropped with the study's end)."""
        if self.stopping is None:
            return self.agent.ask(n)
        got: list[Any] = []
        done = threading.Event()

        def run() -> None:
            try:
                got.append(("ok", self.agent.ask(n)))
            except BaseException as e:  # noqa: BLE001 - raised again in the caller
                got.append(("error", e))
            finally:
                done.set()

        helper = threading.Thread(target=run, name="dse-agent-ask", daemon=True)
        helper.start()
        while not done.wait(STOP_POLL_S):
            if self.stopping():
                return None
        kind, value = got[0]
        if kind == "error":
            raise value
        return list(value)

    def _say(self, line: str) -> None:
        self._said = time.monotonic()
        if self.on_progress is not None:
            self.on_progress(line)

    @contextlib.contextmanager
    def _heartbeat(self, line: Callable[[], str]) -> Iterator[None]:
        """While the body runs, say ``line()`` once :data:`ASK_HEARTBEAT_S` seconds pass
        without a progress line (a helper thread; the body is the agent's own work)."""
        if self.on_progress is None:
            yield
            return
        stop = threading.Event()
        self._said = time.monotonic()

        def beat() -> None:
            while not stop.wait(min(1.0, ASK_HEARTBEAT_S)):
                if time.monotonic() - self._said >= ASK_HEARTBEAT_S:
                    self._say(line())

        helper = threading.Thread(target=beat, name="dse-agent-heartbeat", daemon=True)
        helper.start()
        try:
            yield
        finally:
            stop.set()
            helper.join()

    def _screen(
        self,
        prop: Proposal,
        lookup: Lookup | None,
        rejected: list[Rejection],
        dups: list[Duplicate],
    ) -> Screened | None:
        params = self.space.canonical(prop.params)
        key = params_key(params)
        violations = check(self.space, params, self.features)
        if violations:
            first = violations[0]
            rej = Rejection(
                params=params,
                params_key=key,
                kind="invalid",
                rule=first.rule,
                reason="; ".join(str(v) for v in violations),
                values=dict(first.values),
            )
            self._rejected(rej, rejected)
            self.agent.tell(
                prop.trial_id,
                Feedback("infeasible", metrics={"rule": first.rule}, failure_class="invalid"),
            )
            return None
        if self.prescreen is not None and not self._is_reference(key):
            verdict = self.prescreen(dict(params))
            if verdict is not None:
                failure_class, reason, metrics = verdict
                self._rejected(
                    Rejection(
                        params=dict(params),
                        params_key=key,
                        kind=failure_class,
                        rule="prescreen",
                        reason=reason,
                        values=dict(metrics),
                    ),
                    rejected,
                )
                out = Outcome.failure(failure_class, reason, metrics=metrics, source="estimate")
                self.agent.tell(prop.trial_id, feedback_from_outcome(self.space, out))
                return None
        if lookup is not None and not self.space.budget.repeats:
            earlier = lookup(key)
            if earlier is not None:
                dups.append(Duplicate(dict(params), key, earlier))
                self.agent.tell(prop.trial_id, feedback_from_outcome(self.space, earlier))
                return None
        return Screened(prop.trial_id, dict(params), key)

    def _is_reference(self, key: str) -> bool:
        """The baseline, with the loss-parity guard on: its loss is the reference of every
        trial, so a prediction never keeps it from running (only a rule does)."""
        if not self.space.loss_parity.enabled:
            return False
        if self._baseline_key is None:
            self._baseline_key = params_key(self.space.baseline())
        return key == self._baseline_key

    def _rejected(self, rej: Rejection, rejected: list[Rejection]) -> None:
        rejected.append(rej)
        self.rejections.append(rej)
        if self.on_reject is not None:
            self.on_reject(rej)


def _tally(rejected: Sequence[Rejection]) -> str:
    """``rule count`` pairs, most frequent first."""
    counts = Counter(r.rule for r in rejected)
    return ", ".join(f"{rule} {n}" for rule, n in counts.most_common(4))
