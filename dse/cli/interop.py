"""CLI pieces that meet users' other tools: ``dse cloudai import|export`` and ``dse report``.

``dse cloudai import SCENARIO.toml [--tests DIR] -o space.yaml`` turns a CloudAI test
scenario into a space file (what has no dse equivalent is listed in its header and on stderr).
``dse cloudai export --study S -o best.toml`` writes the best configuration as a CloudAI test.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dse.core.names import display_name
from dse.interop.cloudai import dump_toml, export_test_full, figure_label, import_scenario
from dse.report.page import register as register_report
from dse.results.best_formats import _stored_space, best_payload
from dse.space.searchspace import parse_space_text
from dse.storage.locate import DEFAULT_STORAGE
from dse.storage.locate import open_existing as _open_existing
from dse.storage.locate import pick_study as _pick_study

__all__ = ["register", "cmd_cloudai_import", "cmd_cloudai_export"]


def _storage(args: argparse.Namespace) -> Any:
    """The storage of a read-only command: a SQLite file that does not exist is an error."""

    return _open_existing(args)


def cmd_cloudai_import(args: argparse.Namespace) -> int:
    got = import_scenario(
        args.scenario,
        tests_dir=args.tests,
        test_id=args.test_id,
        gpus_per_node=args.gpus_per_node,
        model_from=args.model_from,
        system=args.system,
        gpu_type=args.gpu_type,
        seq_length=args.seq_length,
        global_batch_size=args.global_batch_size,
    )
    text = got.to_yaml(Path(args.scenario).name)
    space = parse_space_text(text, f"{args.scenario} (imported)")  # the result validates
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    for n in got.notes:  # names from the scenario: shown on one line, escaped
        sys.stderr.write(f"dse: note: {display_name(n)}\n")
    for u in got.unmapped:
        sys.stderr.write(f"dse: not mapped: {display_name(f'{u.key} = {u.value!r}: {u.why}')}\n")
    sys.stderr.write(
        f"dse: imported {args.scenario}: study {space.study!r}, {len(space.knobs)} knobs, "
        f"{space.size()} configurations, {len(got.unmapped)} field(s) not mapped\n"
    )
    return 0


def cmd_cloudai_export(args: argparse.Namespace) -> int:
    storage = _storage(args)
    try:
        st = _pick_study(storage, args.study)
        payload = best_payload(storage, st)
    finally:
        storage.close()
    space = _stored_space(st.space_yaml, st.name)
    got = export_test_full(space, payload["params"], args.name or f"{st.name}_best")
    head = [
        f"# Best configuration of dse study {st.name!r}: trial {payload['trial']}, "
        f"{payload['objective']['metric']} = {figure_label(payload)}"
    ]
    head += [f"# note: {n}" for n in got.notes]
    for knob, value, why in got.not_taken:
        head.append(f"# not exported: {knob} = {value!r}: {why}")
        sys.stderr.write(f"dse: not exported: {knob} = {value!r}: {why}\n")
    text = "\n".join(head) + "\n" + dump_toml(got.test)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        sys.stderr.write(f"dse: wrote the best configuration of {st.name!r} to {args.output}\n")
    return 0


def register(sub: Any) -> None:
    cp = sub.add_parser("cloudai", help="CloudAI test scenarios in and out")
    csub = cp.add_subparsers(dest="cloudai_command", required=True, metavar="ACTION")
    sp = csub.add_parser("import", help="a CloudAI test scenario as a space file")
    sp.add_argument("scenario", help="CloudAI test scenario (or test definition) TOML")
    sp.add_argument("--tests", help="folder of the test definitions the scenario names")
    sp.add_argument("--test-id", help="which [[Tests]] entry (default: the first)")
    sp.add_argument("--gpus-per-node", type=int, help="GPUs per node (default 8)")
    sp.add_argument("--model-from", help="a space file whose model section to use")
    sp.add_argument(
        "--system", help="CloudAI system TOML (GPUs per node, partition, account, Slurm options)"
    )
    sp.add_argument("--gpu-type", help="GPU type (h100, h200, b200, gb200, b300, gb300)")
    sp.add_argument("--seq-length", type=int, help="sequence length the test leaves to the recipe")
    sp.add_argument(
        "--global-batch-size", type=int, help="global batch size the test leaves to the recipe"
    )
    sp.add_argument("-o", "--output", help="space file to write (default: stdout)")
    sp.set_defaults(fn=cmd_cloudai_import)

    sp = csub.add_parser("export", help="the best configuration as a CloudAI test TOML")
    sp.add_argument("--study")
    sp.add_argument("--name", help="test name (default: STUDY_best)")
    sp.add_argument("-o", "--output", help="file (default: stdout)")
    sp.add_argument("--storage", help=f"SQLAlchemy URL (default: $DSE_STORAGE, {DEFAULT_STORAGE})")
    sp.set_defaults(fn=cmd_cloudai_export)
    register_report(sub)
