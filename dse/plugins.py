"""The composition root: the table of every plugin dse ships (agents, runners, recipe
launchers, workloads), above the plugins it names.

Each entry gives a plugin's kind and name, where its implementation lives (``module:attribute``,
imported only when asked for, so that listing the plugins imports neither Optuna nor Ray nor
torch), the pydantic model of its options and its traits (:class:`dse.core.registry.Plugin`).
Importing the ``dse`` package registers them in :data:`dse.core.registry.REGISTRY`, which every
reader asks (the agent factory, the runner factory, the launcher lookup, a trial's command line,
the space file's launcher names, the CLI's choices). No module of dse imports this one (the
contract "The composition root" of pyproject.toml); the contract "Plugin edges" checks every
``module`` an entry names as an import of this module, under the layers of dse.

To add a plugin: one line below, its name in the matching ``Literal`` of
:mod:`dse.core.records`, and (a runner) its options model in :mod:`dse.space.searchspace`.
"""

from __future__ import annotations

from dse.core.registry import REGISTRY, Plugin, PluginKind, Registry

__all__ = ["PLUGINS", "register"]


def _add(
    kind: PluginKind, name: str, target: str, options: str, description: str, *traits: str
) -> Plugin:
    return Plugin(kind, name, target, options, description, frozenset(traits))


_AGENT_OPTIONS = "dse.space.searchspace:AgentSpec"
_WORKLOAD_OPTIONS = "dse.space.searchspace:WorkloadSpec"
_LAUNCHER_OPTIONS = "dse.space.recipe_spec:LauncherSpec"
_RUN = "dse.workloads.launchers.run:main"

#: Every plugin dse ships, in registration order (the order listings and choices show).
PLUGINS: tuple[Plugin, ...] = (
    _add("agent", "tpe", "dse.agents._optuna:TPEAgent", _AGENT_OPTIONS,
         "Optuna TPE (multivariate, grouped)", "hints"),
    _add("agent", "gp", "dse.agents._optuna:GPAgent", _AGENT_OPTIONS,
         "Optuna Gaussian-process sampler", "hints"),
    _add("agent", "nsga2", "dse.agents._optuna:NSGA2Agent", _AGENT_OPTIONS,
         "Optuna NSGA-II (several objectives)", "hints"),
    _add("agent", "random", "dse.agents._simple:RandomAgent", _AGENT_OPTIONS,
         "uniform random sampling"),
    _add("agent", "grid", "dse.agents._simple:GridAgent", _AGENT_OPTIONS,
         "every configuration, in order"),
    _add("runner", "local", "dse.runners._registry:local_runner",
         "dse.space.searchspace:LocalOptions", "process pool on this machine"),
    _add("runner", "ray", "dse.runners.ray_runner:make_runner",
         "dse.space.searchspace:RayOptions", "a Ray cluster (placement group per trial)"),
    _add("runner", "slurm", "dse.runners.slurm_runner:make_runner",
         "dse.space.searchspace:SlurmOptions", "Slurm batch jobs"),
    _add("launcher", "bridge", "dse.workloads.launchers.bridge:BridgeLauncher",
         _LAUNCHER_OPTIONS, "Megatron-Bridge run_recipe.py with ConfigContainer overrides"),
    _add("launcher", "nemo", "dse.workloads.launchers.nemo:NemoLauncher",
         _LAUNCHER_OPTIONS, "NeMo 2.0 recipe through NeMo-Run overrides"),
    _add("launcher", "megatron_lm", "dse.workloads.launchers.megatron_lm:MegatronLMLauncher",
         _LAUNCHER_OPTIONS, "Megatron-LM pretrain_gpt.py with its flags"),
    _add("workload", "megatron", "dse.workloads.megatron.trainer:main", _WORKLOAD_OPTIONS,
         "the built-in Megatron-Core trainer", "trains", "torchrun"),
    _add("workload", "replay", "dse.workloads.replay:main", _WORKLOAD_OPTIONS,
         "replay of a measured table"),
    _add("workload", "sim", "dse.workloads.sim:main", _WORKLOAD_OPTIONS,
         "the cost model's simulator"),
    _add("workload", "bridge", _RUN, _LAUNCHER_OPTIONS,
         "a Megatron-Bridge recipe", "trains", "launcher"),
    _add("workload", "nemo", _RUN, _LAUNCHER_OPTIONS,
         "a NeMo 2.0 recipe", "trains", "launcher"),
    _add("workload", "megatron_lm", _RUN, _LAUNCHER_OPTIONS,
         "a Megatron-LM command line", "trains", "launcher"),
)  # fmt: skip


def register(registry: Registry = REGISTRY) -> Registry:
    """Add :data:`PLUGINS` to ``registry`` (once: a registry that has them all is left as it
    is) and return it."""
    if all((p.kind, p.name) in registry for p in PLUGINS):
        return registry
    for p in PLUGINS:
        registry.add(p)
    return registry
