"""Starting a study controller (``dse resume``) as a detached process for ``?start=true``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dse.core.exceptions import TrialLaunchError
from dse.storage import has_password

__all__ = ["Spawned", "Spawner", "SubprocessSpawner", "controller_command", "controller_env"]


@dataclass(frozen=True)
class Spawned:
    """A started controller: its pid, command line (no secrets) and log file."""

    pid: int
    command: list[str]
    log_path: str | None


class Spawner(Protocol):
    """Starts ``dse resume`` for a study; tests substitute a recorder."""

    def __call__(self, *, study: str, storage_url: str, workdir: str) -> Spawned: ...


def controller_command(study: str, storage_url: str) -> tuple[list[str], dict[str, str]]:
    """The command that runs a study's controller, and extra environment variables.

    A URL with a password travels in ``DSE_STORAGE`` rather than on the command line, where
    every local user could read it. The name travels as ``--study=NAME`` so that a name
    starting with ``-`` is a value, not an option.
    """
    argv = [sys.executable, "-m", "dse.cli", "resume", f"--study={study}"]
    if has_password(storage_url):
        return argv, {"DSE_STORAGE": storage_url}
    return [*argv, "--storage", storage_url], {}


#: Variables of the API process a controller must not inherit: the API's write token (a
#: controller and its trials never call the API; a trial runs the space's code).
_WITHHELD = ("DSE_API_TOKEN",)


def controller_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a started controller: the API's, less its secrets, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _WITHHELD}
    return {**env, **extra}


class SubprocessSpawner:
    """Runs the controller in its own session (it outlives a restarted API), output appended
    to ``<workdir>/<study>/controller.log``; a thread reaps it when it exits."""

    def __call__(self, *, study: str, storage_url: str, workdir: str) -> Spawned:
        argv, env = controller_command(study, storage_url)
        log_path = Path(workdir) / study / "controller.log"
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=controller_env(env),
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as e:
            raise TrialLaunchError(f"cannot start the controller of study {study!r}: {e}") from e
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
        return Spawned(pid=proc.pid, command=argv, log_path=str(log_path))
