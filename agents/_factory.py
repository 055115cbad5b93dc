"""``create_agent``: the agent a space file names, from a registry that loads lazily.

The Optuna agents' module (and Optuna itself) is imported only when one of them is asked
for, so ``import dse.agents`` (the ask/tell interface) stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from dse.agents._base import MemoryHint, SpeedHint
from dse.agents._common import SpaceAgent
from dse.records import AgentName
from dse.space import SearchSpace

__all__ = ["AGENTS", "agent_class", "create_agent"]

#: ``space.agent.name`` -> (module, class name, whether it takes the prior and memory hint).
_REGISTRY: dict[AgentName, tuple[str, str, bool]] = {
    "tpe": ("dse.agents._optuna", "TPEAgent", True),
    "gp": ("dse.agents._optuna", "GPAgent", True),
    "nsga2": ("dse.agents._optuna", "NSGA2Agent", True),
    "random": ("dse.agents._simple", "RandomAgent", False),
    "grid": ("dse.agents._simple", "GridAgent", False),
}


def agent_class(name: str) -> type[SpaceAgent]:
    """The class of agent ``name`` (its module imported now).

    Raises:
        KeyError: no agent has that name (the message lists the known ones).
    """
    try:
        module, cls, _ = _REGISTRY[name]  # type: ignore[index]
    except KeyError:
        raise KeyError(f"unknown agent {name!r}; known agents: {sorted(_REGISTRY)}") from None
    out: type[SpaceAgent] = getattr(importlib.import_module(module), cls)
    return out


class _Agents(Mapping[str, type[SpaceAgent]]):
    """Read-only ``name -> agent class``; a class is imported when it is looked up."""

    def __getitem__(self, name: str) -> type[SpaceAgent]:
        return agent_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __contains__(self, name: object) -> bool:
        return name in _REGISTRY


#: ``space.agent.name`` -> agent class (lazy: iterating names imports nothing).
AGENTS: Mapping[str, type[SpaceAgent]] = _Agents()


def create_agent(
    space: SearchSpace,
    memory_hint: MemoryHint | None = None,
    speed_hint: SpeedHint | None = None,
) -> SpaceAgent:
    """The agent ``space.agent.name`` names, seeded with ``space.agent.seed``.

    ``memory_hint`` (see :data:`MemoryHint`) goes to the model-based agents' structured start
    and fit check; ``speed_hint`` (see :data:`SpeedHint`) to their start without the prior
    (``agent.prior: false``), when ``agent.estimate`` is on.
    """
    name = space.agent.name
    try:
        cls = agent_class(name)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    if _REGISTRY[name][2]:
        return cls(  # type: ignore[call-arg]
            space,
            seed=space.agent.seed,
            prior=space.agent.prior,
            memory_hint=memory_hint,
            speed_hint=speed_hint if space.agent.estimate else None,
        )
    return cls(space, seed=space.agent.seed)  # type: ignore[call-arg]
