"""pyproject.toml: the license as an SPDX expression (the table form is refused by
setuptools from February 2027), a setuptools that reads it, and the installed metadata."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.licenses import canonicalize_license_expression
from packaging.requirements import Requirement
from packaging.version import Version

from dse import DISTRIBUTION

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression() -> None:
    lic = PYPROJECT["project"]["license"]
    assert isinstance(lic, str), "license must be an SPDX string, not a table"
    assert canonicalize_license_expression(lic) == lic == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in PYPROJECT["project"].get("classifiers", []))


def test_build_backend_reads_spdx_licenses() -> None:
    reqs = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    setuptools = next(r for r in reqs if r.name == "setuptools")
    # PEP 639 license expressions: setuptools 77 and later
    assert not setuptools.specifier.contains(Version("76.9"))
    assert setuptools.specifier.contains(Version("77.0"))


def test_installed_metadata() -> None:
    assert PYPROJECT["project"]["name"] == DISTRIBUTION
    meta = distribution(DISTRIBUTION).metadata
    assert meta["License-Expression"] == "Apache-2.0"


def test_the_tests_read_no_table_outside_the_checkout() -> None:
    """The measured table the tests use ships in examples/tables/: no test reads (or skips
    for) ../shared/data, which a fresh clone does not have."""
    tests = Path(__file__).resolve().parents[1]
    offenders = [
        str(p.relative_to(tests))
        for p in tests.rglob("*.py")
        if "shared/data" in p.read_text() and p.name != Path(__file__).name
    ]
    assert offenders == []


def test_an_install_holds_every_file_of_the_source_tree(tmp_path: Path) -> None:
    # the source tree is the import tree: a plain (not editable) install of the checkout
    # carries every tracked file under dse/ (modules, the catalog's YAML, the migrations'
    # ini and templates, the dashboard's assets), and nothing the tree lacks
    root = Path(__file__).resolve().parents[2]
    tracked = subprocess.run(
        ["git", "ls-files", "dse"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    # built from a copy of the tracked files: a build/ folder left in the checkout by an
    # earlier build would hand its stale files to this one
    src = tmp_path / "src"
    for name in [*tracked, "pyproject.toml", "README.md"]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--no-build-isolation", "--no-cache-dir", "--target", str(tmp_path / "site"), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    site = tmp_path / "site"
    installed = sorted(
        str(p.relative_to(site)) for p in (site / "dse").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )  # fmt: skip
    assert installed == sorted(tracked)
