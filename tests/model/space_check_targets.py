"""Functions the space-check child runs in tests/model/test_space_check.py (``module:function``
targets of dse.model.space_check.check_space_text)."""

from __future__ import annotations

import os
from typing import Any


def environment(text: str, source: str) -> dict[str, Any]:
    """What the child sees: the API token (must be absent) and the text it was given."""
    return {"fields": {"name": text, "token": os.environ.get("DSE_API_TOKEN")}, "workdir": source}


def not_a_number(text: str, source: str) -> dict[str, Any]:
    return {"fields": {"name": "x", "value": float("nan")}, "workdir": "w"}


def value_error(text: str, source: str) -> dict[str, Any]:
    raise ValueError("a value the check could not use")


def crash(text: str, source: str) -> dict[str, Any]:
    os._exit(3)
