"""The registry of dse's plugins: agents, runners, recipe launchers and workloads.

This module holds the :class:`Registry` and its one instance, :data:`REGISTRY`; the table of
entries is the composition root :mod:`dse.plugins` (above the plugins it names), which fills
it when the ``dse`` package is imported. Each entry names its kind, its name (what a space
file writes: ``agent.name``, ``runner.name``, ``workload.name``), where its implementation
lives (``module:attribute``, imported only when asked for, so that naming the plugins imports
neither Optuna nor Ray nor torch), the pydantic model that validates its options in a space
file, and its traits. Everything that lists plugins reads :data:`REGISTRY`: the agent factory,
the runner factory, the launcher lookup, a trial's command line, the space file's launcher
names. The closed vocabularies of :mod:`dse.core.records` (``AgentName``, ``RunnerName``,
``WorkloadName``), the space file's runner-options union and the CLI's choices are checked
against it by ``tests/core/test_registry.py``.

To add a plugin: one line in :data:`dse.plugins.PLUGINS`, its name in the matching ``Literal``
of :mod:`dse.core.records`, and (a runner) its options model in :mod:`dse.space.searchspace`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from dse.core.exceptions import DSEError, SpaceError

__all__ = [
    "PLUGIN_KINDS",
    "Plugin",
    "PluginKind",
    "Registry",
    "DuplicatePluginError",
    "REGISTRY",
]

PluginKind = Literal["agent", "runner", "launcher", "workload"]
PLUGIN_KINDS: tuple[PluginKind, ...] = ("agent", "runner", "launcher", "workload")

#: Traits an entry may carry (a closed set: a typo is refused at registration).
#: ``hints`` (agent): takes the knob-semantics prior and the cost model's hints;
#: ``trains`` (workload): runs real training on the space's device (others are CPU processes);
#: ``torchrun`` (workload): its trial process is started under torchrun, one per rank;
#: ``launcher`` (workload): runs a user's recipe through the launcher of the same name.
TRAITS = frozenset({"hints", "trains", "torchrun", "launcher"})


class DuplicatePluginError(DSEError):
    """A plugin name registered twice for one kind."""


@dataclass(frozen=True)
class Plugin:
    """One registry entry.

    Attributes:
        kind: agent, runner, launcher or workload.
        name: the name a space file uses.
        target: ``module:attribute`` of the implementation (an agent or launcher class, a
            runner factory ``space -> BaseRunner``, a workload's trial-process ``main``).
        options: ``module:attribute`` of the pydantic model that validates the entry's
            section of a space file (``agent``, ``runner.options``, ``workload.launcher``,
            ``workload``).
        description: one line for listings.
        traits: see :data:`TRAITS`.
    """

    kind: PluginKind
    name: str
    target: str
    options: str
    description: str
    traits: frozenset[str] = field(default_factory=frozenset)

    @property
    def module(self) -> str:
        """The module of the implementation (a trial process runs ``python -m`` it)."""
        return self.target.split(":", 1)[0]

    def load(self) -> Any:
        """The implementation (its module imported now)."""
        return _resolve(self.target)

    def options_model(self) -> Any:
        """The pydantic model of the entry's options (its module imported now)."""
        return _resolve(self.options)


def _resolve(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


class Registry:
    """Plugins by kind and name, in registration order."""

    def __init__(self) -> None:
        self._entries: dict[tuple[PluginKind, str], Plugin] = {}
        self._hidden: set[tuple[PluginKind, str]] = set()

    def add(self, plugin: Plugin) -> Plugin:
        """Register ``plugin``.

        Raises:
            DuplicatePluginError: its kind already has a plugin of that name.
            ValueError: an unknown kind or trait, or a target not written ``module:attr``.
        """
        if plugin.kind not in PLUGIN_KINDS:
            raise ValueError(f"unknown plugin kind {plugin.kind!r}; kinds: {list(PLUGIN_KINDS)}")
        bad = sorted(plugin.traits - TRAITS)
        if bad:
            raise ValueError(f"{plugin.kind} {plugin.name!r}: unknown traits {bad}")
        for what, ref in (("target", plugin.target), ("options", plugin.options)):
            if ref.count(":") != 1 or not all(ref.split(":")):
                raise ValueError(
                    f"{plugin.kind} {plugin.name!r}: {what} {ref!r} is not module:attr"
                )
        key = (plugin.kind, plugin.name)
        if key in self._entries:
            raise DuplicatePluginError(
                f"{plugin.kind} {plugin.name!r} is registered twice "
                f"({self._entries[key].target} and {plugin.target})"
            )
        self._entries[key] = plugin
        return plugin

    def entries(self, kind: PluginKind) -> tuple[Plugin, ...]:
        """The plugins of ``kind``, in registration order."""
        return tuple(
            p for key, p in self._entries.items() if key[0] == kind and key not in self._hidden
        )

    def names(self, kind: PluginKind, trait: str | None = None) -> tuple[str, ...]:
        """The names of ``kind`` (those with ``trait`` when given), in registration order."""
        return tuple(p.name for p in self.entries(kind) if trait is None or trait in p.traits)

    def __contains__(self, key: object) -> bool:
        return key in self._entries and key not in self._hidden

    @contextmanager
    def hidden(self, kind: PluginKind, name: str) -> Iterator[None]:
        """While in the block, plugin ``name`` of ``kind`` is not there (an installation
        without it: what ``dse validate`` and ``dse start`` then say); its place in the
        order is kept."""
        key = (kind, name)
        if key not in self._entries:
            raise KeyError(f"no {kind} {name!r} to hide")
        self._hidden.add(key)
        try:
            yield
        finally:
            self._hidden.discard(key)

    def get(self, kind: PluginKind, name: str, where: str = "") -> Plugin:
        """The plugin ``name`` of ``kind``.

        Raises:
            SpaceError: no such plugin; names ``where`` (the space-file field) and the known ones.
        """
        try:
            if (kind, name) in self._hidden:
                raise KeyError(name)
            return self._entries[(kind, name)]
        except KeyError:
            at = f"{where}: " if where else ""
            raise SpaceError(
                f"{at}unknown {kind} {name!r}; known {kind}s: {sorted(self.names(kind))}"
            ) from None


#: Every plugin dse ships, filled by the composition root :mod:`dse.plugins` when the ``dse``
#: package is imported (this module lists none: the plugins live above it).
REGISTRY: Registry = Registry()
