"""Who owns a study's running trials, and what happens to those of a controller that died.

Each controller has an :class:`Owner` (host, pid, a random token), stored with every trial it
claims or runs and refreshed by a heartbeat. A :class:`Reconciler` decides whether the owner
of a trial is gone, and if so takes the trial's result from its metrics file or re-queues it,
after killing its process group (only one this installation started for that owner:
:func:`dse.runners.kill_owned_group`).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dse.core.records import Outcome, TrialRecord, read_metrics
from dse.loop.context import StudyContext
from dse.results.objective import objective_value
from dse.runners import kill_owned_group

if TYPE_CHECKING:
    pass

__all__ = ["Owner", "Reconciler", "HEARTBEAT_S", "STALE_S", "SAME_HOST_STALE_S", "pid_alive"]

#: Seconds between heartbeats of a controller's trials.
HEARTBEAT_S = 5.0
#: A trial of another host whose heartbeat is older than this has lost its controller.
STALE_S = 6 * HEARTBEAT_S
#: Same host, owner pid alive: the heartbeat must be this old (pid reused, or an imported row).
SAME_HOST_STALE_S = 12 * HEARTBEAT_S


@dataclass(frozen=True)
class Owner:
    """A controller: its host, process id and a random token (tells apart two controllers
    that had the same pid)."""

    host: str
    pid: int
    token: str

    @classmethod
    def new(cls, host: str) -> Owner:
        return cls(host, os.getpid(), uuid.uuid4().hex[:8])

    @classmethod
    def parse(cls, text: str | None) -> Owner | None:
        """The owner of a stored ``host:pid:token`` (None when it is not one)."""
        if not text:
            return None
        host, sep, rest = text.rpartition(":")
        host, sep2, pid = host.rpartition(":")
        if not sep or not sep2 or not host or not pid.isdigit() or not rest:
            return None
        return cls(host, int(pid), rest)

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}:{self.token}"


def pid_alive(pid: int) -> bool:
    """Whether a process of that id exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


class Reconciler:
    """Ownership and heartbeat of a study's trials, for one controller (``me``).

    Args:
        ctx: the study (its space gives the objective of a result found in a metrics file;
            its progress sink gets one line per reconciled trial).
        me: this controller.
        trust_paths: read the metrics files and signal the process groups that stored trials
            name (False for an imported study whose paths came from the export).
        clock, alive, kill: time, pid check and leftover killer (tests substitute them).
    """

    def __init__(
        self,
        ctx: StudyContext,
        me: Owner,
        *,
        trust_paths: bool = True,
        clock: Callable[[], float] = time.time,
        alive: Callable[[int], bool] = pid_alive,
        kill: Callable[[Path, str], bool] | None = None,
    ) -> None:
        self.ctx = ctx
        self.space = ctx.space
        self.storage = ctx.storage
        self.me = me
        self.trust_paths = trust_paths
        self.progress = ctx.progress
        self.clock = clock
        self.alive = alive
        self._kill = kill

    def owner_dead(self, t: TrialRecord) -> bool:
        """Whether the controller that owns ``t`` is gone.

        Mine: no. Same host: its pid is gone, or it is this process with another token (an
        earlier controller of this process), or its heartbeat is older than
        :data:`SAME_HOST_STALE_S` although the pid lives (a reused pid, an imported row).
        Another host, or no readable owner: the heartbeat is older than :data:`STALE_S`.
        """
        owner = Owner.parse(t.runner)
        hb = t.heartbeat_at or t.started_at or t.queued_at or 0.0
        age = self.clock() - hb
        if owner == self.me:
            return False
        if owner is not None and owner.host == self.me.host:
            if owner.pid == self.me.pid:
                return True  # same process, other token: a controller that ended
            if not self.alive(owner.pid):
                return True
            return age > SAME_HOST_STALE_S
        return age > STALE_S

    def reconcile(self) -> int:
        """Trials left queued/running by a dead controller: a finished result is taken from
        the metrics file, the rest re-queued (leftover processes killed). Returns how many."""
        n = 0
        for t in self.storage.list_trials(self.ctx.study_id, state="queued"):
            if t.runner and self.owner_dead(t):
                self.storage.requeue_trial(t.id, reason="interrupted: controller died")
                n += 1
        for t in self.storage.list_trials(self.ctx.study_id, state="running"):
            if not self.owner_dead(t):
                continue
            out: Outcome | None = None
            if self.trust_paths and t.metrics_path:
                out = read_metrics(t.metrics_path)
            if out is not None:
                self.storage.finish_trial(t.id, out, value=objective_value(self.space, out))
                self.progress(f"reconciled trial {t.number}: finished while unattended")
            else:
                if self.trust_paths and t.metrics_path and t.runner:
                    self.kill_leftover(Path(t.metrics_path).parent, t.runner)
                self.storage.requeue_trial(t.id, reason="interrupted: controller died")
                self.progress(f"reconciled trial {t.number}: interrupted, re-queued")
            n += 1
        return n

    def kill_leftover(self, trial_dir: Path, owner: str) -> bool:
        if self._kill is not None:
            return self._kill(trial_dir, owner)
        return kill_owned_group(trial_dir, owner)

    def heartbeat(self, trial_ids: list[int]) -> None:
        if trial_ids:
            self.storage.heartbeat(trial_ids)
