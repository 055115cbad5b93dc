"""The objective value of a trial outcome (what storage keeps as a trial's ``value``)."""

from __future__ import annotations

from dse.core.records import Outcome
from dse.space.searchspace import SearchSpace

__all__ = ["objective_value"]


def objective_value(space: SearchSpace, outcome: Outcome) -> float | None:
    """The primary objective of an ``ok`` outcome (None otherwise)."""
    if not outcome.ok:
        return None
    v = outcome.metrics.get(space.objective.metric)
    return None if v is None else float(v)
