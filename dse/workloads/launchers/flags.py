"""A trial's launch flags for a recipe target: the one function that renders them.

``launch_flags(space, params, target)`` gives the knob part and the environment part of the
command a trial of ``params`` runs with on ``target`` (``megatron_lm``, ``bridge``, ``nemo``:
the launcher plugins of :data:`dse.core.registry.REGISTRY`; ``builtin``: dse's built-in trainer's
Megatron-LM command line), from that target's own table, the same code that renders the
launch command: a trial launched there carries exactly these words, and the environment
its ranks get (the launcher's own, the space's ``env.fixed``, the ``env.*`` knobs). A value
the target cannot express raises :class:`~dse.workloads.launchers._core.NotTaken` naming the
knob, the value and why (the nearest upstream setting where there is one); nothing is
translated silently. Inactive conditional knobs of the space pass nothing.

:func:`export_text` is what ``dse best --format megatron|bridge|nemo``, the API's
``exports`` and the report print: these flags as text, a value the target cannot express
refused with :class:`~dse.core.exceptions.NoEquivalentError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dse.core.exceptions import NoEquivalentError
from dse.core.registry import REGISTRY
from dse.space.knobs import trial_env
from dse.space.recipe_spec import LauncherSpec
from dse.workloads.launchers._core import NotTaken
from dse.workloads.launchers.megatron_lm import BUILTIN_MODULE

if TYPE_CHECKING:
    from dse.space.searchspace import SearchSpace

__all__ = ["TARGETS", "TARGET_TITLES", "LaunchFlags", "export_text", "launch_flags"]

#: The recipe targets a trial's flags render for.
TARGETS = ("megatron_lm", "bridge", "nemo", "builtin")
#: Each target as messages name it.
TARGET_TITLES = {
    "megatron_lm": "Megatron-LM",
    "bridge": "Megatron-Bridge",
    "nemo": "NeMo",
    "builtin": "dse's built-in trainer",
}


@dataclass(frozen=True)
class LaunchFlags:
    """The knob and environment part of a trial's launch command on one target."""

    target: str
    args: list[str]
    env: dict[str, str]

    def text(self) -> str:
        """``export`` lines of the environment, then the knob arguments on one line."""
        import shlex

        lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return "\n".join([*lines, " ".join(shlex.quote(a) for a in self.args)])


def launch_flags(space: SearchSpace, params: Mapping[str, Any], target: str) -> LaunchFlags:
    """The knob arguments and environment of a trial of ``params`` on ``target`` (raises
    NotTaken for a value the target cannot express, ValueError for an unknown target)."""

    if target not in TARGETS:
        raise ValueError(f"unknown recipe target {target!r}; known: {', '.join(TARGETS)}")
    own = space.workload.launcher
    if target == "builtin":
        name, spec = "megatron_lm", LauncherSpec(module=BUILTIN_MODULE)
    elif space.workload.name == target and own is not None:
        name, spec = target, own
    else:
        name, spec = target, LauncherSpec(recipe=own.recipe if own else None)
    sp = space.model_copy(
        update={"workload": space.workload.model_copy(update={"name": name, "launcher": spec})}
    )
    launcher = REGISTRY.get("launcher", name).load()(sp)
    full = dict(params)
    inactive = launcher.inactive_knobs(full)
    active = {k: v for k, v in full.items() if k not in inactive}
    env = {**launcher.base_env(), **trial_env(active, space.env.fixed)}  # as render() has it
    return LaunchFlags(target, launcher.knob_overrides(active), env)


def export_text(space: SearchSpace, params: Mapping[str, Any], target: str) -> str:
    """:meth:`LaunchFlags.text` of a trial of ``params`` on ``target``: the ``export`` lines of
    its environment, then its knob arguments, each word shell-quoted as the launch command
    quotes it (what ``dse best --format`` prints).

    Raises:
        NoEquivalentError: a value the target cannot express, naming the knob, the value,
            the target and why (the nearest upstream setting where there is one).
        ValueError: an unknown target.
    """

    try:
        return launch_flags(space, params, target).text()
    except NotTaken as e:
        raise NoEquivalentError(e.knob, e.value, TARGET_TITLES[target], e.why) from e
