"""Process groups of trials: signalling one, and ending what a dead controller left.

A trial runs in its own process group, tagged with its controller's ownership token
(:data:`OWNER_ENV` in its environment and ``<trial_dir>/pgid``); only a group that carries
the token is ever signalled. The runners and the launcher trial
process (:mod:`dse.workloads.launchers.run`) import this module; it imports none of them.

A trial's process group is not all of it: ``torchrun`` starts each worker in a session and
process group of its own (``start_new_session``), so a signal to the trial's group misses the
ranks, and when ``torchrun`` dies its workers are re-parented away from the trial. Every
process of a trial therefore carries a tag of that trial in its environment
(:data:`TRIAL_TAG_ENV`, inherited through ``setsid`` and re-parenting alike), and
:func:`kill_trial` ends the trial's group and every process carrying its tag.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = [
    "OWNER_ENV",
    "kill_process_group",
    "TRIAL_TAG_ENV",
    "kill_group",
    "kill_owned_group",
    "kill_trial",
    "new_trial_tag",
    "tagged_pids",
]

#: Environment variable that carries a trial's ownership token (its controller's owner string)
#: into the trial process; also written to ``<trial_dir>/pgid`` and checked before a leftover
#: process group is signalled.
OWNER_ENV = "DSE_TRIAL_OWNER"
#: Environment variable that tags every process of one trial (a fresh random value per
#: launch; dse.core.envpolicy keeps spaces from setting DSE_* variables).
TRIAL_TAG_ENV = "DSE_TRIAL_TAG"


def new_trial_tag() -> str:
    """A fresh tag for one launch of a trial."""
    return uuid.uuid4().hex


def tagged_pids(tag: str) -> list[int]:
    """Live processes (zombies left out) whose environment carries ``tag`` (empty where
    /proc cannot tell)."""
    if not tag:
        return []
    want = f"{TRIAL_TAG_ENV}={tag}".encode()
    out: list[int] = []
    me = os.getpid()
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return []
    for d in entries:
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            if want not in (d / "environ").read_bytes().split(b"\0"):
                continue
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2 :].split()[0] != "Z":
            out.append(int(d.name))
    return out


def _signal_all(pgid: int | None, pids: list[int], sig: int) -> None:
    if pgid is not None and pgid > 1:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_trial(pgid: int | None, tag: str, grace_s: float = 5.0) -> None:
    """End a whole trial: SIGTERM its process group and every process carrying its ``tag``
    (torchrun's workers in their own sessions included), then SIGKILL what is left of them
    after ``grace_s``; returns once none is left alive (or after a last SIGKILL)."""
    _signal_all(pgid, tagged_pids(tag), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while True:
        left = tagged_pids(tag)
        group = False
        if pgid is not None and pgid > 1:
            try:
                os.killpg(pgid, 0)
                group = True
            except (ProcessLookupError, PermissionError):
                group = False
        if not left and not group:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    _signal_all(pgid if group else None, left, signal.SIGKILL)
    end = time.monotonic() + 5.0
    while tagged_pids(tag) and time.monotonic() < end:
        time.sleep(0.05)


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
        tag = str(data.get("tag") or "")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    if not owner or token != owner or pgid <= 1:
        return False
    members = _group_members(pgid)
    tagged = [p for p in tagged_pids(tag) if _carries_token(p, token)]
    if members is not None and not any(_carries_token(p, token) for p in members):
        if not tagged:  # neither the group nor a tagged process is this owner's
            return False
        pgid = 0  # the group is gone (or not ours); its tagged workers are left
    if tag:
        kill_trial(pgid or None, tag, grace_s=grace_s)
    else:
        kill_group(pgid, grace_s=grace_s)
    return True


def kill_process_group(
    popen: subprocess.Popen[Any], grace_s: float = 5.0, *, tag: str = ""
) -> None:
    """SIGTERM the process group ``popen`` leads, reap its leader (a zombie leader keeps the
    group alive), then SIGKILL whatever of the group is left (a trial's stop; the launcher
    trial process stops a recipe the same way). With ``tag`` (the trial's
    :data:`TRIAL_TAG_ENV`), every process carrying it too:
    torchrun's workers, each in a session of its own."""
    pgid = popen.pid
    if tag:
        for pid in tagged_pids(tag):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    popen.wait()
    if tag:
        kill_trial(None, tag, grace_s=grace_s)
