"""The agent registry: every name of the vocabulary has a class; Optuna loads only on use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dse.agents import AGENTS, SpaceAgent, agent_class
from dse.core.exceptions import SpaceError
from dse.core.records import AGENT_NAMES


def test_every_agent_name_has_a_class() -> None:
    assert tuple(AGENTS) == AGENT_NAMES
    for name in AGENT_NAMES:
        assert issubclass(AGENTS[name], SpaceAgent)


def test_an_unknown_name_says_which_ones_exist() -> None:
    assert "tpee" not in AGENTS
    # a space-file error (exit 2 in the CLI), not a KeyError
    with pytest.raises(SpaceError, match=r"unknown agent 'tpee'; known agents: \['gp', "):
        agent_class("tpee")


def test_importing_the_package_does_not_import_optuna() -> None:
    code = (
        "import sys, dse.agents, dse.loop.proposer\n"
        "assert 'optuna' not in sys.modules, 'optuna imported'\n"
        "names = list(dse.agents.AGENTS)\n"
        "assert 'optuna' not in sys.modules, 'optuna imported by the names'\n"
        "dse.agents.TPEAgent\n"
        "print('optuna' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "True"
