"""The rule for function-local first-party imports (issue 40): each import of dse inside a
function defers a heavy stack its module does not load already, or is allowlisted with its
reason; every other one is at module level (``scripts/local_imports.py`` holds the rule, the
heavy stacks with their import times, and the allowlist)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_rule() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "local_imports", REPO / "scripts" / "local_imports.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


rule = _load_rule()


@pytest.fixture(scope="module")
def found() -> list:
    return rule.local_imports(REPO)


@pytest.fixture(scope="module")
def verdicts(found: list) -> dict:
    """Each local import not allowlisted -> the heavy stack it defers (one child interpreter
    per importing module, once per session)."""
    return rule.judge(REPO, [i for i in found if (i.path, i.module) not in rule.ALLOWLIST])


def test_every_local_import_defers_a_heavy_stack_or_has_a_reason(
    found: list, verdicts: dict
) -> None:
    bad = rule.violations(found, verdicts)
    assert not bad, "\n".join(bad)


def test_each_allowlisted_import_is_there_and_has_a_reason(found: list) -> None:
    present = {(i.path, i.module) for i in found}
    stale = sorted(set(rule.ALLOWLIST) - present)
    assert not stale, f"allowlisted local imports that are gone: {stale}"
    assert all(len(why.split()) >= 5 for why in rule.ALLOWLIST.values())


def test_the_heavy_stacks_are_top_level_names_with_their_cost() -> None:
    assert "torch" in rule.HEAVY and "sqlalchemy" in rule.HEAVY
    assert all("." not in name and why for name, why in rule.HEAVY.items())


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_walk_finds_local_imports_relative_ones_resolved(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "dse/__init__.py": "",
        "dse/a/__init__.py": "",
        "dse/a/b.py": (
            "import json\n"
            "from dse.a import c\n"  # module level: not counted
            "def f():\n"
            "    import os\n"  # not first-party
            "    from . import c\n"
            "    from ..a.c import X as Y\n"
            "    g = lambda: __import__('x')\n"
            "    class K:\n"
            "        def m(self):\n"
            "            import dse.a.c\n"
        ),
        "dse/a/c.py": "X = 1\n",
    })  # fmt: skip
    got = [(i.path, i.line, i.module, i.statement) for i in rule.local_imports(root)]
    assert got == [
        ("dse/a/b.py", 5, "dse.a", "from dse.a import c"),
        ("dse/a/b.py", 6, "dse.a.c", "from dse.a.c import X as Y"),
        ("dse/a/b.py", 10, "dse.a.c", "import dse.a.c"),
    ]


def test_a_light_local_import_fails_naming_file_and_line_a_heavy_one_passes(
    tmp_path: Path,
) -> None:
    """A real judgement in child interpreters: ``heavy`` imports SQLAlchemy (one of the
    stacks), ``light`` nothing; the module ``user`` imports both inside functions."""
    root = _tree(tmp_path, {
        "dse/__init__.py": "",
        "dse/heavy.py": "import sqlalchemy\n",
        "dse/light.py": "import json\n",
        "dse/user.py": (
            "def f():\n"
            "    from dse import heavy\n"
            "def g():\n"
            "    from dse import light\n"
        ),
    })  # fmt: skip
    found = rule.local_imports(root)
    verdicts = rule.judge(root, found)
    assert sorted(verdicts.values()) == ["", "sqlalchemy"]
    bad = rule.violations(found, verdicts, allowlist={})
    assert len(bad) == 1 and bad[0].startswith("dse/user.py:4: `from dse import light`")
    assert rule.violations(found, verdicts, allowlist={("dse/user.py", "dse"): "why"}) == []
