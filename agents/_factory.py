"""``create_agent``: the agent a space file names."""

from __future__ import annotations

from collections.abc import Callable

from dse.agents._base import MemoryHint
from dse.agents._common import SpaceAgent
from dse.agents._optuna import GPAgent, NSGA2Agent, TPEAgent
from dse.agents._simple import GridAgent, RandomAgent
from dse.space import SearchSpace

__all__ = ["AGENTS", "create_agent"]

#: ``space.agent.name`` -> agent class.
AGENTS: dict[str, Callable[..., SpaceAgent]] = {
    "tpe": TPEAgent,
    "gp": GPAgent,
    "nsga2": NSGA2Agent,
    "random": RandomAgent,
    "grid": GridAgent,
}


def create_agent(space: SearchSpace, memory_hint: MemoryHint | None = None) -> SpaceAgent:
    """The agent ``space.agent.name`` names, seeded with ``space.agent.seed``.

    ``memory_hint`` (see :data:`MemoryHint`) goes to the model-based agents' structured start.
    """
    try:
        cls = AGENTS[space.agent.name]
    except KeyError:
        raise ValueError(
            f"unknown agent {space.agent.name!r}; known agents: {sorted(AGENTS)}"
        ) from None
    if space.agent.name in ("tpe", "gp", "nsga2"):
        return cls(space, seed=space.agent.seed, prior=space.agent.prior, memory_hint=memory_hint)
    return cls(space, seed=space.agent.seed)
