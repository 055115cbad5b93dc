"""Model-free agents: uniform random search and an exhaustive grid."""

from __future__ import annotations

from typing import Any

from dse.agents._common import MAX_CONSTRAINT_WORK, VALIDITY_SCAN, SpaceAgent
from dse.core.expr import evaluated_nodes
from dse.space.searchspace import SearchSpace, params_key

__all__ = ["RandomAgent", "GridAgent"]


class RandomAgent(SpaceAgent):
    """Uniform random search without repeats: each knob drawn uniformly from its domain
    (conditional knobs only when active), after the baseline and the warm start."""

    name = "random"


class GridAgent(SpaceAgent):
    """Every distinct canonical configuration of the space, once, after the baseline and
    the warm start, skipping those that break the validity rules it was given: in
    ``space.iter_configs()`` order without a seed, in an order shuffled with the seed
    otherwise (for spaces of more than 200,000 raw combinations the order is always
    ``iter_configs()``'s, which is lazy)."""

    name = "grid"

    def __init__(self, space: SearchSpace, seed: int | None = None) -> None:
        super().__init__(space, seed)
        self._iter: Any = None

    def _configs(self) -> Any:
        if self._iter is None:
            every = self.all_configs() if self.seed is not None else None
            if every is not None:
                order = list(every)
                self._rng.shuffle(order)
                self._iter = iter(order)
            else:
                self._iter = self.space.iter_configs()
        return self._iter

    def _suggest(self) -> tuple[dict[str, Any], Any] | None:
        skipped, since = 0, evaluated_nodes()
        for p in self._configs():
            if params_key(p) in self._seen:
                continue
            spent = evaluated_nodes() - since >= MAX_CONSTRAINT_WORK  # large constraints
            if self._is_valid(p) or skipped >= VALIDITY_SCAN or spent:
                return p, None
            skipped += 1  # breaks a rule: never proposed (a long run of them: handed out)
        return None
