"""The reads of a study database that :mod:`dse.results` makes, as a shape.

dse.results sits below dse.storage (the layers of pyproject.toml): it names the reads it
needs here, and :class:`dse.storage.StorageReads` (so every ``Storage``) has them; a caller
passes its storage in. mypy checks that the storage fits wherever one is passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from dse.core.records import ConfigStats, TrialRecord
from dse.stats.gpu_figures import GpuTotals

__all__ = ["StudyReads"]


class StudyReads(Protocol):
    """A study database's reads of its trials, attributes and per-configuration figures."""

    def get_study_attrs(self, study_id: int) -> dict[str, Any]: ...

    def get_trial_by_number(
        self, study_id: int, number: int, *, with_steps: bool = True
    ) -> TrialRecord: ...

    def list_trials(self, study_id: int) -> list[TrialRecord]: ...

    def best_trial(self, study_id: int, direction: str) -> TrialRecord | None: ...

    def gpu_totals(self, study_id: int) -> GpuTotals: ...

    def trials_of_configurations(
        self,
        study_id: int,
        params_keys: Sequence[str],
        *,
        state: str | None = None,
        with_steps: bool = False,
    ) -> list[TrialRecord]: ...

    def best_configurations(
        self,
        study_id: int,
        direction: str,
        *,
        limit: int,
        value_range: tuple[float, float] | None = None,
        exclude_changed: bool = False,
    ) -> list[ConfigStats]: ...

    def configuration_stats(
        self,
        study_id: int,
        *,
        params_keys: Sequence[str] | None = None,
        repeated: bool = False,
        value_range: tuple[float, float] | None = None,
        exclude_changed: bool = False,
    ) -> list[ConfigStats]: ...
