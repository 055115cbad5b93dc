"""What every part of a running study shares: one :class:`StudyContext`.

The controller (:class:`~dse.loop.study.StudyRunner`) builds it once the study's row exists and
hands it to each of its parts (the agent session, the trial dispatcher, the reconciler, the loss
guard), instead of each part taking the same space, storage, study id, features and progress
sink one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dse.space.searchspace import SearchSpace
    from dse.storage import Storage

__all__ = ["StudyContext"]


def _quiet(_message: str) -> None:
    """A progress sink that prints nothing."""


def _never() -> bool:
    """A study that is never told to stop."""
    return False


@dataclass(frozen=True)
class StudyContext:
    """One study, as its controller's parts see it.

    Attributes:
        space: the study's validated space.
        storage: the storage that holds the study.
        study_id: the study's row in ``storage``.
        features: the trial process's features (None: not probed; see
            :func:`dse.workloads.probe_features`).
        progress: one line per event a user should see.
        stopping: whether the controller was told to stop (a signal, a stop request): parts
            that work for long (the agent's proposals) ask it between steps.
    """

    space: SearchSpace
    storage: Storage
    study_id: int
    features: set[str] | None = None
    progress: Callable[[str], None] = _quiet
    stopping: Callable[[], bool] = _never
