"""The ``dse`` command line.

Exit codes: 0 ok, 2 bad input (space file, arguments, unknown study), 1 anything else.
First-party imports are at module level, except the few that bring a stack or a folder the
command line's start does not need: the cost model (numpy), the API (FastAPI), storage
(SQLAlchemy), the controller (``dse.loop``), the agents, the runners, the launchers and the
Optuna export, each imported inside the command that uses it (``bench/cli_startup.py``
measures the start: BENCHMARKS 34).
Heavy imports (torch, megatron, ray, fastapi) happen only inside the commands that need them.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dse import install_hint
from dse.agents import create_agent
from dse.cli import bench
from dse.cli import interop as interop_cli
from dse.cli import recipe as recipe_cli
from dse.cli.recipe import check_recipe, dry_run
from dse.core.bounds import MAX_EXPORT_BYTES, printable
from dse.core.exceptions import (
    DSEError,
    DuplicatedStudyError,
    NoCompleteTrialError,
    SpaceError,
    StorageError,
    StorageURLError,
    StudyFormatError,
    StudyNotFoundError,
)
from dse.core.figures import figure
from dse.core.names import display_name, study_name_problem
from dse.core.records import BEST_FORMATS, IMPORTED_ATTR, VERIFY_ATTR, StudyRecord
from dse.core.registry import REGISTRY
from dse.interop.optuna_export import export_to_optuna, follow_study
from dse.loop.loss_guard import LOSS_PARITY_ATTR
from dse.loop.proposer import cost_model_memory_hint, cost_model_speed_hint
from dse.loop.reconcile import Owner
from dse.loop.study import StudyRunner, detect_trial_features
from dse.loop.verify import verify_study, verify_table
from dse.model import rules
from dse.model.rules import check_space
from dse.results.best_formats import best_payload, best_space, noise_payload, render_best
from dse.results.gpu_usage import study_gpu_usage_of
from dse.results.noise import configuration_intervals, estimate_public, study_best
from dse.results.run_settings import (
    RUN_SETTINGS_ATTR,
    RunOverrides,
    apply_overrides,
    effective_space,
    strip_imported,
    with_run_settings,
)
from dse.results.trust import trust_label, trust_summary
from dse.runners import check_runner, make_runner
from dse.space.searchspace import load_space, parse_space, parse_space_text
from dse.storage.locate import DEFAULT_STORAGE
from dse.storage.locate import open_existing as _open_existing
from dse.storage.locate import pick_study as _pick_study
from dse.storage.locate import storage_url as _storage_url
from dse.workloads.launchers.flags import export_text

if TYPE_CHECKING:  # SQLAlchemy: loaded where a command opens its database
    from dse.storage import Storage

__all__ = ["main", "build_parser", "best_payload", "render_best"]


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _err(text: str) -> None:
    # a message may quote its input: never send its control characters to the terminal
    sys.stderr.write(f"dse: {printable(text)}\n")


# --- validate -----------------------------------------------------------------------------
#: Knob values that no configuration can use, named one per line by ``dse validate``.
UNUSABLE_SHOWN = 20


def cmd_validate(args: argparse.Namespace) -> int:
    space = load_space(args.space)
    check_runner(space, args.space)
    got = check_space(space, args.space)
    check_recipe(space, args.space)
    if got.complete:
        counted = f"{got.looked_at} configurations, {got.valid} pass the rules"
    else:
        share = got.valid / got.looked_at if got.looked_at else 0.0
        counted = (
            f"{got.combinations} knob combinations, more than the {rules.CHECK_SPACE_CAP} the "
            f"check looks at (the cap): of a random sample of {got.looked_at} configurations, "
            f"{got.valid} ({share:.1%}) pass the rules, about {got.estimated_valid} valid "
            "configurations in all (an estimate)"
        )
    _out(
        f"{args.space}: ok: study {space.study!r}, {len(space.knobs)} knobs, "
        f"{counted}; baseline {json.dumps(space.baseline())}"
    )
    for u in got.unusable[:UNUSABLE_SHOWN]:
        _err(f"warning: {args.space}: {u}")
    if len(got.unusable) > UNUSABLE_SHOWN:
        _err(f"warning: {args.space}: {len(got.unusable) - UNUSABLE_SHOWN} more such values")
    return 0


# --- start / resume -----------------------------------------------------------------------
def _overrides(args: argparse.Namespace) -> Any:
    return RunOverrides(
        n_trials=getattr(args, "n_trials", None),
        agent=getattr(args, "agent", None),
        runner=getattr(args, "runner", None),
        workdir=getattr(args, "workdir", None),
        max_parallel=getattr(args, "max_parallel", None),
    )


def _make_cost_model(space: Any) -> Any:
    from dse.model.costmodel import CostModel  # numpy
    from dse.model.costmodel.memory import Coefficients

    co = Coefficients.from_dict(space.prescreen.coefficients)
    return CostModel(space.model, space.semantics, space.resources, co)


def _run_study(space: Any, space_yaml: str, args: argparse.Namespace) -> int:
    import signal
    import time

    from dse.storage import open_storage  # SQLAlchemy: imported when a command uses it

    url = _storage_url(args, space.storage)
    storage = open_storage(url)
    caught: list[int] = []
    try:
        runner = make_runner(space)
        # the runner's devices are held from here; warm workers import while the trial
        # environment is probed and the agent is built
        owner, held_since = Owner.new(runner.host), time.time()
        runner.prepare(str(owner))
        try:
            features = detect_trial_features(space, space.runner.python)
            cost_model = _make_cost_model(space)
            agent = create_agent(
                space,
                cost_model_memory_hint(space, cost_model),
                cost_model_speed_hint(space, cost_model),
            )
        except BaseException:
            runner.close()
            raise
        study = StudyRunner(
            space,
            storage=storage,
            runner=runner,
            agent=agent,
            space_yaml=space_yaml,
            features=features,
            cost_model=cost_model,
            owner=owner,
            held_since=held_since,
        )

        def on_signal(signum: int, _frame: Any) -> None:
            # SIGINT, SIGTERM, SIGHUP alike: stop the loop (trials killed and re-queued, the
            # study left 'stopped'); a second signal while stopping interrupts the stop itself
            if study.stop_requested is not None:
                raise KeyboardInterrupt
            caught.append(signum)
            study.request_stop(f"signal {signal.Signals(signum).name}")

        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, on_signal) for sig in handled}
        try:
            result = study.run()
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
    finally:
        storage.close()
    if caught:
        return 128 + caught[0]
    if result.stop_kind == "launch":
        return 1
    return 130 if result.stopped and result.stop_kind == "request" else 0


def cmd_start(args: argparse.Namespace) -> int:
    space = load_space(args.space)
    if args.study:
        data = space.model_dump(mode="json")
        data["study"] = args.study
        space = parse_space(data, f"{args.space} (--study)")
    if getattr(args, "workload", None):
        # the trial kind (part of the study's identity); a recipe's launcher section belongs
        # to the recipe workloads only
        data = space.model_dump(mode="json")
        data["workload"] = {**data["workload"], "name": args.workload, "launcher": None}
        space = parse_space(data, f"{args.space} (--workload)")
    space = apply_overrides(space, _overrides(args), args.space)
    check_space(space, args.space, count=False)  # the baseline; counting is validate's job
    check_recipe(space, args.space)
    if getattr(args, "dry_run", None):  # renders what a runner would run; runs nothing
        _out(dry_run(space, args.dry_run))
        return 0
    check_runner(space, args.space)
    if space.workload.name == "sim":
        sys.stderr.write(
            "workload sim: trials run on the cost model; every figure is an estimate, "
            "not a measurement\n"
        )
    # the space file as written; a --workload choice is stored with the run settings
    return _run_study(space, Path(args.space).read_text(), args)


def cmd_resume(args: argparse.Namespace) -> int:
    storage = _open_existing(args)
    try:
        rec = _pick_study(storage, args.study)
        attrs = storage.get_study_attrs(rec.id)
    finally:
        storage.close()
    source = f"study {rec.name!r} (stored space)"
    space = parse_space_text(rec.space_yaml, source)
    if space.study != rec.name:
        data = space.model_dump()
        data["study"] = rec.name
        space = parse_space(data, source)
    stored = attrs.get(RUN_SETTINGS_ATTR)
    if isinstance(stored, dict):
        space = with_run_settings(space, stored, f"study {rec.name!r} (stored run settings)")
    ov = _overrides(args)
    if attrs.get(IMPORTED_ATTR) and not args.trust_imported:
        space = strip_imported(space, ov, source)
        _err(
            f"study {display_name(rec.name)!r} was imported: trials run with this "
            f"installation's Python in {space.runner.workdir} (--trust-imported keeps the "
            "export's runner.python and workdir)"
        )
    space = apply_overrides(space, ov, source)
    check_runner(space, source)
    return _run_study(space, rec.space_yaml, args)


# --- status / best ------------------------------------------------------------------------
def _trial_json(t: Any) -> dict[str, Any]:
    return {
        "number": t.number,
        "state": t.state,
        "params": t.params,
        "value": t.value,
        "metrics": {k: v for k, v in t.metrics.items() if k != "losses"},
        "failure_class": t.failure_class,
        "reason": t.reason,
        "source": t.source,
        "numerics": t.metrics.get("numerics"),
        "remeasure_of": t.remeasure_of,
    }


def _verify_summary(v: dict[str, Any] | None) -> dict[str, Any] | None:
    """The last ``dse verify`` of a study as ``dse status`` shows it (None: never run)."""
    if not v:
        return None
    keys = ("best_trial", "steps", "verdict", "reasons", "loss_drift")
    return {k: v.get(k) for k in keys}


def _study_status(storage: Storage, st: StudyRecord) -> dict[str, Any]:
    """One study's ``dse status`` record (the JSON format; the text is made from it)."""

    trials = storage.list_trials(st.id)
    intervals: dict[int, Any] = {}
    attrs = storage.get_study_attrs(st.id)
    numerics = storage.count_numerics(st.id)
    remeasure = numerics.pop("remeasure")
    best: Any = None
    noise: dict[str, Any] | None = None
    try:
        space = effective_space(st.space_yaml, st.name, attrs)
        nb = study_best(storage, st, space)
    except SpaceError:  # a stored space that no longer loads: the plain best
        best = storage.best_trial(st.id, st.direction, exclude_changed=True)
    else:
        if nb is not None:
            best = nb.best.trial or storage.get_trial_by_number(st.id, nb.best.number)
            noise = noise_payload(nb)
            # each trial's configuration with THE interval (the trials table's)
            est = configuration_intervals(storage, st, space, trials, best=nb)
            intervals = {n: estimate_public(c) for n, c in est.items()}
    return {
        "study": st.name,
        "state": st.state,
        "metric": st.metric,
        "direction": st.direction,
        "counts": storage.count_trials(st.id),
        "rejections": storage.count_rejections(st.id),
        "gpu": study_gpu_usage_of(storage, st),
        "numerics": {
            "counts": numerics,
            "remeasure_trials": remeasure,
            "guard": attrs.get(LOSS_PARITY_ATTR),
        },
        "verify": _verify_summary(attrs.get(VERIFY_ATTR)),
        "best": None if best is None else {**_trial_json(best), "noise": noise},
        "trials": [{**_trial_json(t), "interval": intervals.get(t.number)} for t in trials],
        "trust": trust_summary([_trial_json(t) for t in trials], st.metric, st.direction),
    }


