"""Validating a space file in a child process, bounded in time and memory.

A space file is hostile input: a legal but slow one (a large constraint product, a wide int
range) or a YAML alias bomb must not stall or kill the process that reads it. The REST API
validates every ``POST /studies`` body through :func:`check_space_text`: the child parses the
text, runs the space check and computes what the study record keeps (the space hash included,
which serialises the whole space); the parent waits at most ``timeout_s`` and kills the child
past it. The child limits its own address space to ``memory_mib`` (an allocation beyond it is a
``MemoryError`` in the child, never in the caller).

The child is started with ``python -m dse.model.space_check`` and speaks JSON: the text on stdin,
``{"ok": true, "fields": ..., "workdir": ...}`` or ``{"ok": false, "error": message}`` on
stdout.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from dse.core.exceptions import SpaceError
from dse.model.rules import check_space
from dse.space.searchspace import parse_space_text

__all__ = ["CheckedSpace", "check_space_text", "DEFAULT_TIMEOUT_S", "DEFAULT_MEMORY_MIB"]

#: How long a space file may take to validate (the API answers 422 past it).
DEFAULT_TIMEOUT_S = 10.0
#: The child's address-space limit.
DEFAULT_MEMORY_MIB = 1024
#: The function the child runs on the text (``module:function``; tests name a slow one).
DEFAULT_TARGET = "dse.model.space_check:validate"


@dataclass(frozen=True)
class CheckedSpace:
    """What a validated space file gives a new study: the record's fields and the workdir."""

    fields: dict[str, Any]
    workdir: str

    @property
    def name(self) -> str:
        return str(self.fields["name"])


def validate(text: str, source: str) -> dict[str, Any]:
    """Parse and check a space file's text (what the child runs): the study fields."""

    space = parse_space_text(text, source)
    check_space(space, source)
    return {"fields": space.study_fields(), "workdir": space.runner.workdir}


def check_space_text(
    text: str,
    source: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mib: int = DEFAULT_MEMORY_MIB,
    target: str = DEFAULT_TARGET,
) -> CheckedSpace:
    """Validate a space file's text in a child process.

    Raises:
        SpaceError: the file is invalid, or its validation ran past ``timeout_s`` or past
            ``memory_mib`` (the message names ``source`` and the cause).
    """
    env = {k: v for k, v in os.environ.items() if k != "DSE_API_TOKEN"}
    # one BLAS / OpenMP thread: the sample check uses NumPy, whose thread pools would each
    # reserve address space under the child's memory limit on a many-core host
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    args = [sys.executable, "-m", "dse.model.space_check", source, str(memory_mib), target]
    try:
        proc = subprocess.run(
            args,
            input=text.encode(),
            capture_output=True,
            timeout=timeout_s,
            env=env,
            close_fds=True,
        )
    except subprocess.TimeoutExpired:
        raise SpaceError(
            f"{source}: validating the space took longer than the {timeout_s:g} s limit "
            "(too many configurations, constraints or values to check; make the space "
            "smaller)"
        ) from None
    except OSError as e:
        raise SpaceError(f"{source}: cannot start the space check: {e}") from e
    try:
        answer = json.loads(proc.stdout.decode())
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        if b"MemoryError" in proc.stderr:
            raise SpaceError(
                f"{source}: validating the space needed more than the {memory_mib} MiB memory "
                "limit (a YAML alias bomb or a huge value?)"
            )
        if proc.returncode < 0:
            raise SpaceError(
                f"{source}: the space check was stopped by signal {-proc.returncode} "
                f"(over the {memory_mib} MiB memory limit?)"
            )
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise SpaceError(f"{source}: the space check failed ({tail[0][:300]})")
    if not answer.get("ok"):
        raise SpaceError(str(answer.get("error") or f"{source}: invalid space file"))
    return CheckedSpace(fields=dict(answer["fields"]), workdir=str(answer["workdir"]))


def _limit_memory(mib: int) -> None:
    try:
        import resource

        limit = mib * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # not on this platform: time still bounds it
        pass


def _child(argv: list[str]) -> int:
    source, memory_mib, target = argv[0], int(argv[1]), argv[2]
    text = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    _limit_memory(memory_mib)
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    try:
        out: dict[str, Any] = {"ok": True, **fn(text, source)}
    except SpaceError as e:
        out = {"ok": False, "error": str(e)}
    except MemoryError:
        out = {
            "ok": False,
            "error": f"{source}: validating the space needed more than the {memory_mib} MiB "
            "memory limit (a YAML alias bomb or a huge value?)",
        }
    except (RecursionError, ArithmeticError, ValueError, TypeError) as e:
        out = {
            "ok": False,
            "error": f"{source}: the space cannot be validated: {type(e).__name__}: "
            f"{str(e)[:300]}",
        }
    try:
        data = json.dumps(out, allow_nan=False)
    except (ValueError, TypeError) as e:
        data = json.dumps({"ok": False, "error": f"{source}: unusable values: {e}"})
    sys.stdout.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
