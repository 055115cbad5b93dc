"""The README's first set-up command installs what its Usage list runs (issue 29: `dse report`
needed the `report` extra, the default `dse bench` scipy from `gp`), and the README keeps
exactly two set-up commands (the demo, the tests)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
#: What a Usage command needs beyond the core install, by its extra.
NEEDS = {"dse report": "report", "dse bench": "gp", "dse serve": "api", "dse start": "megatron"}


def _section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert m is not None, title
    return m.group(1)


def test_the_first_set_up_command_installs_every_extra_the_usage_list_needs() -> None:
    setup = _section("Set up and run (fresh machine, Python 3.11)")
    blocks = re.findall(r"^```\n(.*?)^```", setup, re.S | re.M)
    assert len(blocks) == 2  # the demo and the tests, nothing else to type
    installed = re.search(r'-e "\.\[([a-z,]+)\]"', blocks[0])
    assert installed is not None, blocks[0]
    extras = set(installed.group(1).split(","))
    known = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras <= set(known)
    usage = _section("Usage")
    for command, extra in NEEDS.items():
        assert command in usage, command
        assert extra in extras, f"{command} needs the {extra!r} extra"
    # a tool outside dse that a Usage line names says how to get it
    listing = re.search(r"^```\n(.*?)^```", usage, re.S | re.M)
    assert listing is not None
    for line in listing.group(1).splitlines():
        if "optuna-dashboard" in line:
            assert "pip install optuna-dashboard" in line, line


def test_the_readme_is_a_front_door_and_its_links_lead_somewhere() -> None:
    """What dse is, how to install and run the demo and the tests, the commands, where to read
    next (issue 40); the manual's detail is in docs/. Every relative link of the README and of
    docs/*.md names a file that is there."""
    titles = re.findall(r"^## (.+)$", README, re.M)
    assert titles == [
        "Set up and run (fresh machine, Python 3.11)",
        "Usage",
        "Read next",
        "Where to read the code",
    ]
    assert len(README.splitlines()) < 150
    for page in ("docs/usage.md", "docs/interop.md", "docs/clusters.md", "docs/ARCHITECTURE.md"):
        assert f"]({page})" in README, page
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)}: {target}"
