"""dse/core/names.py on its own: the one study-name rule (a single path component, nothing that
hides or forges a line of output) and the escaping used to print a name."""

from __future__ import annotations

import pytest

from dse.core.names import check_study_name, display_name, study_name_problem


@pytest.mark.parametrize("name", ["llama-1b", "a.b_c", "étude", "研究", "x" * 200, "a b"])
def test_ordinary_names_are_valid(name: str) -> None:
    assert study_name_problem(name) is None
    assert check_study_name(name) == name


@pytest.mark.parametrize(
    "name,why",
    [
        ("", "must not be empty"),
        ("a/b", "must not contain '/'"),
        ("a\\b", "must not contain '/' or '\\'"),
        (".", "must not be '.' or '..'"),
        ("..", "must not be '.' or '..'"),
        ("a\nb", "control characters"),
        ("a\x1b[2Jb", "control characters"),
        ("a\x7fb", "control characters"),
        ("a\x85b", "invisible formatting"),  # NEL (C1)
        ("a\u202eb", "invisible formatting"),  # right-to-left override
        ("a\u200bb", "invisible formatting"),  # zero-width space
        ("a\u2028b", "invisible formatting"),  # line separator
    ],
)
def test_bad_names_are_refused_with_the_rule(name: str, why: str) -> None:
    problem = study_name_problem(name)
    assert problem is not None and why in problem
    with pytest.raises(ValueError) as info:
        check_study_name(name, where="space.yaml: study")
    msg = str(info.value)
    assert msg.startswith("space.yaml: study: ") and f"(study={name!r})" in msg
    assert "\n" not in msg and "\u202e" not in msg  # the message itself cannot forge a line


def test_display_name_escapes_what_is_not_printable() -> None:
    assert display_name("llama-1b") == "llama-1b"
    assert display_name("研究") == "研究"
    assert display_name("a\nb") == "a\\nb"
    assert display_name("a\u202eb") == "a\\u202eb"
    assert display_name("it's") == "it's"  # printable: unchanged, not repr-quoted
