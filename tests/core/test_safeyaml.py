"""dse/core/safeyaml.py on its own: PyYAML's safe loader with limits; each refusal a
MarkedYAMLError naming the problem and its line (the space and import tests reach it
through their parsers)."""

from __future__ import annotations

import pytest
import yaml

from dse.core.bounds import MAX_SCALAR_CHARS, MAX_YAML_ALIASES, MAX_YAML_DEPTH, MAX_YAML_NODES
from dse.core.safeyaml import safe_load


def _refused(text: str) -> yaml.MarkedYAMLError:
    with pytest.raises(yaml.MarkedYAMLError) as info:
        safe_load(text)
    return info.value


def test_what_yaml_safe_load_reads_it_reads_alike() -> None:
    text = "a: 1\nb: [x, 2.5, true, null]\nc: &r {d: 3}\ne: *r\n<<: {f: 4}\n"
    assert safe_load(text) == yaml.safe_load(text)
    assert safe_load("") is None
    assert safe_load("7") == 7


def test_duplicate_key_names_the_key_and_both_lines() -> None:
    e = _refused("study: a\nknobs: {}\nstudy: b\n")
    assert e.problem == "duplicate key 'study' (first given at line 1)"
    assert e.problem_mark is not None and e.problem_mark.line + 1 == 3
    # nested mappings too; merge keys and different keys are fine
    assert "duplicate key 'x'" in str(_refused("m:\n  x: 1\n  x: 2\n").problem)
    assert safe_load("a: &b {x: 1}\nc:\n  <<: *b\n  y: 2\n") == {
        "a": {"x": 1},
        "c": {"x": 1, "y": 2},
    }


def test_a_long_duplicate_key_is_shortened() -> None:
    key = "k" * 200
    e = _refused(f"{key}: 1\n{key}: 2\n")
    assert e.problem is not None and "..." in e.problem and len(e.problem) < 140


def test_alias_count_bound() -> None:
    ok = "a: &a 1\nb: [" + ", ".join(["*a"] * MAX_YAML_ALIASES) + "]\n"
    assert len(safe_load(ok)["b"]) == MAX_YAML_ALIASES
    over = "a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_YAML_ALIASES + 1)) + "]\n"
    assert _refused(over).problem == f"more than {MAX_YAML_ALIASES} aliases in one document"


def test_alias_bomb_is_refused_before_it_expands() -> None:
    """9 levels of 9 references (a 9**9-node document from ~1 KB)."""
    lines = ["l0: &l0 [" + ", ".join(["1"] * 9) + "]"]
    for i in range(1, 9):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    e = _refused("\n".join(lines) + "\n")
    assert e.problem is not None
    assert f"more than {MAX_YAML_NODES} nodes" in e.problem or "aliases" in e.problem


def test_expansion_bound_without_many_aliases() -> None:
    """Few aliases, many nodes once expanded: 4 levels of 30 (30**4 = 810,000 nodes)."""
    width = 30
    lines = ["l0: &l0 [" + ", ".join(["1"] * width) + "]"]
    for i in range(1, 4):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    text = "\n".join(lines) + "\n"
    assert text.count("*") <= MAX_YAML_ALIASES
    assert f"more than {MAX_YAML_NODES} nodes" in str(_refused(text).problem)


def test_recursive_alias_is_refused() -> None:
    assert _refused("a: &a [*a]\n").problem in (
        "an alias refers to itself",
        "found recursive anchor 'a'",  # PyYAML's own composer may see it first
    )


def test_depth_bound() -> None:
    ok = "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1)
    safe_load(ok)
    deep = "[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1)
    assert _refused(deep).problem == f"nested deeper than {MAX_YAML_DEPTH} levels"


@pytest.mark.parametrize("number", ["1" * (MAX_SCALAR_CHARS + 1), "1." + "5" * MAX_SCALAR_CHARS])
def test_long_numbers_are_refused(number: str) -> None:
    e = _refused(f"n: {number}\n")
    assert e.problem == (
        f"a number of {len(number)} characters is too long (at most {MAX_SCALAR_CHARS})"
    )


def test_long_strings_are_not_numbers() -> None:
    s = "1" * (MAX_SCALAR_CHARS + 10)
    assert safe_load(f"n: '{s}'\n") == {"n": s}
    assert safe_load(f"n: {'1' * MAX_SCALAR_CHARS}\n") == {"n": int("1" * MAX_SCALAR_CHARS)}


def test_unsafe_tags_stay_refused() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="python/object"):
        safe_load("!!python/object/apply:os.system ['true']\n")
