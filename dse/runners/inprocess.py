"""In-process runner: answers each trial at once with a function of its spec.

For ``dse bench`` and tests of the study loop: the loop runs exactly as with real trial
processes, but a trial's outcome comes from ``answer(spec)`` (a measured table, the
simulator) instead of a process, and nothing is written to disk.
"""

from __future__ import annotations

from collections.abc import Callable

from dse.core.exceptions import TrialLaunchError
from dse.core.records import Outcome, TrialSpec
from dse.runners._base import BaseRunner, Finished, Launch

__all__ = ["InProcessRunner"]


class InProcessRunner(BaseRunner):
    """``slots`` trials at once; a submitted trial finishes at the next :meth:`poll`."""

    name = "inprocess"
    uses_files = False

    def __init__(self, answer: Callable[[TrialSpec], Outcome], *, slots: int = 1) -> None:
        self.answer = answer
        self.slots = slots
        self._pending: dict[int, Outcome] = {}

    def free_slots(self) -> int:
        return self.slots - len(self._pending)

    def submit(self, launch: Launch) -> None:
        if launch.spec is None:
            raise TrialLaunchError(f"trial {launch.number}: the in-process runner needs a spec")
        if self.free_slots() <= 0:
            raise RuntimeError("submit() called without a free slot")
        self._pending[launch.trial_id] = self.answer(launch.spec)

    def poll(self) -> list[Finished]:
        done = [Finished(tid, out, 0.0, 1) for tid, out in self._pending.items()]
        self._pending.clear()
        return done

    def running(self) -> list[int]:
        return list(self._pending)

    def stop(self) -> list[int]:
        ids = list(self._pending)
        self._pending.clear()
        return ids

    @property
    def host(self) -> str:
        return "in-process"
