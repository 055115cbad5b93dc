"""Process groups of trials: signalling one, and ending what a dead controller left.

A trial runs in its own process group, tagged with its controller's ownership token
(:data:`OWNER_ENV` in its environment and ``<trial_dir>/pgid``); only a group that carries
the token is ever signalled. The runner base, the local runner and the Ray runner import
this module; it imports none of them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

__all__ = ["OWNER_ENV", "kill_group", "kill_owned_group"]

#: Environment variable that carries a trial's ownership token (its controller's owner string)
#: into the trial process; also written to ``<trial_dir>/pgid`` and checked before a leftover
#: process group is signalled.
OWNER_ENV = "DSE_TRIAL_OWNER"


def kill_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM a process group, then SIGKILL what is left after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _group_members(pgid: int) -> list[int] | None:
    """Pids in process group ``pgid`` (None where /proc cannot tell)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    out: list[int] = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            # fields after the command (which may hold spaces and parentheses)
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid:
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _carries_token(pid: int, token: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{OWNER_ENV}={token}".encode() in env.split(b"\0")


def kill_owned_group(trial_dir: Path, owner: str, grace_s: float = 2.0) -> bool:
    """Kill the process group a dead controller left in ``trial_dir``, only if this
    installation started it for ``owner``: ``<trial_dir>/pgid`` must name ``owner`` (the
    trial row's owner, written at launch), and where /proc exists a member of the group must
    carry it in its environment (so a reused pgid or a file from elsewhere is never
    signalled). Returns whether a group was signalled."""
    try:
        data = json.loads((trial_dir / "pgid").read_text())
        pgid, token = int(data["pgid"]), str(data["owner"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not owner or token != owner or pgid <= 1:
        return False
    members = _group_members(pgid)
    if members is not None and not any(_carries_token(p, token) for p in members):
        return False
    kill_group(pgid, grace_s=grace_s)
    return True
