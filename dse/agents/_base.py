"""The agent interface: ask/tell keyed by trial id (like ``optuna.Study.ask/tell`` and Ray
Tune's ``Searcher.suggest/on_trial_complete``).

Agents know nothing of GPUs, SQL or HTTP. The study loop checks every proposal against the
validity rules and the cost model; rejected proposals are told back as ``infeasible`` and
never launched. Agent state is rebuilt after a restart by :meth:`BaseAgent.add_evaluated`
from the trials in storage, so storage is the only memory a study needs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dse.core.records import MEASURED_STATES, FailureClass, FinishedState
from dse.space.searchspace import SearchSpace

__all__ = ["BaseAgent", "Proposal", "Feedback", "MemoryHint", "SpeedHint", "Validity"]

#: ``valid(params) -> bool``: whether a configuration (its knob values) passes the validity
#: rules. The proposer hands one to the agent (:meth:`BaseAgent.set_validity`).
Validity = Callable[[Mapping[str, Any]], bool]

#: ``hint(params) -> (predicted peak GiB per GPU, relative standard deviation)`` of a
#: configuration (its knob values), or None when it cannot say. The study loop builds one
#: from the cost model, which it calibrates on every measured trial; an agent may use it to
#: judge whether an unmeasured configuration fits in memory. It is an estimate, never a
#: measurement, and never a reason to skip a configuration on its own.
MemoryHint = Callable[[Mapping[str, Any]], "tuple[float, float] | None"]

#: ``hint(params) -> estimated value of the study's first objective`` (in its own unit, e.g.
#: TFLOP/s per GPU or step seconds) of a configuration, or None when it cannot say. The
#: study loop builds one from the cost model's speed estimate; the model-based agents
#: without the knob-semantics prior order their start-up trials by it. An estimate, never a
#: measurement.
SpeedHint = Callable[[Mapping[str, Any]], "float | None"]


@dataclass(frozen=True)
class Proposal:
    """A configuration the agent wants measured; ``trial_id`` keys the later ``tell``."""

    trial_id: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Feedback:
    """What happened to a proposal.

    Attributes:
        state: ``complete`` (measured, ``values`` set), ``pruned`` (measured, ``values``
            set, but stopped early because it lay clearly below the best: take the values as
            a complete trial's), ``infeasible`` (rules, predicted or measured OOM: the agent
            should learn the boundary), ``failed`` (crash, hang: tells nothing about the
            objective).
        values: objective values in the order of ``space.objectives`` (complete and pruned).
        metrics: measured metrics (``peak_mem_gib`` also for OOM trials).
        failure_class: ``invalid``, ``predicted_oom``, ``oom``, ``error``, ...
    """

    state: FinishedState
    values: tuple[float, ...] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    failure_class: FailureClass | None = None

    @property
    def measured(self) -> bool:
        """A measured trial (``complete`` or ``pruned``) with its objective values."""
        return self.state in MEASURED_STATES and bool(self.values)


class BaseAgent(ABC):
    """Base of every agent.

    Call sequence: ``ask(n)`` returns up to ``n`` proposals, distinct from each other and
    from every configuration already told or evaluated; each is answered exactly once with
    ``tell(trial_id, feedback)``. ``add_evaluated(params, feedback)`` feeds history (warm
    start, restore after restart) without a prior ``ask``. The first proposal of a fresh
    agent is the space's baseline, then the space's ``agent.warm_start`` configurations.
    An agent returns fewer than ``n`` proposals only when the space is exhausted.
    """

    name: str = "base"

    def __init__(self, space: SearchSpace, seed: int | None = None) -> None:
        self.space = space
        self.seed = seed
        #: ``valid(params)``: whether a configuration passes the validity rules (None:
        #: unknown). Set by whoever screens the proposals; an agent samples within it.
        self.valid: Validity | None = None

    def set_validity(self, valid: Validity | None) -> None:
        """Give the agent the validity rules, so it proposes only configurations that pass
        them (the screen still checks every proposal)."""
        self.valid = valid

    @abstractmethod
    def ask(self, n: int = 1) -> list[Proposal]:
        """Up to ``n`` new proposals."""

    @abstractmethod
    def tell(self, trial_id: str, feedback: Feedback) -> None:
        """The outcome of a proposal returned by :meth:`ask`."""

    @abstractmethod
    def add_evaluated(self, params: dict[str, Any], feedback: Feedback) -> None:
        """A configuration evaluated elsewhere (storage, an earlier study)."""
