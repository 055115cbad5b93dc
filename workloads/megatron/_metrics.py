"""Writing the trial's metrics JSONL (the format :func:`dse.records.read_metrics` reads).

Lines are appended with one ``write`` each under an exclusive ``flock`` and flushed to the
OS at once, so the controller can tail the file while the trial runs. Only the first final
line (summary or failure) of a file counts: a second rank that fails after another one
already wrote a failure writes nothing.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["MetricsWriter", "finite_or_none"]

_FINAL = ("summary", "failure")


def finite_or_none(x: float | None) -> float | None:
    """``x`` as a float, or None when it is None, NaN or infinite (JSON has no NaN)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class MetricsWriter:
    """Append-only writer of one trial's metrics lines."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _append(self, record: dict[str, Any], *, final: bool) -> bool:
        line = json.dumps(record, allow_nan=False) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if final and self.has_final():
                return False
            os.write(fd, line.encode())
            return True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def has_final(self) -> bool:
        """True when the file already holds a summary or failure line."""
        if not self.path.exists():
            return False
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("type") in _FINAL:
                    return True
            except (json.JSONDecodeError, AttributeError):
                continue
        return False

    def step(self, record: dict[str, Any]) -> None:
        """One ``{"type": "step", ...}`` line."""
        self._append({"type": "step", **record}, final=False)

    def summary(self, record: dict[str, Any]) -> bool:
        """The ``{"type": "summary", ...}`` line; False when a final line was already there."""
        return self._append({"type": "summary", **record}, final=True)

    def failure(
        self, failure_class: str, reason: str, metrics: dict[str, Any] | None = None
    ) -> bool:
        """The ``{"type": "failure", ...}`` line; False when a final line was already there."""
        clean = {
            k: v
            for k, v in (metrics or {}).items()
            if not isinstance(v, float) or math.isfinite(v)
        }
        return self._append(
            {
                "type": "failure",
                "failure_class": failure_class,
                "reason": reason,
                "metrics": clean,
            },
            final=True,
        )
