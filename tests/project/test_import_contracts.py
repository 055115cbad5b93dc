"""The import contracts of pyproject.toml hold, and break on an upward import.

``scripts/lint_imports.py`` runs import-linter and the cycle check; here it runs on this
checkout (kept) and on a copy with one upward import injected (broken, naming the import).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "lint_imports.py"
FOLDERS = ("dse", "scripts")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def copy_checkout(dst: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "static", "*.pyc")
    for name in FOLDERS:
        shutil.copytree(REPO / name, dst / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", dst / "pyproject.toml")
    return dst


def test_the_contracts_are_kept() -> None:
    out = lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # the vocabulary reaching up into storage
        ("dse/core/records.py", "import dse.storage  # injected", "Vocabulary, space, model"),
        # inside a folder: the bottom of the vocabulary reaching up to a sibling above it
        (
            "dse/core/exceptions.py",
            "import dse.core.records  # injected",
            "dse.core: the vocabulary",
        ),
        # the proposer (bottom of the loop) reaching up to the controller
        ("dse/loop/proposer.py", "import dse.loop.study  # injected", "dse.loop: the controller"),
        # an agent importing a sibling layer (storage)
        ("dse/agents/_simple.py", "import dse.storage  # injected", "Layers"),
        # the controller importing the trainer
        ("dse/loop/study.py", "import dse.workloads.megatron.trainer  # injected", "trainer"),
        # a plugin reaching up to the composition root that names it
        ("dse/agents/_simple.py", "import dse.plugins  # injected", "The composition root"),
        # the plugin table naming a module that is not there: the plugin edges are in the graph
        (
            "dse/plugins.py",
            'PLUGINS = (*PLUGINS, _add("agent", "gone", "dse.agents._gone:GoneAgent", '
            '_AGENT_OPTIONS, "x"))  # injected',
            "Layers: the folders of dse, plugin edges included",
        ),
    ],
)
def test_an_upward_import_breaks_a_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    root = copy_checkout(tmp_path / "checkout")
    target = root / module
    target.write_text(target.read_text() + "\n" + line + "\n")
    out = lint(root)
    assert out.returncode != 0, out.stdout
    # a contract with ignored imports reads "... BROKEN (1 ignored import)"
    broken = [x for x in out.stdout.splitlines() if " BROKEN" in x]
    assert any(contract in x for x in broken), out.stdout


def test_a_module_without_a_place_in_its_folders_contract_breaks_it(tmp_path: Path) -> None:
    # each folder's contract is exhaustive: a new module must be given its layer
    root = copy_checkout(tmp_path / "checkout")
    (root / "dse" / "loop" / "newpart.py").write_text('"""A part nobody placed."""\n')
    out = lint(root)
    assert out.returncode != 0, out.stdout
    assert "dse.loop: the controller over its parts BROKEN" in out.stdout, out.stdout
    assert "dse.loop.newpart" in out.stdout


def test_no_two_dse_modules_import_each_other() -> None:
    out = lint(REPO)
    assert "0 import cycle(s) between the modules of dse" in out.stdout, out.stdout


@pytest.mark.parametrize(
    ("module", "line", "cycle"),
    [
        # the layout reaching back into the space that imports it (a type-only import counts)
        (
            "dse/space/layout.py",
            "import typing\nif typing.TYPE_CHECKING:\n"
            "    import dse.space.searchspace  # injected",
            "dse.space.layout <-> dse.space.searchspace",
        ),
        # a runner base importing a runner (inside a function: still a cycle)
        (
            "dse/runners/_base.py",
            "def _injected() -> None:\n    import dse.runners.local  # injected",
            "dse.runners._base <-> dse.runners.local",
        ),
    ],
)
def test_an_import_cycle_fails_the_check(
    tmp_path: Path, module: str, line: str, cycle: str
) -> None:
    root = copy_checkout(tmp_path / "checkout")
    target = root / module
    target.write_text(target.read_text() + "\n" + line + "\n")
    out = lint(root)
    assert out.returncode != 0, out.stdout
    found = [x for x in out.stdout.splitlines() if x.startswith("import cycle: ")]
    assert any(cycle in x for x in found), out.stdout
