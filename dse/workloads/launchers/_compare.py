"""Comparing a recipe's resolved configuration with what dse asked: one comparison for every
target (:func:`compare`), values compared as the recipes print them (:func:`normalize`).
A leaf module: the launchers and the check (:mod:`.resolved`) import it."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Mismatch", "compare", "normalize"]


@dataclass(frozen=True)
class Mismatch:
    """One field the recipe resolved to another value than dse asked."""

    field: str
    asked: Any
    resolved: Any
    missing: bool = False

    def __str__(self) -> str:
        if self.missing:
            return f"{self.field}: asked {self.asked!r}, not in the resolved configuration"
        return f"{self.field}: asked {self.asked!r}, resolved {self.resolved!r}"


_DTYPES = {
    "fp32": "float32", "float32": "float32", "torch.float32": "float32", "torch.float": "float32",
    "bf16": "bfloat16", "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "torch.float16": "float16", "torch.half": "float16",
    "fp8": "uint8", "torch.uint8": "uint8",
}  # fmt: skip


def normalize(value: Any) -> Any:
    """A value as it compares: printed text parsed (``True``, ``4``, ``['a']``, ``None``),
    enums by their member name (``AttnBackend.flash`` -> ``flash``), dtypes by name
    (``bf16`` and ``torch.bfloat16`` alike), numbers as floats, lists and tuples as tuples."""
    if isinstance(value, str):
        text = value.strip()
        if text in _DTYPES:
            return _DTYPES[text]
        m = re.fullmatch(r"<?(?:[A-Z]\w*)\.(\w+)(?::\s*[^>]*)?>?", text)  # an enum member
        if m:
            return normalize(m.group(1))
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return text
        return text if isinstance(parsed, str) else normalize(parsed)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list | tuple):
        return tuple(normalize(v) for v in value)
    if hasattr(value, "name") and hasattr(value, "value"):  # an Enum member
        return normalize(value.name)
    return value


def _same(asked: Any, resolved: Any) -> bool:
    a, r = normalize(asked), normalize(resolved)
    if isinstance(a, bool) != isinstance(r, bool):
        return False  # False is not 0: a switch resolved to a number is another field
    if isinstance(a, float) and isinstance(r, float):
        return math.isclose(a, r, rel_tol=1e-9, abs_tol=0.0)
    return bool(a == r)


def compare(
    asked: Mapping[str, Any],
    resolved: Mapping[str, Any],
    defaults: Mapping[str, Any] | None = None,
) -> list[Mismatch]:
    """Every field of ``asked`` whose resolved value differs (or that is not resolved).
    ``defaults``: what a field the recipe leaves unset (None) means (Megatron-LM's
    ``recompute_modules`` None is Megatron-Core's ``["core_attn"]``)."""
    out: list[Mismatch] = []
    for name, want in asked.items():
        if name not in resolved:
            out.append(Mismatch(name, want, None, missing=True))
            continue
        got = resolved[name]
        if defaults and name in defaults and normalize(got) is None:
            got = defaults[name]
        if not _same(want, got):
            out.append(Mismatch(name, want, resolved[name]))
    return out
