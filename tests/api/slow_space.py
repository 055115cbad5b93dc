"""Space checks for the bounded-validation tests, run in the validation child process."""

from __future__ import annotations

import time
from typing import Any


def spin(text: str, source: str) -> dict[str, Any]:
    """A check that never ends on its own (CPU-bound, like a runaway constraint)."""
    x = 0
    while True:
        x = (x * 7 + 1) % 1_000_003


def allocate(text: str, source: str) -> dict[str, Any]:
    """A check that allocates without bound (like an expanded YAML alias bomb)."""
    chunks = []
    while True:
        chunks.append(bytearray(64 * 1024 * 1024))
        time.sleep(0)
