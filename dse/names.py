"""Study names: one rule, shared by the space file, the CLI, import and the API.

A study name becomes a folder (``<workdir>/<study>/trial-00000``), so it must be a single
path component: no ``/`` or ``\\``, not ``.`` or ``..``, no control characters.
"""

from __future__ import annotations

__all__ = ["study_name_problem", "check_study_name", "display_name"]


def study_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a study name (None when it can)."""
    if not name:
        return "a study name must not be empty"
    if "/" in name or "\\" in name:
        return "a study name must not contain '/' or '\\' (it names a folder)"
    if name in (".", ".."):
        return "a study name must not be '.' or '..'"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "a study name must not contain control characters"
    return None


def check_study_name(name: str, where: str = "study") -> str:
    """``name`` when it is a valid study name.

    Raises:
        ValueError: a message naming ``where``, the rule and the name (repr-escaped).
    """
    why = study_name_problem(name)
    if why is not None:
        raise ValueError(f"{where}: {why} (study={name!r})")
    return name


def display_name(name: str) -> str:
    """``name`` safe to print on one line: control characters escaped as in ``repr``."""
    if all(32 <= ord(c) != 127 for c in name):
        return name
    return repr(name)[1:-1]
