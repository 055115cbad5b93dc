"""Study names: one rule, shared by the space file, the CLI, import and the API.

A study name becomes a folder (``<workdir>/<study>/trial-00000``), so it must be a single
path component: no ``/`` or ``\\``, not ``.`` or ``..``; and it is printed, so it has no
control characters (C0 and C1: NEL moves to a new line, CSI starts an escape sequence), no
line or paragraph separators and no invisible formatting characters (bidirectional
overrides, zero-width spaces), which could forge or disguise a line of output.
"""

from __future__ import annotations

import unicodedata

from dse.core.bounds import one_line

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
    if not name.isascii() and any(unicodedata.category(c) in _HIDDEN for c in name):
        return (
            "a study name must not contain control characters, line separators or invisible "
            "formatting characters (such as bidirectional overrides)"
        )
    return None


#: Unicode categories a name must not have: controls (C1 included), format characters
#: (bidirectional overrides, zero-width spaces), line and paragraph separators, surrogates.
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


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
    """``name`` safe to print on one line: what is not printable (controls, C1 included;
    line separators; invisible formatting characters) escaped as in ``repr``."""
    return one_line(name)
