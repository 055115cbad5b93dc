"""A study's run settings: what ``dse resume`` / ``dse start`` may change between runs.

A study's *identity* (:meth:`dse.space.searchspace.SearchSpace.identity`: model, semantics,
resources,
knobs, constraints, objectives, trial kind, how a trial measures) fixes the meaning of its
trials. Its *run settings* (budget, agent, runner, workdir, parallelism, table path,
pre-screen, early stop of dominated trials) only say how the next run goes. The effective
run settings of the last run are stored with the study (attribute ``run_settings``), so
``dse resume`` continues with them unless told otherwise.

An imported study's run settings came from the export file, and an export is data from
elsewhere: its ``runner.python``, ``runner.workdir`` and ``workload.table`` are never run
unless the user confirms them (see :func:`untrusted_settings`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from dse.core.exceptions import DuplicatedStudyError, SpaceError
from dse.core.records import IMPORTED_ATTR
from dse.space.searchspace import (
    IDENTITY_FIELDS,
    RUNNER_OPTIONS,
    SearchSpace,
    parse_space,
    parse_space_text,
)

__all__ = [
    "RUN_SETTINGS_ATTR",
    "IMPORTED_ATTR",
    "RunOverrides",
    "run_settings",
    "with_run_settings",
    "apply_overrides",
    "check_same_identity",
    "identity_changes",
    "strip_imported",
    "effective_space",
    "IMPORT_SAFE_OPTIONS",
    "unconfirmed_options",
]

#: Study attribute holding the effective run settings of the last run.
RUN_SETTINGS_ATTR = "run_settings"


@dataclass(frozen=True)
class RunOverrides:
    """Run settings given on the command line (None: keep the stored / file value)."""

    n_trials: int | None = None
    agent: str | None = None
    runner: str | None = None
    workdir: str | None = None
    max_parallel: int | None = None

    def any(self) -> bool:
        return any(v is not None for v in vars(self).values())


def run_settings(space: SearchSpace) -> dict[str, Any]:
    """The run settings of ``space`` as JSON (what the study attribute stores)."""
    return {
        "budget": space.budget.model_dump(mode="json"),
        "agent": space.agent.model_dump(mode="json"),
        "runner": space.runner.model_dump(mode="json"),
        # the trial kind a run chose (dse start --workload sim on a recipe's space file): the
        # stored file keeps its own workload, and resume / a second start read it from here
        "workload": {
            "name": space.workload.name,
            "table": space.workload.table,
            "delay_s": space.workload.delay_s,
        },
        "prescreen": space.prescreen.model_dump(mode="json"),
        # measurement.prune / prune_margin: a pruned trial's figures are kept, and the trials
        # that finish mean the same with or without pruning (dse.stats.measure.MeasurementSpec)
        "measurement": space.measurement.model_dump(
            mode="json", include=set(space.measurement.RUN_FIELDS)
        ),
        "loss_parity": space.loss_parity.model_dump(mode="json"),
    }


def _rebuild(space: SearchSpace, data: dict[str, Any], source: str) -> SearchSpace:
    return parse_space(data, source)


def with_run_settings(space: SearchSpace, settings: dict[str, Any], source: str) -> SearchSpace:
    """``space`` with stored run ``settings`` put in place of its own (identity unchanged).

    Raises:
        SpaceError: the stored settings do not validate (names ``source``).
    """
    data = space.model_dump(mode="json")
    for key in ("budget", "agent", "runner", "prescreen", "loss_parity"):
        if isinstance(settings.get(key), dict):
            data[key] = settings[key]
    ms = settings.get("measurement")
    if isinstance(ms, dict):
        run_fields = space.measurement.RUN_FIELDS
        data["measurement"] = {
            **data["measurement"],
            **{k: ms[k] for k in run_fields if k in ms},
        }
    wl = settings.get("workload")
    if isinstance(wl, dict):
        data["workload"] = {
            **data["workload"],
            **{k: wl[k] for k in ("table", "delay_s") if k in wl},
        }
        name = wl.get("name")
        if isinstance(name, str) and name != data["workload"]["name"]:
            # a trial kind chosen on the command line (dse start --workload): a recipe's
            # launcher section belongs to the recipe workloads only
            data["workload"] = {**data["workload"], "name": name, "launcher": None}
    return _rebuild(space, data, source)


def effective_space(space_yaml: str, name: str, attrs: dict[str, Any]) -> SearchSpace:
    """The space a study's last run used: its stored space file with the stored run settings
    (``attrs``: the study's attributes) in place of the file's own (what ``dse best``, the
    API and ``dse status`` judge its trials with: the loss-parity guard, the re-measure
    budget).

    Raises:
        SpaceError: the stored space (or its stored settings) no longer validates.
    """
    import json

    stored = attrs.get(RUN_SETTINGS_ATTR)
    key = json.dumps(stored, sort_keys=True) if isinstance(stored, dict) else ""
    return _effective(space_yaml, name, key)


@functools.lru_cache(maxsize=64)
def _effective(space_yaml: str, name: str, settings_json: str) -> SearchSpace:
    # cached: a stored space never changes, and spaces are frozen
    import json

    space = parse_space_text(space_yaml, f"study {name!r}")
    if settings_json:
        space = with_run_settings(
            space, json.loads(settings_json), f"study {name!r} (stored run settings)"
        )
    return space


def apply_overrides(space: SearchSpace, ov: RunOverrides, source: str) -> SearchSpace:
    """``space`` with the command line's run settings applied (validated again)."""
    if not ov.any():
        return space
    data = space.model_dump(mode="json")
    if ov.n_trials is not None:
        data["budget"]["n_trials"] = ov.n_trials
    if ov.agent is not None:
        data["agent"]["name"] = ov.agent
    if ov.runner is not None:
        if ov.runner != data["runner"]["name"]:
            data["runner"]["options"] = {}  # another runner's options do not apply to this one
        data["runner"]["name"] = ov.runner
    if ov.workdir is not None:
        data["runner"]["workdir"] = ov.workdir
    if ov.max_parallel is not None:
        data["runner"]["max_parallel"] = ov.max_parallel
    return _rebuild(space, data, source)


def identity_changes(old: SearchSpace, new: SearchSpace) -> list[str]:
    """The identity fields that differ between two spaces (empty: the same study)."""
    a, b = old.identity(), new.identity()
    return [k for k in (*IDENTITY_FIELDS, "workload", "measurement") if a.get(k) != b.get(k)]


def check_same_identity(stored: SearchSpace, given: SearchSpace) -> None:
    """Refuse to run ``given`` as the stored study when its identity differs.

    Raises:
        DuplicatedStudyError: names the fields that differ.
    """
    diff = identity_changes(stored, given)
    if diff:
        raise DuplicatedStudyError(
            f"study {given.study!r} exists with a different space: {', '.join(diff)} "
            "differ (these change what its trials mean; budget, agent, runner, workdir, "
            "max-parallel and measurement.prune / prune_margin may change). Pick another "
            "study name or restore the original space file"
        )


#: Runner options an imported study may keep unconfirmed, per runner: an allow-list of
#: options that only size or pace the trials (counts, seconds, a placement strategy). Every
#: other option (a new one included until it is added here) says what runs or where (a
#: container image or mounts, scheduler flags, a partition, account or QOS, a time limit
#: written into the batch script, environment variables, a Ray cluster's address) and is
#: never used from an export unconfirmed.
IMPORT_SAFE_OPTIONS: dict[str, frozenset[str]] = {
    "local": frozenset(
        {"warm_workers", "warm_spare", "warm_max_trials", "warm_memory_slack_mib"}
    ),
    "ray": frozenset(
        {"gpus_per_node", "cpus_per_trial", "num_cpus", "num_gpus", "strategy", "queue_timeout_s"}
    ),
    "slurm": frozenset(
        {"gpus_per_node", "nodes", "cpus_per_task", "exclusive", "poll_interval_s",
         "queue_timeout_s"}
    ),
}  # fmt: skip


def unconfirmed_options(space: SearchSpace) -> dict[str, Any]:
    """The runner options of ``space`` an import may not use unconfirmed: those set to
    anything but their default and not in :data:`IMPORT_SAFE_OPTIONS`."""

    opts = space.runner.options
    model = RUNNER_OPTIONS[space.runner.name]
    safe = IMPORT_SAFE_OPTIONS.get(space.runner.name, frozenset())
    out: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        if name == "runner" or name in safe:
            continue
        value = getattr(opts, name)
        default = f.get_default(call_default_factory=True)
        if value != default:
            out[name] = value
    return out


def strip_imported(space: SearchSpace, ov: RunOverrides, source: str) -> SearchSpace:
    """An imported study's space with the export's interpreter and workdir replaced by local
    defaults (the controller's own Python; ``--workdir`` or ``dse_runs``).

    Raises:
        SpaceError: its workload reads a table or runs a recipe the export names, its
            environment is set by the export, or it sets a runner option not on the
            allow-list :data:`IMPORT_SAFE_OPTIONS` (a container, mounts, scheduler flags,
            a partition, variables, a Ray cluster); a local space file (``dse start
            --space``) or ``--trust-imported`` must confirm it.
    """
    data = space.model_dump(mode="json")
    named = {
        "workload.table": data["workload"].get("table"),
        "workload.launcher": data["workload"].get("launcher"),
        "env.fixed": (data.get("env") or {}).get("fixed") or None,
        "env.node_steps": (data.get("env") or {}).get("node_steps") or None,
    }
    for key, value in unconfirmed_options(space).items():
        named[f"runner.options.{key}"] = value
    code = [k for k, v in named.items() if v is not None]
    if code:
        raise SpaceError(
            f"study {space.study!r} was imported: its {', '.join(code)} come from the export "
            "file (programs, paths, environment) and are not used unconfirmed. Run it with a "
            "local space file of the same study (dse start --space FILE --study NAME), or "
            "pass --trust-imported to use the imported settings"
        )
    data["runner"]["python"] = None
    data["runner"]["workdir"] = ov.workdir or "dse_runs"
    data["runner"]["gpus"] = None
    return _rebuild(space, data, source)