def cmd_status(args: argparse.Namespace) -> int:
    storage = _open_existing(args)
    try:
        studies = [storage.get_study(args.study)] if args.study else storage.list_studies()
        if not studies:
            raise StudyNotFoundError(f"no study in {storage!r}")
        out = [_study_status(storage, st) for st in studies]
    finally:
        storage.close()
    if args.format == "json":
        _out(json.dumps(out[0] if args.study or len(out) == 1 else out, indent=2))
        return 0
    for s in out:
        c = s["counts"]
        _out(
            f"study {display_name(s['study'])} [{s['state']}]: {c.get('total', 0)} trials "
            f"({c.get('complete', 0)} complete, {c.get('running', 0)} running, "
            f"{c.get('failed', 0)} failed, {c.get('infeasible', 0)} infeasible, "
            + (f"{c['pruned']} pruned, " if c.get("pruned") else "")
            + f"{c.get('queued', 0)} queued), {sum(s['rejections'].values())} rejected before "
            "launch"
        )
        _out(_gpu_text(s["gpu"]))
        if s["trials"]:
            _out(_status_text(s))
        v = s.get("verify")
        if v:
            why = "" if v["verdict"] == "verified" else ": " + "; ".join(v["reasons"])
            _out(f"  verify (trial {v['best_trial']}, {v['steps']} steps): {v['verdict']}{why}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    storage = _open_existing(args)
    try:
        st = _pick_study(storage, args.study)
        _err(f"verifying study {st.name!r}: {args.steps} steps of the best and the baseline")
        result = verify_study(storage, st, args.steps)
    finally:
        storage.close()
    if args.format == "json":
        _out(json.dumps(result, indent=1))
    else:
        _out(verify_table(result))
    return 0 if result["verdict"] == "verified" else 1


def _pct(x: Any) -> str:
    return "-" if not isinstance(x, int | float) else f"{100 * x:.3g}%"


def _numerics_text(s: dict[str, Any]) -> str | None:
    """The loss-parity line of ``dse status`` (None when the guard judged nothing)."""
    n = s["numerics"]
    c, g = n["counts"], n["guard"]
    if not any(c.values()) and not n["remeasure_trials"]:
        return None
    line = (
        f"  loss parity: {c.get('ok', 0)} ok, {c.get('changed', 0)} numerics changed, "
        f"{c.get('unchecked', 0)} unchecked"
    )
    if isinstance(g, dict):
        base = g.get("baseline_trial")
        line += f"; baseline trial {base if base is not None else '- (none complete yet)'}"
        line += f", tolerance {_pct(g.get('tolerance'))} (floor {_pct(g.get('floor'))}"
        noise = g.get("noise")
        line += (
            f", noise {_pct(noise)} from {g.get('noise_pairs', 0)} repeat(s))"
            if noise is not None
            else ", no repeat measured yet)"
        )
    if n["remeasure_trials"]:
        line += f"; {n['remeasure_trials']} re-measurement trial(s)"
    if any(t.get("source") == "estimate" for t in s["trials"]):
        line += "; losses of sim trials are simulated (cost model), not trained"
    return line


def _gpu_text(g: dict[str, Any]) -> str:
    """A study's GPU time (dse.results.gpu_usage): spent, split, busy fraction, grid saving."""

    busy = g["busy_fraction"]
    busy_txt = "-" if busy is None else f"{busy:.0%}"
    shares = _busy_shares_text(g)
    if g["device"] != "cuda":
        return (
            f"  device time (cpu): busy {busy_txt} of the held rank-seconds "
            f"({figure(g['device_seconds_measure'])} s in training steps of "
            f"{figure(g['device_seconds_held'])} s held){shares}"
        )
    line = (
        f"  GPU-hours: {figure(g['gpu_hours'])} spent (startup "
        f"{figure(g['gpu_hours_startup'])}, measure {figure(g['gpu_hours_measure'])}), "
        f"{figure(g['held_gpu_hours'])} held, GPU-busy {busy_txt} (all steps){shares}"
    )
    if g["saved_gpu_hours"] is not None:
        grid = ("" if g["grid_complete"] else "about ") + f"{g['grid_configurations']}"
        line += (
            f"; whole grid ({grid} configurations) {figure(g['grid_gpu_hours'])} "
            f"(estimate), saved {figure(g['saved_gpu_hours'])} (estimate)"
        )
    return line


def _busy_shares_text(g: dict[str, Any]) -> str:
    """``; measured steps 71% of the held time, builds and all steps 80%; first step ...``
    (dse.results.gpu_usage.busy_shares), or "" when not known."""

    meas, kern = g.get("measured_fraction"), g.get("kernel_fraction")
    if meas is None:
        return ""
    text = f"; measured steps {meas:.0%} of the held time"
    if kern is not None:
        text += f", builds and all steps {kern:.0%}"
    if g.get("first_step_s_median") is not None:
        text += (
            f"; first step per trial median {figure(g['first_step_s_median'])} s, max "
            f"{figure(g['first_step_s_max'])} s (apart from the measured steps)"
        )
    acc = g.get("accounting")
    if acc:
        parts = ", ".join(
            f"{k.replace('_', ' ')} {figure(acc['seconds'][k])} s ({acc['shares'][k]:.0%}; "
            f"{figure(acc['per_trial_s'][k])} s/trial)"
            for k in acc["seconds"]
        )
        text += f"\n  held time by part ({figure(acc['held_s'])} device-s): {parts}"
    return text


def _pooled(noise: dict[str, Any], metric: str, metrics: dict[str, Any]) -> Any:
    """The best's figure of ``metric`` as every view shows it: pooled over its runs where the
    noise-aware best pooled it, else the trial's own."""
    fig = (noise.get("figures") or {}).get(metric) or {}
    return fig.get("value", metrics.get(metric))


def _trust_text(s: dict[str, Any]) -> list[str]:
    """The trust of a study's estimates: the best calibrated or interpolated estimate beside
    an extrapolated best (dse.results.trust)."""

    tr = s.get("trust")
    if not tr:
        return []
    counts = ", ".join(f"{n} {label}" for label, n in sorted(tr["counts"].items()))
    lines = [f"  estimates' trust: {counts} (dse/model/costmodel/basis.py)"]
    best, trusted = tr["best"], tr["trusted_best"]
    if best and best["label"] == "extrapolated":
        lines.append(
            f"  the highest estimate, trial {best['number']} ({figure(best['value'])}), is "
            f"EXTRAPOLATED (outside every measured range: {best['why']}); not a best"
        )
        if trusted:
            lines.append(
                f"  best within the measured range: trial {trusted['number']} "
                f"{s['metric']}={figure(trusted['value'])} ({trusted['label']}): "
                f"{json.dumps(trusted['params'])}"
            )
        else:
            lines.append("  best within the measured range: none (every estimate extrapolated)")
    return lines


def _interval_text(iv: dict[str, Any] | None, metric: str) -> str:
    """``[lo, hi]`` of a trial's configuration interval of ``metric`` (``est`` after an
    estimate's error band), or ``-``."""

    ci = ((iv or {}).get("figures") or {}).get(metric, {}).get("ci")
    if not ci:
        return "-"
    text = f"[{figure(ci[0])}, {figure(ci[1])}]"
    return text + " est" if iv and iv.get("kind") == "estimate" else text


def _status_text(s: dict[str, Any]) -> str:
    """A study's best trial and trial table (figures with four significant digits)."""

    lines: list[str] = []
    b = s["best"]
    if b:
        m = b["metrics"]
        noise = b.get("noise") or {}
        fig = (noise.get("figures") or {}).get(s["metric"]) or {}
        value = fig.get("value", b["value"])
        ci = fig.get("ci")
        ci_text = f" [{figure(ci[0])}, {figure(ci[1])}]" if ci and ci[0] < ci[1] else ""
        pooled = noise.get("trials") or [b["number"]]
        over = f" over trials {', '.join(map(str, pooled))}" if len(pooled) > 1 else ""
        lines.append(
            f"  best: trial {b['number']} {s['metric']}={figure(value)}{ci_text}{over}, "
            f"step {figure(_pooled(noise, 'step_time_s', m))} s"
            + (
                f" of CPU time ({figure(m.get('step_wall_time_s'))} s wall)"
                if m.get("step_clock") == "cpu"
                else ""
            )
            + f", peak {figure(_pooled(noise, 'peak_mem_gib', m))} GiB"
            + (" (estimates: cost model, not measured)" if b.get("source") == "estimate" else "")
            + f": {json.dumps(b['params'])}"
        )
        if noise.get("message"):  # the tie, said by the noise model (dse.results.noise)
            lines.append(f"  {noise['message']}")
        model = (noise.get("model") or {}).get("text")
        if model and noise.get("kind") != "estimate":
            lines.append(f"  noise: {model}")
    lines.extend(_trust_text(s))
    nline = _numerics_text(s)
    if nline:
        lines.append(nline)
    if s["trials"]:
        # measurement.clock cpu (a study's one clock): its step times are CPU time
        cpu = any(t["metrics"].get("step_clock") == "cpu" for t in s["trials"])
        step = "CPU s" if cpu else "step s"
        lines.append(
            f"  {'#':>4} {'state':<10} {s['metric']:<14} {'95% interval':<18} {step:<8} "
            f"{'peak GiB':<8} failure / knobs"
        )
    for t in s["trials"]:
        m = t["metrics"]
        extra = f"{t['failure_class']}: " if t["failure_class"] else ""
        if t["state"] == "pruned":
            by = (m.get("measurement") or {}).get("dominated_by") or {}
            extra += f"dominated by trial {by.get('trial', '?')}: "
        num = t.get("numerics") or {}
        if num.get("status") == "changed":
            extra += (
                f"numerics changed (drift {_pct(num.get('drift'))} > "
                f"{_pct(num.get('tolerance'))}): "
            )
        elif num.get("status") == "baseline":
            extra += "loss baseline: "
        if t.get("remeasure_of") is not None:
            extra += f"re-measures #{t['remeasure_of']}: "
        lines.append(
            f"  {t['number']:>4} {t['state']:<10} {figure(t['value']):<14} "
            f"{_interval_text(t.get('interval'), s['metric']):<18} "
            f"{figure(m.get('step_time_s')):<8} {figure(m.get('peak_mem_gib')):<8} "
            f"{extra}{json.dumps(t['params'])}"
        )
    return "\n".join(lines)


def cmd_best(args: argparse.Namespace) -> int:
    storage = _open_existing(args)
    try:
        st = _pick_study(storage, args.study)
        payload = best_payload(storage, st)
        space = best_space(storage, st)
        trust, label = payload.get("trust"), None
        if trust is not None:  # a sim study: the trust of its best's own estimate
            best_trial = storage.get_trial_by_number(st.id, payload["trial"], with_steps=False)
            label = trust_label(best_trial.metrics)
    finally:
        storage.close()

    _out(render_best(payload, args.format, space, export_text))
    noise = payload.get("noise") or {}
    if noise.get("message") and args.format not in ("json", "yaml"):  # the tie, said once
        _err(f"{noise['message']} (dse best --format json shows the intervals)")
    if label == "extrapolated":  # never a best on its own: say so beside it
        for line in _trust_text({"trust": trust, "metric": st.metric}):
            _err(line.strip())
    return 0


# --- export / import / serve ---------------------------------------------------------------
def cmd_export(args: argparse.Namespace) -> int:
    storage = _open_existing(args)
    try:
        st = _pick_study(storage, args.study)
        if args.format == "optuna":
            if not args.storage_out:
                raise SpaceError("--format optuna needs --storage-out URL (an Optuna storage)")
            if args.follow:  # keep the Optuna storage in step until the study is done
                _err(f"following study {st.name!r} into the Optuna storage {args.storage_out}")
                n = follow_study(storage, st.name, args.storage_out, interval_s=args.interval)
                _err(f"study {st.name!r} done: {n} trials written to {args.storage_out}")
                return 0
            n = export_to_optuna(storage, st, args.storage_out)
            _err(
                f"exported study {st.name!r} ({n} trials) to the Optuna storage {args.storage_out}"
            )
            return 0
        data = storage.export_study(st.name)
    finally:
        storage.close()
    text = json.dumps(data, indent=1, sort_keys=True)
    if args.output in (None, "-"):
        _out(text)
    else:
        Path(args.output).write_text(text)
        _err(f"exported study {st.name!r} ({len(data.get('trials', []))} trials) to {args.output}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from dse.storage import open_storage, read_export_text

    why = None if args.study is None else study_name_problem(args.study)
    if why is not None:
        raise SpaceError(f"--study: {why} (study={args.study!r})")
    try:
        with open(args.file, "rb") as f:
            raw = f.read(MAX_EXPORT_BYTES + 1)
    except OSError as e:
        raise SpaceError(f"{args.file}: cannot read a study export ({e.strerror})") from e
    try:
        export = read_export_text(raw)
    except StudyFormatError as e:
        raise StudyFormatError(f"{args.file}: {e}") from None
    storage = open_storage(_storage_url(args))
    try:
        rec = storage.import_study(export, name=args.study, release=True)
    except DuplicatedStudyError as e:
        # bad input, not a storage failure: the name is taken (nothing was written)
        _err(f"{args.file}: {e}; import it under another name with --study NAME")
        return 2
    except StudyFormatError as e:  # the export's study name (checked at import): bad input
        raise StudyFormatError(f"{args.file}: {e}") from None
    finally:
        storage.close()
    if rec.space_hash != export.study.space_hash:
        _err(
            f"{args.file}: note: study.space_hash recomputed from its space_yaml (the file's "
            f"{printable(export.study.space_hash[:80])!r} is another recipe's hash, or edited)"
        )
    _err(f"imported study {rec.name!r}")
    return 0


def listen_socket(
    host: str, port: int, *, reuse_port: bool = False, listen: bool = True
) -> socket.socket:
    """A listening TCP socket for ``dse serve`` (bound before uvicorn starts, so that a port
    in use is a clear error).

    ``reuse_port``: several sockets of this user share the port (``SO_REUSEPORT``): the
    kernel spreads new connections over those that listen (``dse serve --workers``).
    ``listen`` False: bound only, holding the port (it gets no connections).

    Raises:
        DSEError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto TCP, not 0: asyncio sets TCP_NODELAY only on connections of a TCP-proto socket.
    # Without it a response written in two parts (headers, body) waited for the client's
    # delayed ACK: 40 ms more for every request on a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)  # connections wait from now on, until uvicorn accepts them
    except OSError as e:
        sock.close()
        raise DSEError(
            f"cannot listen on {host}:{port}: {e.strerror or e}"
            + (
                " (another server uses that port; pick another with --port)"
                if e.errno == errno.EADDRINUSE
                else ""
            )
        ) from e
    return sock


#: Keep-alive longer than clients' pools (httpx: 5 s), so that the server never closes a
#: connection at the moment a client reuses it (a reset without a response). Event loop and
#: HTTP parser: uvloop and httptools when installed (the api extra), else asyncio and h11.
_UVICORN: dict[str, Any] = {"log_level": "warning", "timeout_keep_alive": 65}
#: Worker restarts allowed in a minute before ``dse serve --workers`` gives up.
_MAX_RESTARTS_PER_MIN = 10


def _serve_worker(host: str, port: int, listening: Any) -> None:
    """One process of ``dse serve --workers``: its own socket on the shared port (listening
    before the app starts: connections wait in its queue meanwhile), its app built from the
    environment (``DSE_*``, the storage URL in ``DSE_STORAGE``)."""
    sock = listen_socket(host, port, reuse_port=True)
    listening.set()
    import uvicorn

    from dse.api import create_app

    uvicorn.Server(uvicorn.Config(create_app(), **_UVICORN)).run(sockets=[sock])


def serve_workers(
    n: int, host: str, port: int, on_listening: Callable[[], None] = lambda: None
) -> int:
    """Run ``n`` server processes on ``host:port`` until SIGINT or SIGTERM; returns the exit
    status. ``on_listening()`` is called once every process listens.

    Each process listens on a socket of its own with ``SO_REUSEPORT``, so the kernel spreads
    new connections evenly over them (one shared socket let the quickest process take most
    of a burst of keep-alive connections). The caller holds the port with a socket that is
    bound and does not listen. A process that exits is replaced; more than
    :data:`_MAX_RESTARTS_PER_MIN` in a minute stop the server (exit 1).
    """
    import multiprocessing as mp
    import signal
    import threading
    import time

    ctx = mp.get_context("spawn")  # a fresh interpreter: no threads or connections inherited
    stop = threading.Event()

    def start() -> tuple[Any, Any]:
        listening = ctx.Event()
        proc = ctx.Process(
            target=_serve_worker, args=(host, port, listening), name="dse-serve-worker"
        )
        proc.start()
        return proc, listening

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = [start() for _ in range(n)]
    procs = [proc for proc, _ in started]
    restarts: list[float] = []
    status = 0
    try:
        deadline = time.monotonic() + 120.0
        for proc, listening in started:
            while not (listening.wait(0.2) or stop.is_set()):
                if not proc.is_alive() or time.monotonic() > deadline:
                    _err(f"serve: a worker process did not start (exit status {proc.exitcode})")
                    stop.set()
                    status = 1
        if not stop.is_set():
            on_listening()
        while not stop.wait(0.5):
            for i, proc in enumerate(procs):
                if proc.is_alive() or stop.is_set():
                    continue
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < 60.0] + [now]
                if len(restarts) > _MAX_RESTARTS_PER_MIN:
                    _err(
                        f"serve: {len(restarts)} worker processes exited within a minute "
                        f"(the last with status {proc.exitcode}); stopping"
                    )
                    status = 1
                    stop.set()
                    break
                _err(f"serve: worker process {proc.pid} exited ({proc.exitcode}); restarting it")
                procs[i] = start()[0]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # SIGTERM: uvicorn finishes the requests under way
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return status


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn
        from pydantic import ValidationError

        from dse.api import Settings, create_app
        from dse.api.config import MAX_SERVE_WORKERS, bind_warnings
        from dse.api.main import API_PREFIX
    except ImportError as e:
        raise DSEError(f"the API needs the 'api' extra ({install_hint('api')}): {e}") from e
    try:
        settings = Settings()
    except ValidationError as e:
        first = e.errors()[0]
        where = f"DSE_{str(first['loc'][0]).upper()}: " if first.get("loc") else ""
        _err(f"serve: {where}{first.get('msg', e)}".replace("Value error, ", ""))
        return 2
    try:
        for line in bind_warnings(
            args.host, settings, public_reads=args.public_reads or settings.public_reads
        ):
            _err(f"warning: {line}")
    except ValueError as e:
        _err(str(e))
        return 2
    url = _storage_url(args)
    workers = settings.serve_workers if args.workers is None else args.workers
    if not 1 <= workers <= MAX_SERVE_WORKERS:
        _err(f"serve: --workers must be 1..{MAX_SERVE_WORKERS}, got {workers}")
        return 2
    if workers > 1:
        from dse.storage import is_ephemeral, open_storage

        if is_ephemeral(url):
            _err(
                f"serve: --workers {workers} needs a file or server database: each worker "
                f"would have its own empty in-memory one ({url})"
            )
            return 2
        try:  # migrate once here, not in every worker at once
            open_storage(url).close()
        except StorageError as e:  # the workers answer 503 until it is back
            _err(f"warning: the study database is not available yet: {e}")
    # bind first (uvicorn would only log the error and exit 1 without a word on stdout);
    # with several workers, hold the port here (bound, not listening): each worker listens
    # on a socket of its own on it
    sock = listen_socket(args.host, args.port, reuse_port=workers > 1, listen=workers == 1)
    port = sock.getsockname()[1]
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    every = f", listening on every interface ({args.host})" if host != args.host else ""
    procs = f", {workers} worker processes" if workers > 1 else ""
    docs = f"{base}{API_PREFIX}/docs"

    def say_where() -> None:
        _out(f"dse: serving the dashboard at {base}/ (API docs: {docs}{every}{procs}); "
             "Ctrl-C stops")  # fmt: skip
        sys.stdout.flush()

    if workers == 1:
        say_where()
        app = create_app(storage_url=url, settings=settings)
        try:
            uvicorn.Server(uvicorn.Config(app, **_UVICORN)).run(sockets=[sock])
        except KeyboardInterrupt:  # uvicorn shuts down, then re-raises the Ctrl-C
            _err("serve: stopped (Ctrl-C)")
            return 130
        return 0
    # Each worker builds its app from the environment: the same DSE_* settings, and the
    # storage URL passed on in DSE_STORAGE. Their read caches are correct side by side:
    # answers are kept per study version, read from the database for every request.
    os.environ["DSE_STORAGE"] = url
    try:
        return serve_workers(workers, args.host, port, say_where)
    finally:
        sock.close()


# --- parser ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dse", description="Design-space exploration for Megatron-Core training recipes."
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def storage_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--storage",
            help=f"SQLAlchemy URL (default: $DSE_STORAGE, the space's storage, {DEFAULT_STORAGE})",
        )

    sp = sub.add_parser("validate", help="check a space file without running anything")
    sp.add_argument("space")
    sp.set_defaults(fn=cmd_validate)

    def run_args(sp: argparse.ArgumentParser) -> None:
        storage_arg(sp)
        sp.add_argument("--n-trials", type=int, help="trial budget (baseline included)")
        sp.add_argument("--agent", choices=REGISTRY.names("agent"))
        # every name a space may give (start refuses those this dse cannot run, naming them)
        sp.add_argument("--runner", choices=REGISTRY.names("runner"))
        sp.add_argument("--max-parallel", type=int, help="trials at once")
        sp.add_argument("--workdir", help="folder for trial specs, metrics and logs")

    sp = sub.add_parser("start", help="run a study end to end")
    sp.add_argument("--space", required=True)
    sp.add_argument("--study", help="study name (default: the space's)")
    sp.add_argument(
        "--dry-run",
        nargs="?",
        type=int,
        const=3,
        metavar="N",
        help="print the first N (default 3) trials the agent would launch; run nothing",
    )
    run_args(sp)
    sp.add_argument(
        "--workload",
        choices=[n for n in REGISTRY.names("workload") if n not in REGISTRY.names("launcher")],
        help="trial kind instead of the space's (sim: the cost model, every figure an estimate)",
    )
    sp.set_defaults(fn=cmd_start)

    sp = sub.add_parser(
        "resume",
        help="continue a study (stopped, died, or finished: --n-trials extends its budget)",
    )
    sp.add_argument("--study")
    sp.add_argument(
        "--trust-imported",
        action="store_true",
        help="an imported study: run with the export's runner.python, workdir, table, "
        "environment and runner options (container, mounts, scheduler flags, Ray address)",
    )
    run_args(sp)
    sp.set_defaults(fn=cmd_resume)

    sp = sub.add_parser("status", help="trials so far and the best so far")
    sp.add_argument("--study")
    sp.add_argument("--format", choices=["text", "json"], default="text")
    storage_arg(sp)
    sp.set_defaults(fn=cmd_status)

    sp = sub.add_parser("best", help="the best configuration and its metrics")
    sp.add_argument("--study")
    sp.add_argument("--format", choices=BEST_FORMATS, default="json")
    storage_arg(sp)
    sp.set_defaults(fn=cmd_best)

    sp = sub.add_parser(
        "verify",
        help="the best (and the baseline) trained longer, a checkpoint saved midway and "
        "reloaded; the verdict is stored with the study",
    )
    sp.add_argument("--study")
    sp.add_argument("--steps", type=int, default=100, help="steps of each long run (100)")
    sp.add_argument("--format", choices=["text", "json"], default="text")
    storage_arg(sp)
    sp.set_defaults(fn=cmd_verify)

    sp = sub.add_parser("export", help="a whole study as one JSON file")
    sp.add_argument("--study")
    sp.add_argument("-o", "--output", help="file (default: stdout)")
    sp.add_argument("--format", choices=["json", "optuna"], default="json")
    sp.add_argument("--storage-out", help="--format optuna: the Optuna RDB storage URL to write")
    sp.add_argument(
        "--follow",
        action="store_true",
        help="--format optuna: keep the Optuna storage in step with the running study (each "
        "trial added as it finishes) until the study is done",
    )
    sp.add_argument(
        "--interval", type=float, default=2.0, help="--follow: seconds between reads (2)"
    )
    storage_arg(sp)
    sp.set_defaults(fn=cmd_export)

    sp = sub.add_parser("import", help="load a study exported with dse export")
    sp.add_argument("file")
    sp.add_argument("--study", help="new name for the imported study")
    storage_arg(sp)
    sp.set_defaults(fn=cmd_import)

    sp = sub.add_parser("serve", help="REST API and dashboard")
    storage_arg(sp)
    sp.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: loopback only; elsewhere needs DSE_API_TOKEN or "
        "--public-reads, see docs/SECURITY.md)",
    )
    sp.add_argument("--port", type=int, default=8000)
    sp.add_argument(
        "--public-reads",
        action="store_true",
        help="serve reads to anyone off the loopback interface without a token "
        "(also DSE_PUBLIC_READS=1)",
    )
    sp.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="server processes answering on the one port (default: $DSE_SERVE_WORKERS or 1): "
        "more use more CPU cores under many readers; every process reads the study versions "
        "from the database, so all answer alike; needs a file or server database",
    )
    sp.set_defaults(fn=cmd_serve)

    from dse.model.costmodel import cli as costmodel_cli  # numpy, when the parser is built

    costmodel_cli.register(sub)
    bench.register(sub)
    recipe_cli.register(sub)
    interop_cli.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.fn(args) or 0)
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:  # Ctrl-C outside a command's own handling: one line, no trace
        _err("interrupted (Ctrl-C)")
        return 130
    except (SpaceError, StudyNotFoundError, StudyFormatError) as e:
        _err(str(e))
        return 2
    except StorageURLError as e:  # a malformed --storage / $DSE_STORAGE: bad input
        _err(f"storage: {e}")
        return 2
    except NoCompleteTrialError as e:
        _err(str(e))
        return 1
    except StorageError as e:
        _err(f"storage: {e}")
        return 1
    except DSEError as e:
        _err(str(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
