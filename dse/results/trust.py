"""What a study's estimated trials stand on: the best within the measured range beside the best.

A sim trial records the trust of its estimate (``metrics.trust``: ``calibrated``,
``interpolated`` or ``extrapolated``, from :mod:`dse.model.costmodel.basis`). An
extrapolated estimate is a guess outside every measured range, so it is never named a
study's best on its own: :func:`trust_summary` names the best calibrated or interpolated
trial beside it, for ``dse status``, the report and the API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["TRUSTED_LABELS", "trust_label", "trust_summary"]

#: Labels of estimates that stand on measurements of their range.
TRUSTED_LABELS = ("calibrated", "interpolated")


def trust_label(metrics: Mapping[str, Any] | None) -> str | None:
    """The trust label a trial's metrics record (None for a measured trial)."""
    t = (metrics or {}).get("trust")
    return t.get("label") if isinstance(t, Mapping) else None


def trust_summary(
    trials: Iterable[Mapping[str, Any]], metric: str, direction: str
) -> dict[str, Any] | None:
    """For the complete trials that carry a trust label: how many have each label, the best
    of them, and the best calibrated or interpolated one (``trusted_best``; None when every
    estimate is extrapolated). None when no trial carries a label. ``trials``: dicts with
    ``number``, ``state``, ``params`` and ``metrics``."""
    sign = 1.0 if direction == "maximize" else -1.0
    counts: dict[str, int] = {}
    best: tuple[float, Mapping[str, Any]] | None = None
    trusted: tuple[float, Mapping[str, Any]] | None = None
    for t in trials:
        m = t.get("metrics") or {}
        label = trust_label(m)
        if label is None or t.get("state") != "complete":
            continue
        counts[label] = counts.get(label, 0) + 1
        v = m.get(metric)
        if not isinstance(v, int | float):
            continue
        if best is None or sign * v > sign * best[0]:
            best = (float(v), t)
        if label in TRUSTED_LABELS and (trusted is None or sign * v > sign * trusted[0]):
            trusted = (float(v), t)
    if not counts:
        return None

    def one(item: tuple[float, Mapping[str, Any]] | None) -> dict[str, Any] | None:
        if item is None:
            return None
        v, t = item
        tr = (t.get("metrics") or {}).get("trust") or {}
        return {
            "number": t.get("number"),
            "value": v,
            "label": tr.get("label"),
            "why": tr.get("why", ""),
            "params": t.get("params"),
        }

    return {
        "counts": counts,
        "best": one(best),
        "trusted_best": one(trusted),
        "source": "estimate",
    }
