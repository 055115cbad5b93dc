"""Search agents behind one ask/tell interface (:class:`BaseAgent`).

Owns: ``_base`` (``BaseAgent``, the call sequence every agent follows), ``_common``
(``SpaceAgent``: the space as an agent sees it), ``_prior`` (the knob-semantics prior),
``_estimate`` (first trials from the cost model's estimate), ``_optuna`` (TPE, GP, NSGA-II),
``_simple`` (random, grid), ``_factory`` (``create_agent``).

``create_agent(space)`` builds the agent a space file names (``tpe``, ``gp``, ``nsga2``,
``random``, ``grid``). Agents know nothing of GPUs, SQL or HTTP: the study loop screens
their proposals with the validity rules and the cost model and tells every outcome back;
after a restart their state is rebuilt from storage with :meth:`BaseAgent.add_evaluated`.

Importing this package does not import Optuna: the Optuna agents (``OptunaAgent``,
``TPEAgent``, ``GPAgent``, ``NSGA2Agent``) load on first use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dse.agents._base import BaseAgent, Feedback, MemoryHint, Proposal, SpeedHint
from dse.agents._common import Observation, SpaceAgent
from dse.agents._factory import AGENTS, agent_class, create_agent
from dse.agents._simple import GridAgent, RandomAgent

if TYPE_CHECKING:
    from dse.agents._optuna import GPAgent, NSGA2Agent, OptunaAgent, TPEAgent

__all__ = [
    "AGENTS",
    "BaseAgent",
    "Feedback",
    "GPAgent",
    "GridAgent",
    "MemoryHint",
    "NSGA2Agent",
    "Observation",
    "OptunaAgent",
    "Proposal",
    "RandomAgent",
    "SpaceAgent",
    "SpeedHint",
    "TPEAgent",
    "agent_class",
    "create_agent",
]

_LAZY = dict.fromkeys(("GPAgent", "NSGA2Agent", "OptunaAgent", "TPEAgent"), "dse.agents._optuna")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
