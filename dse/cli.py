"""The ``dse`` command line.

Exit codes: 0 ok, 2 bad input (space file, arguments, unknown study), 1 anything else.
Heavy imports (torch, megatron, ray, fastapi) happen only inside the commands that need them.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dse.agents import create_agent
from dse.exceptions import DSEError, SpaceError, StorageError, StudyNotFoundError
from dse.export import best_payload, render_best
from dse.figures import figure
from dse.proposer import cost_model_memory_hint
from dse.records import AGENT_NAMES, BEST_FORMATS, RUNNER_NAMES
from dse.rules import check_space
from dse.space import load_space, parse_space
from dse.study import StudyRunner, detect_trial_features
from dse.workloads.runners import LocalRunner

__all__ = ["main", "build_parser", "best_payload", "render_best"]

DEFAULT_STORAGE = "sqlite:///dse.db"


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(f"dse: {text}\n")


def _storage_url(args: argparse.Namespace, space_url: str | None = None) -> str:
    if getattr(args, "storage", None):
        return str(args.storage)
    if os.environ.get("DSE_STORAGE"):
        return os.environ["DSE_STORAGE"]
    return space_url or DEFAULT_STORAGE


# --- validate -----------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    from dse.recipe_cli import check_recipe

    space = load_space(args.space)
    n_total, n_valid = check_space(space, args.space)
    check_recipe(space, args.space)
    _out(
        f"{args.space}: ok: study {space.study!r}, {len(space.knobs)} knobs, "
        f"{n_total} configurations, {n_valid} pass the rules; baseline "
        f"{json.dumps(space.baseline())}"
    )
    return 0


# --- start / resume -----------------------------------------------------------------------
def _apply_overrides(space: Any, args: argparse.Namespace) -> Any:
    upd: dict[str, Any] = {}
    if getattr(args, "study", None):
        upd["study"] = args.study
    if getattr(args, "n_trials", None):
        upd["budget"] = space.budget.model_copy(update={"n_trials": args.n_trials})
    if getattr(args, "agent", None):
        upd["agent"] = space.agent.model_copy(update={"name": args.agent})
    if getattr(args, "runner", None):
        upd["runner"] = space.runner.model_copy(update={"name": args.runner})
    if getattr(args, "workdir", None):
        upd["runner"] = upd.get("runner", space.runner).model_copy(
            update={"workdir": args.workdir}
        )
    if getattr(args, "max_parallel", None):
        upd["runner"] = upd.get("runner", space.runner).model_copy(
            update={"max_parallel": args.max_parallel}
        )
    if not upd:
        return space
    data = space.model_dump()
    for k, v in upd.items():
        data[k] = v.model_dump() if hasattr(v, "model_dump") else v
    return parse_space(data, str(args.space))


def _make_runner(space: Any) -> Any:
    name = space.runner.name
    if name == "local":
        # replay and sim trials are plain CPU processes whatever the space's device is
        from dse.recipe_spec import LAUNCHERS

        trains = space.workload.name in ("megatron", *LAUNCHERS)
        device = space.resources.device if trains else "cpu"
        return LocalRunner(
            device=device,
            world_size=space.resources.world_size,
            gpus=space.runner.gpus,
            max_parallel=space.runner.max_parallel,
        )
    try:
        import importlib

        mod = importlib.import_module(f"dse.workloads.runners.{name}_runner")
    except ImportError as e:
        raise SpaceError(
            f"runner {name!r} is not part of this dse version (only 'local' is); "
            "set runner.name: local"
        ) from e
    return mod.make_runner(space)


def _make_cost_model(space: Any) -> Any:
    try:
        from dse.costmodel import CostModel
    except ImportError:
        return None
    return CostModel(space.model, space.semantics, space.resources)


def _run_study(space: Any, space_yaml: str, args: argparse.Namespace) -> int:
    from dse.storage import open_storage

    url = _storage_url(args, space.storage)
    storage = open_storage(url)
    try:
        runner = _make_runner(space)
        features = detect_trial_features(space, space.runner.python)
        cost_model = _make_cost_model(space)
        agent = create_agent(space, cost_model_memory_hint(space, cost_model))
        study = StudyRunner(
            space,
            storage=storage,
            runner=runner,
            agent=agent,
            space_yaml=space_yaml,
            features=features,
            cost_model=cost_model,
        )
        result = study.run()
    finally:
        storage.close()
    return 130 if result.stopped else 0


def cmd_start(args: argparse.Namespace) -> int:
    from dse.recipe_cli import check_recipe, dry_run

    space = _apply_overrides(load_space(args.space), args)
    check_space(space, args.space, count=False)  # the baseline; counting is validate's job
    check_recipe(space, args.space)
    if getattr(args, "dry_run", None):
        _out(dry_run(space, args.dry_run))
        return 0
    return _run_study(space, Path(args.space).read_text(), args)


def cmd_resume(args: argparse.Namespace) -> int:
    import yaml

    from dse.storage import open_storage

    url = _storage_url(args)
    storage = open_storage(url)
    try:
        rec = _pick_study(storage, args.study)
    finally:
        storage.close()
    space = parse_space(yaml.safe_load(rec.space_yaml), f"study {rec.name!r} (stored space)")
    if space.study != rec.name:
        data = space.model_dump()
        data["study"] = rec.name
        space = parse_space(data, f"study {rec.name!r}")
    args.space = f"<stored space of {rec.name}>"
    space = _apply_overrides(space, argparse.Namespace(**{**vars(args), "study": None}))
    return _run_study(space, rec.space_yaml, args)


# --- status / best ------------------------------------------------------------------------
def _pick_study(storage: Any, name: str | None) -> Any:
    if name:
        return storage.get_study(name)
    studies = storage.list_studies()
    if not studies:
        raise StudyNotFoundError(f"no study in {storage.url}")
    if len(studies) > 1:
        names = ", ".join(s.name for s in studies)
        raise StudyNotFoundError(f"several studies in {storage.url} ({names}): give --study")
    return studies[0]


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
    }


def cmd_status(args: argparse.Namespace) -> int:
    from dse.storage import open_storage

    storage = open_storage(_storage_url(args))
    try:
        studies = [storage.get_study(args.study)] if args.study else storage.list_studies()
        if not studies:
            raise StudyNotFoundError(f"no study in {storage!r}")
        out: list[dict[str, Any]] = []
        for st in studies:
            trials = storage.list_trials(st.id)
            best = storage.best_trial(st.id, st.direction)
            out.append(
                {
                    "study": st.name,
                    "state": st.state,
                    "metric": st.metric,
                    "direction": st.direction,
                    "counts": storage.count_trials(st.id),
                    "rejections": storage.count_rejections(st.id),
                    "best": None if best is None else _trial_json(best),
                    "trials": [_trial_json(t) for t in trials],
                }
            )
    finally:
        storage.close()
    if args.format == "json":
        _out(json.dumps(out[0] if args.study or len(out) == 1 else out, indent=2))
        return 0
    for s in out:
        c = s["counts"]
        _out(
            f"study {s['study']} [{s['state']}]: {c.get('total', 0)} trials "
            f"({c.get('complete', 0)} complete, {c.get('running', 0)} running, "
            f"{c.get('failed', 0)} failed, {c.get('infeasible', 0)} infeasible, "
            f"{c.get('queued', 0)} queued), {sum(s['rejections'].values())} rejected before "
            "launch"
        )
        if s["trials"]:
            _out(_status_text(s))
    return 0


def _status_text(s: dict[str, Any]) -> str:
    """A study's best trial and trial table (figures with four significant digits)."""
    lines: list[str] = []
    b = s["best"]
    if b:
        m = b["metrics"]
        lines.append(
            f"  best: trial {b['number']} {s['metric']}={figure(b['value'])}, "
            f"step {figure(m.get('step_time_s'))} s, peak {figure(m.get('peak_mem_gib'))} GiB: "
            f"{json.dumps(b['params'])}"
        )
    if s["trials"]:
        lines.append(
            f"  {'#':>4} {'state':<10} {s['metric']:<14} {'step s':<8} {'peak GiB':<8} "
            "failure / knobs"
        )
    for t in s["trials"]:
        m = t["metrics"]
        extra = f"{t['failure_class']}: " if t["failure_class"] else ""
        lines.append(
            f"  {t['number']:>4} {t['state']:<10} {figure(t['value']):<14} "
            f"{figure(m.get('step_time_s')):<8} {figure(m.get('peak_mem_gib')):<8} "
            f"{extra}{json.dumps(t['params'])}"
        )
    return "\n".join(lines)


