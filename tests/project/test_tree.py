"""The test tree mirrors the code (issue 40): ``tests/<folder>/`` holds the tests of
``dse/<folder>/`` (a sub-folder those of the sub-package of that name), beside the data its
tests read; the only other test folders are the cross-cutting ones, and no ``tests/dse/``
catch-all. Each folder of dse says in its ``__init__`` what it owns: an ``Owns:`` paragraph
naming every module and sub-package in it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Test folders that are not a dse package: the repository's own checks (docs, packaging,
#: import contracts, this tree) and the tests of the bench/ scripts.
CROSS_CUTTING = frozenset({"project", "bench"})
#: Data shared by tests of several folders; no tests in it.
SHARED_DATA = "fixtures"


def _is_test_file(p: Path) -> bool:
    """A file pytest collects or configures tests from (its default ``python_files``)."""
    return p.suffix == ".py" and (
        p.name.startswith("test_") or p.stem.endswith("_test") or p.name == "conftest.py"
    )


def _files(folder: Path) -> list[Path]:
    """The files under ``folder``, bytecode caches left out (a branch switch leaves them)."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def tree_problems(tests: Path, dse: Path) -> list[str]:
    """What in ``tests`` breaks the mirror of ``dse``, one line per folder or file."""
    problems: list[str] = []
    catch_all = tests / "dse"
    if catch_all.exists() and _files(catch_all):
        problems.append(
            "tests/dse/: a catch-all; a test goes to tests/<folder>/ of the dse folder it tests"
        )
    for f in sorted(tests.glob("*.py")):
        if _is_test_file(f) and f.name != "conftest.py":
            problems.append(
                f"tests/{f.name}: a test at the top of tests/; put it in the folder of what it "
                f"tests (tests/<folder>/, or tests/project/ for a check of the repository)"
            )
    folders = sorted({f.parent for f in _files(tests) if _is_test_file(f)} - {tests})
    for folder in folders:
        rel = folder.relative_to(tests)
        top = rel.parts[0]
        if top == "dse":
            continue  # said above
        if top == SHARED_DATA:
            problems.append(f"tests/{rel.as_posix()}/: tests in the shared data folder")
        elif top in CROSS_CUTTING:
            if len(rel.parts) > 1:
                problems.append(f"tests/{rel.as_posix()}/: a folder inside tests/{top}/")
        elif not (dse / rel / "__init__.py").is_file():
            problems.append(
                f"tests/{rel.as_posix()}/: no package dse/{rel.as_posix()}/ to mirror (a test "
                f"folder is named after the dse folder it tests; cross-cutting ones: "
                f"{', '.join(sorted(CROSS_CUTTING))})"
            )
    return problems


def owns_problems(dse: Path) -> list[str]:
    """Each folder of dse whose ``__init__`` docstring has no ``Owns:`` paragraph or leaves one
    of its modules or sub-packages unnamed (as ``name`` or ``name/``)."""
    problems: list[str] = []
    for init in sorted(dse.glob("*/__init__.py")):
        pkg = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(), str(init))) or ""
        if "Owns:" not in doc:
            problems.append(f"dse/{pkg.name}/__init__.py: no 'Owns:' in its docstring")
            continue
        members = {p.stem for p in pkg.glob("*.py") if not p.stem.startswith("__")}
        members |= {d.name for d in pkg.iterdir() if (d / "__init__.py").is_file()}
        missing = sorted(m for m in members if f"``{m}``" not in doc and f"``{m}/``" not in doc)
        if missing:
            problems.append(
                f"dse/{pkg.name}/__init__.py: its 'Owns:' does not name {', '.join(missing)}"
            )
    return problems


def test_the_test_tree_mirrors_dse() -> None:
    assert tree_problems(ROOT / "tests", ROOT / "dse") == []
    # every folder of dse with code of its own has its tests' folder
    packages = {p.parent.name for p in (ROOT / "dse").glob("*/__init__.py")}
    assert packages <= {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()}


def test_each_folder_of_dse_says_what_it_owns() -> None:
    assert owns_problems(ROOT / "dse") == []


def _touch(p: Path, text: str = "") -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_a_catch_all_or_a_folder_without_a_package_is_named(tmp_path: Path) -> None:
    dse, tests = tmp_path / "dse", tmp_path / "tests"
    for pkg in ("core", "model", "model/costmodel"):
        _touch(dse / pkg / "__init__.py")
    mirrored = [
        "conftest.py",
        "core/test_a.py",
        "core/golden/helper.py",
        "model/costmodel/test_b.py",
        "model/costmodel/data/x.jsonl",
        "project/test_docs.py",
        "bench/test_c.py",
        "fixtures/logs/x.log",
    ]
    for ok in mirrored:
        _touch(tests / ok)
    assert tree_problems(tests, dse) == []

    _touch(tests / "dse" / "test_mixed.py")
    _touch(tests / "helpers" / "test_loop.py")
    _touch(tests / "model" / "nothing" / "conftest.py")
    _touch(tests / "project" / "deeper" / "test_d.py")
    _touch(tests / "fixtures" / "test_e.py")
    _touch(tests / "test_top.py")
    found = tree_problems(tests, dse)
    assert [line.split(":")[0] for line in found] == [
        "tests/dse/",
        "tests/test_top.py",
        "tests/fixtures/",
        "tests/helpers/",
        "tests/model/nothing/",
        "tests/project/deeper/",
    ]
    assert "no package dse/helpers/" in found[3]

    # a tests/dse/ left with bytecode caches only (a branch switch) is no catch-all
    for p in _files(tests / "dse"):
        p.unlink()
    _touch(tests / "dse" / "__pycache__" / "test_mixed.cpython-311.pyc")
    assert "tests/dse/" not in [line.split(":")[0] for line in tree_problems(tests, dse)]


def test_a_folder_that_does_not_say_what_it_owns_is_named(tmp_path: Path) -> None:
    dse = tmp_path / "dse"
    _touch(dse / "core" / "__init__.py", '"""The vocabulary.\n\nOwns: ``records``, ``sub/``."""\n')
    _touch(dse / "core" / "records.py")
    _touch(dse / "core" / "sub" / "__init__.py", '"""A sub-package."""\n')
    _touch(dse / "stats" / "__init__.py", '"""Statistics, no list."""\n')
    assert owns_problems(dse) == ["dse/stats/__init__.py: no 'Owns:' in its docstring"]
    _touch(dse / "core" / "measure.py")
    assert owns_problems(dse)[0] == "dse/core/__init__.py: its 'Owns:' does not name measure"
