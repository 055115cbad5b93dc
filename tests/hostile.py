"""Hypothesis strategies for hostile input: a valid document (a space file, a study export)
with random parts replaced by hostile values, and hostile YAML / JSON text.

The properties checked with them live in the tests that use them; what they share:
:func:`assert_clean_message`.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import yaml
from hypothesis import strategies as st

from tests.conftest import EXAMPLES

__all__ = [
    "TINY_TEXT",
    "tiny_space",
    "hostile_values",
    "mutated_doc",
    "space_texts",
    "space_bytes",
    "constraints",
    "assert_clean_message",
]

TINY_TEXT = (EXAMPLES / "tiny_gpt_cpu.yaml").read_text()
_KNOBS = [
    "tensor_model_parallel_size",
    "micro_batch_size",
    "recompute",
    "attention_backend",
    "use_distributed_optimizer",
]


def tiny_space() -> dict[str, Any]:
    return yaml.safe_load(TINY_TEXT)


_STRINGS = st.sampled_from(
    [
        "",
        "\x1b[2J\x1b[31mred",
        "a\x00b",
        "../../etc/passwd",
        "x" * 5000,
        "none",
        "full",
        "1e12",
        "é ü 漢字 \u202e",
        "${HOME}",
        "'; DROP TABLE studies; --",
    ]
)
_INTS = st.one_of(
    st.sampled_from([0, -1, 1, 2, 3, 8, 2**31, 2**32, 2**63, -(2**63), 10**12, 10**50]),
    st.integers(min_value=-(10**6), max_value=10**6),
)
_FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 1e-308, 0.5]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_SCALARS = st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, _STRINGS)
hostile_values: st.SearchStrategy[Any] = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(_STRINGS, st.sampled_from(_KNOBS)), inner, max_size=4),
    ),
    max_leaves=8,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_doc(draw: st.DrawFn, base: dict[str, Any], extra_keys: list[str]) -> dict[str, Any]:
    """``base`` with 1-4 of: a value replaced, a key removed, a key added."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = doc
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(hostile_values)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            key = draw(st.one_of(st.sampled_from(extra_keys), _STRINGS))
            parent[key] = draw(hostile_values)
    return doc


_NAMES = st.sampled_from([*_KNOBS, "world_size", "dp", "nope"])
_ATOMS = st.one_of(
    _NAMES,
    st.sampled_from(["0", "1", "2", "7", "9", "10**6", "1e300", "0.5", "'none'", "True", "None"]),
)
constraints: st.SearchStrategy[str] = st.recursive(
    _ATOMS,
    lambda inner: st.one_of(
        st.tuples(
            inner,
            st.sampled_from(["+", "-", "*", "/", "//", "%", "**", " and ", " or "]),
            inner,
        ).map(lambda t: f"({t[0]}{t[1]}{t[2]})"),
        st.tuples(inner, st.sampled_from(["<", "<=", "==", "!=", " in ", " not in "]), inner).map(
            lambda t: f"{t[0]}{t[1]}{t[2]}"
        ),
        inner.map(lambda e: f"not {e}"),
        inner.map(lambda e: f"-{e}"),
        st.lists(inner, max_size=3).map(lambda xs: "(" + ", ".join(xs) + ",)"),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
    ),
    max_leaves=12,
)


def _bomb(levels: int, width: int) -> str:
    lines = ["  a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines)


_TEXT_EDITS = st.sampled_from(
    [
        lambda t: t + "study: again\n",  # a duplicate key
        lambda t: t + "recipe: " + "9" * 5000 + "\n",
        lambda t: t + "recipe: " + "[" * 200 + "]" * 200 + "\n",
        lambda t: t + "recipe: &r [*r]\n",
        lambda t: t.replace("runner: {", "runner:\n  options:\n" + _bomb(6, 9) + "\nx: {", 1),
        lambda t: t.replace("knobs:\n", 'knobs:\n  "\\e[2J\\0": {values: [1]}\n', 1),
        lambda t: t.replace(": ", ": !!python/object/apply:os.system ['true'] ", 1),
        lambda t: t.replace("\n", "\n\t", 3),
        lambda t: t[: len(t) // 2],
        lambda t: "",
        lambda t: "- 1\n- 2\n",
        lambda t: "\x00" + t,
        lambda t: t.replace("high", "hi\x1bgh"),
    ]
)


@st.composite
def space_texts(draw: st.DrawFn) -> str:
    """Space-file text: a mutated tiny space (maybe with hostile constraints), maybe edited."""
    doc = draw(mutated_doc(tiny_space(), ["constraints", "fixed", "when", "options", "seed"]))
    if draw(st.booleans()):
        doc["constraints"] = draw(st.lists(constraints, max_size=3))
    text = yaml.safe_dump(doc, allow_unicode=True)
    if draw(st.integers(0, 3)) == 0:
        text = draw(_TEXT_EDITS)(text)
    return text


@st.composite
def space_bytes(draw: st.DrawFn) -> bytes:
    """Space-file bytes: :func:`space_texts` encoded, maybe with bytes that are not UTF-8."""
    raw = draw(space_texts()).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(raw)))
        raw = raw[:cut] + draw(st.binary(min_size=1, max_size=8)) + raw[cut:]
    return raw


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def assert_clean_message(message: str, source: str) -> None:
    """A refusal message: names the input, no traceback, no raw control characters."""
    assert message.strip(), "empty error message"
    assert source in message, message
    assert "Traceback" not in message, message
    assert not _CONTROL.search(message), repr(message)


def json_text(doc: Any) -> str:
    return json.dumps(doc)