def cmd_best(args: argparse.Namespace) -> int:
    from dse.storage import open_storage

    storage = open_storage(_storage_url(args))
    try:
        st = _pick_study(storage, args.study)
        payload = best_payload(storage, st)
    finally:
        storage.close()
    _out(render_best(payload, args.format, st.model.get("num_layers")))
    return 0


# --- export / import / serve ---------------------------------------------------------------
def cmd_export(args: argparse.Namespace) -> int:
    from dse.storage import open_storage

    storage = open_storage(_storage_url(args))
    try:
        st = _pick_study(storage, args.study)
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
    from dse.storage import open_storage

    try:
        data = json.loads(Path(args.file).read_text())
    except (OSError, ValueError) as e:
        raise SpaceError(f"{args.file}: cannot read a study export: {e}") from e
    storage = open_storage(_storage_url(args))
    try:
        rec = storage.import_study(data, name=args.study)
    finally:
        storage.close()
    _err(f"imported study {rec.name!r}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import socket

    from dse import install_hint

    try:
        import uvicorn

        from dse.api import create_app
    except ImportError as e:
        raise DSEError(f"the API needs the 'api' extra ({install_hint('api')}): {e}") from e
    app = create_app(storage_url=_storage_url(args))
    # bind first (uvicorn would only log the error and exit 1 without a word on stdout)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
        sock.listen(2048)  # connections wait from now on, until uvicorn accepts them
    except OSError as e:
        sock.close()
        raise DSEError(
            f"cannot listen on {args.host}:{args.port}: {e.strerror or e}"
            + (
                " (another server uses that port; pick another with --port)"
                if e.errno == errno.EADDRINUSE
                else ""
            )
        ) from e
    port = sock.getsockname()[1]
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    every = f", listening on every interface ({args.host})" if host != args.host else ""
    _out(
        f"dse: serving the dashboard at {base}/ (API docs: {base}{app.docs_url}{every}); "
        "Ctrl-C stops"
    )
    sys.stdout.flush()
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


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
        sp.add_argument("--agent", choices=AGENT_NAMES)
        sp.add_argument("--runner", choices=RUNNER_NAMES)
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
    sp.set_defaults(fn=cmd_start)

    sp = sub.add_parser("resume", help="continue a study whose controller stopped or died")
    sp.add_argument("--study")
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

    sp = sub.add_parser("export", help="a whole study as one JSON file")
    sp.add_argument("--study")
    sp.add_argument("-o", "--output", help="file (default: stdout)")
    storage_arg(sp)
    sp.set_defaults(fn=cmd_export)

    sp = sub.add_parser("import", help="load a study exported with dse export")
    sp.add_argument("file")
    sp.add_argument("--study", help="new name for the imported study")
    storage_arg(sp)
    sp.set_defaults(fn=cmd_import)

    sp = sub.add_parser("serve", help="REST API and dashboard")
    storage_arg(sp)
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8000)
    sp.set_defaults(fn=cmd_serve)

    for mod in ("dse.costmodel.cli", "dse.bench", "dse.recipe_cli"):
        try:
            import importlib

            importlib.import_module(mod).register(sub)
        except ImportError:
            pass
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
    except (SpaceError, StudyNotFoundError) as e:
        _err(str(e))
        return 2
    except StorageError as e:
        _err(f"storage: {e}")
        return 1
    except DSEError as e:
        _err(str(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
