"""``create_agent``: the agent a space file names, from the plugin registry.

The agents are the ``agent`` entries of :data:`dse.core.registry.REGISTRY`; an agent's module
(and Optuna, for the Optuna agents) is imported only when that agent is asked for, so
``import dse.agents`` (the ask/tell interface) stays light.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from dse.agents._base import MemoryHint, SpeedHint
from dse.agents._common import SpaceAgent
from dse.core.registry import REGISTRY
from dse.space.searchspace import SearchSpace

__all__ = ["AGENTS", "agent_class", "create_agent"]


def agent_class(name: str) -> type[SpaceAgent]:
    """The class of agent ``name`` (its module imported now).

    Raises:
        SpaceError: no agent has that name (the message lists the known ones).
    """
    out: type[SpaceAgent] = REGISTRY.get("agent", name, "agent.name").load()
    return out


class _Agents(Mapping[str, type[SpaceAgent]]):
    """Read-only ``name -> agent class``; a class is imported when it is looked up."""

    def __getitem__(self, name: str) -> type[SpaceAgent]:
        if ("agent", name) not in REGISTRY:
            raise KeyError(name)
        return agent_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY.names("agent"))

    def __len__(self) -> int:
        return len(REGISTRY.names("agent"))

    def __contains__(self, name: object) -> bool:
        return ("agent", name) in REGISTRY


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

    Raises:
        SpaceError: ``agent.name`` names no agent (the message lists the known ones).
    """
    name = space.agent.name
    plugin = REGISTRY.get("agent", name, "agent.name")
    cls = agent_class(name)
    if "hints" in plugin.traits:
        return cls(  # type: ignore[call-arg]
            space,
            seed=space.agent.seed,
            prior=space.agent.prior,
            memory_hint=memory_hint,
            speed_hint=speed_hint if space.agent.estimate else None,
        )
    return cls(space, seed=space.agent.seed)  # type: ignore[call-arg]
