"""Search agents behind one ask/tell interface (:class:`BaseAgent`).

``create_agent(space)`` builds the agent a space file names (``tpe``, ``gp``, ``nsga2``,
``random``, ``grid``). Agents know nothing of GPUs, SQL or HTTP: the study loop screens
their proposals with the validity rules and the cost model and tells every outcome back;
after a restart their state is rebuilt from storage with :meth:`BaseAgent.add_evaluated`.
"""

from dse.agents._base import BaseAgent, Feedback, MemoryHint, Proposal
from dse.agents._common import Observation, SpaceAgent
from dse.agents._factory import AGENTS, create_agent
from dse.agents._optuna import GPAgent, NSGA2Agent, OptunaAgent, TPEAgent
from dse.agents._simple import GridAgent, RandomAgent

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
    "TPEAgent",
    "create_agent",
]
