"""The plugin registry is the one list of agents, runners, launchers and workloads: the
vocabulary's ``Literal``s, the space file's runner-options union, the CLI's choices, the
agent and runner factories, the launcher lookup and a trial's command are all read from it
or checked against it here."""

from __future__ import annotations

import argparse
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from dse.agents import AGENTS, SpaceAgent, create_agent
from dse.cli.main import build_parser
from dse.core.exceptions import SpaceError
from dse.core.records import AGENT_NAMES, RUNNER_NAMES, WORKLOAD_NAMES
from dse.core.registry import PLUGIN_KINDS, REGISTRY, DuplicatePluginError, Plugin, Registry
from dse.runners import RUNNERS, check_runner
from dse.space.recipe_spec import LAUNCHERS
from dse.space.searchspace import RUNNER_OPTIONS, RunnerOptions
from dse.workloads import trial_command
from dse.workloads.launchers import Launcher
from tests.conftest import small_space


def test_the_vocabulary_names_exactly_the_registered_plugins() -> None:
    assert REGISTRY.names("agent") == AGENT_NAMES
    assert REGISTRY.names("runner") == RUNNER_NAMES
    assert REGISTRY.names("workload") == WORKLOAD_NAMES
    # a launcher is a workload of the same name that runs it
    assert REGISTRY.names("launcher") == REGISTRY.names("workload", "launcher") == LAUNCHERS
    assert tuple(AGENTS) == AGENT_NAMES and tuple(RUNNERS) == RUNNER_NAMES


ALL = [p for kind in PLUGIN_KINDS for p in REGISTRY.entries(kind)]


@pytest.mark.parametrize("plugin", ALL, ids=lambda p: f"{p.kind}-{p.name}")
def test_every_entry_loads_and_names_its_options_model(plugin: Plugin) -> None:
    impl = plugin.load()
    assert isinstance(plugin.options_model(), type)
    assert issubclass(plugin.options_model(), BaseModel)
    if plugin.kind == "agent":
        assert issubclass(impl, SpaceAgent)
    elif plugin.kind == "launcher":
        assert issubclass(impl, Launcher) and impl.name == plugin.name
    else:
        assert callable(impl)
    if plugin.kind == "workload":
        assert impl.__name__ == "main" and impl.__module__ == plugin.module


def _union_members(annotated: Any) -> set[type]:
    union = get_args(annotated)[0]
    return set(get_args(union))


def test_the_space_files_runner_options_are_the_registered_models() -> None:
    want = {p.name: p.options_model() for p in REGISTRY.entries("runner")}
    assert dict(RUNNER_OPTIONS) == want
    assert _union_members(RunnerOptions) == set(want.values())


def _choices(parser: argparse.ArgumentParser, command: str, flag: str) -> tuple[str, ...]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if flag in a.option_strings)
    assert action.choices is not None
    return tuple(action.choices)


def test_the_cli_offers_the_registered_names() -> None:
    parser = build_parser()
    for command in ("start", "resume"):
        assert _choices(parser, command, "--agent") == REGISTRY.names("agent")
        assert _choices(parser, command, "--runner") == REGISTRY.names("runner")
    # --workload swaps the trial kind of a space; a recipe launcher needs its own section
    builtin = tuple(n for n in REGISTRY.names("workload") if n not in LAUNCHERS)
    assert _choices(parser, "start", "--workload") == builtin


def test_a_duplicate_name_is_refused_naming_both() -> None:
    reg = Registry()
    reg.add(Plugin("runner", "local", "a.b:c", "d.e:F", "one"))
    with pytest.raises(DuplicatePluginError, match=r"runner 'local' is registered twice \(a.b:c"):
        reg.add(Plugin("runner", "local", "x.y:z", "d.e:F", "two"))
    # the same name under another kind is another plugin
    reg.add(Plugin("workload", "local", "x.y:z", "d.e:F", "three"))
    assert reg.names("runner") == reg.names("workload") == ("local",)


def test_bad_entries_are_refused() -> None:
    reg = Registry()
    with pytest.raises(ValueError, match="unknown traits"):
        reg.add(Plugin("agent", "a", "m:c", "m:O", "", frozenset({"hint"})))
    with pytest.raises(ValueError, match="is not module:attr"):
        reg.add(Plugin("agent", "a", "m.c", "m:O", ""))


def test_an_unknown_name_is_a_space_error_naming_the_field_and_the_known_ones() -> None:
    with pytest.raises(SpaceError, match=r"agent.name: unknown agent 'tpee'; known agents: \["):
        REGISTRY.get("agent", "tpee", "agent.name")
    space = small_space("reg", {"micro_batch_size": {"values": [1, 2]}})
    bad = space.model_copy(update={"agent": space.agent.model_copy(update={"name": "tpee"})})
    with pytest.raises(SpaceError, match="unknown agent 'tpee'"):
        create_agent(bad)
    bad = space.model_copy(update={"runner": space.runner.model_copy(update={"name": "k8s"})})
    with pytest.raises(SpaceError, match="k8s"):
        check_runner(bad)
    with pytest.raises(SpaceError, match="workload.name: unknown workload 'jax'"):
        trial_command("jax", "trial.json", world_size=1)


def test_a_trial_command_follows_the_workloads_entry() -> None:
    for name in REGISTRY.names("workload"):
        plugin = REGISTRY.get("workload", name)
        argv = trial_command(name, "trial.json", world_size=2, python="py")
        assert argv[-3:] == [plugin.module, "--spec", "trial.json"]
        assert ("--nproc-per-node=2" in argv) == ("torchrun" in plugin.traits)


def test_a_hidden_plugin_is_absent_and_comes_back_in_its_place() -> None:
    with REGISTRY.hidden("runner", "slurm"):
        assert "slurm" not in REGISTRY.names("runner") and "slurm" not in RUNNERS
        with pytest.raises(SpaceError, match="unknown runner 'slurm'"):
            REGISTRY.get("runner", "slurm")
    assert REGISTRY.names("runner") == RUNNER_NAMES


def test_the_registry_is_the_composition_roots_table() -> None:
    """The table lives in dse.plugins (above the plugins); importing dse registered it."""
    from dse import plugins

    assert [(p.kind, p.name) for p in plugins.PLUGINS] == [(p.kind, p.name) for p in ALL]
    assert plugins.register() is REGISTRY  # a second registration adds nothing
    assert [(p.kind, p.name) for kind in PLUGIN_KINDS for p in REGISTRY.entries(kind)] == [
        (p.kind, p.name) for p in ALL
    ]
    fresh = plugins.register(Registry())
    assert fresh.names("agent") == REGISTRY.names("agent")
    assert fresh.names("workload", "launcher") == LAUNCHERS
