"""``dse estimate``: the cost model's memory and speed estimate, for one configuration of a
space or for every row of a measured table. Every figure printed is an estimate.

    dse estimate --space SPACE [--set knob=value ...] [--json]
    dse estimate --table T.jsonl [--calibrate] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dse.core.exceptions import DSEError, UnknownKnobError
from dse.model.costmodel.basis import Trust
from dse.model.costmodel.memory import Coefficients
from dse.model.costmodel.model import CostModel
from dse.model.costmodel.table import evaluate_rows, load_table, summarize
from dse.model.rules import check
from dse.space.knobs import Knob, get_knob
from dse.space.searchspace import load_space
from dse.space.tablemodel import unknown_model_fields

__all__ = ["register", "run", "parse_value"]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``estimate`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "estimate",
        help="cost-model estimate of memory and speed (no GPU)",
        description=(__doc__ or "").split("\n\n")[0],
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--space", help="space file (YAML): estimate one configuration")
    src.add_argument("--table", help="measured table (replay JSONL): estimate every row")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="knob value for --space (repeatable); unset knobs take the space baseline",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="with --table: predict each row from a fit on the rows before it",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=run)
    return p


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _fail(msg: str) -> int:
    sys.stderr.write(f"dse estimate: {msg}\n")
    return 2


def parse_value(text: str, knob: Knob | None = None) -> Any:
    """A ``--set`` value: a choice of ``knob`` spelled as is (``recompute=none`` is the
    string ``"none"``), else true/false, null/none, an integer, a number, or the string."""
    raw = text.strip()
    if knob is not None and raw in {c for c in knob.choices if isinstance(c, str)}:
        return raw
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def run(args: argparse.Namespace) -> int:
    """Run ``dse estimate``; 0 on success, 2 on bad input (message on stderr)."""
    try:
        if getattr(args, "table", None):
            if args.sets:
                return _fail("--set applies to --space, not to --table")
            return _run_table(args)
        if args.calibrate:
            return _fail("--calibrate applies to --table")
        return _run_space(args)
    except UnknownKnobError as e:
        return _fail(str(e))
    except DSEError as e:
        return _fail(str(e))


def _parse_sets(sets: list[str]) -> dict[str, Any] | str:
    out: dict[str, Any] = {}
    for item in sets:
        if "=" not in item:
            return f"--set expects KNOB=VALUE, got {item!r}"
        name, raw = item.split("=", 1)
        name = name.strip()
        knob = get_knob(name)  # raises UnknownKnobError naming the known knobs
        value = parse_value(raw, knob)
        why = knob.check_value(value)
        if why:
            return f"--set {name}: {why}"
        out[name] = value
    return out


def _run_space(args: argparse.Namespace) -> int:
    space = load_space(args.space)
    sets = _parse_sets(args.sets)
    if isinstance(sets, str):
        return _fail(sets)
    raw = {**space.baseline(), **sets}
    params = space.full_params(space.apply_conditions(raw))
    inactive = _not_taken(space, raw, sets, params)
    feats = space.resources.features
    violations = check(space, params, feats if isinstance(feats, list) else None)
    if violations:
        return _fail(
            "the configuration breaks a rule (it would be rejected before launch): "
            + "; ".join(str(v) for v in violations)
        )

    co = Coefficients.from_dict(space.prescreen.coefficients)
    cm = CostModel(space.model, space.semantics, space.resources, co)
    mem = cm.predict_memory(params)
    cap = cm.capacity_gib
    fits, total = cm.fits(params, 0.0)
    margin = space.prescreen.margin
    passes, _ = cm.fits(params, margin)
    thr = cm.estimate_throughput(params)
    trust = cm.trust(params)
    out = {
        "source": "estimate",
        "study": space.study,
        "params": params,
        "memory": {**mem.as_dict(), "device_peak_gib": round(mem.device_peak_gib(cap), 4)},
        "capacity_gib": cap,
        "usable_gib": cm.usable_gib,
        "fits": fits,
        "passes_prescreen": passes,
        "prescreen_margin": margin,
        "throughput": thr,
        "trust": trust.as_dict(),
        "not_taken": inactive,
    }
    if args.json:
        for why in inactive.values():  # the JSON has them too ("not_taken")
            sys.stderr.write(f"dse estimate: note: {why}\n")
        _out(json.dumps(out, indent=2, default=str))
        return 0
    _out(_format_space(out, total))
    return 0


def _not_taken(
    space: Any, raw: dict[str, Any], sets: dict[str, Any], params: dict[str, Any]
) -> dict[str, str]:
    """Why each ``--set`` value the estimate does not use was left out: a conditional knob
    whose ``when:`` does not hold, or a knob that does nothing in the layout (dse.space.derive)."""
    out: dict[str, str] = {}
    for name, value in sets.items():
        used = params.get(name)
        spec = space.knobs.get(name)
        if spec is not None and spec.when and not space.is_active(name, raw):
            need = ", ".join(
                f"{k} {'in ' + repr(w) if isinstance(w, list) else '= ' + repr(w)}"
                for k, w in spec.when.items()
            )
            have = ", ".join(f"{k}={raw.get(k, space.fixed.get(k))!r}" for k in spec.when)
            out[name] = (
                f"{name}={value!r} is inactive: its condition (when: {need}) does not hold "
                f"({have}), so it changes nothing (Megatron reads it only then; the estimate "
                f"uses {name}={used!r}); set {' and '.join(spec.when)} too for it to apply"
            )
        elif used == value:
            continue
        elif name in space.fixed:
            out[name] = f"{name} is fixed in the space at {used!r}; --set {name}={value!r} ignored"
        else:
            out[name] = (
                f"{name}={value!r} does nothing in this layout (Megatron ignores it there), so "
                f"the estimate uses {name}={used!r} (dse/space/derive.py)"
            )
    return out


def _format_space(out: dict[str, Any], total: float) -> str:
    m = out["memory"]
    lines = [f"estimate (cost model, not measured) for study {out['study']}:"]
    for why in out.get("not_taken", {}).values():
        lines.append(f"  note: {why}")
    lines.append("  params: " + ", ".join(f"{k}={v}" for k, v in sorted(out["params"].items())))
    lines.append("  memory per GPU (GiB, estimate):")
    for name in (
        "weights_gib", "gradients_gib", "optimizer_gib", "activations_gib",
        "attention_scores_gib", "logits_gib", "transient_gib", "buffers_gib",
        "static_offset_gib", "fragmentation_gib", "context_gib",
    ):  # fmt: skip
        lines.append(f"    {name.removesuffix('_gib'):<22}{m[name]:>10.2f}")
    lines.append(f"    {'allocated peak':<22}{m['allocated_gib']:>10.2f}")
    lines.append(
        f"    {'total (need)':<22}{total:>10.2f}   (peak at {m['peak_phase']}, stage "
        f"{m['peak_stage']})"
    )
    cap = out["capacity_gib"]
    if m["elastic_gib"]:
        if cap is not None and total > cap:  # no room left for the reserve: the need itself
            why = f"the need alone exceeds the capacity {cap}; no room for the elastic reserve"
        elif cap is not None and total + m["elastic_gib"] > cap:
            why = f"need + elastic reserve {m['elastic_gib']:.2f}, capped at the capacity {cap}"
        else:
            why = f"need + elastic reserve {m['elastic_gib']:.2f}"
        lines.append(f"    {'device peak':<22}{m['device_peak_gib']:>10.2f}   ({why})")
    if cap is None:
        lines.append("  fits: yes (no gpu_memory_gib declared)")
    else:
        lines.append(
            f"  fits in {out['usable_gib']:.2f} GiB usable of {cap} GiB: "
            f"{'yes' if out['fits'] else 'NO'}; pre-screen (margin "
            f"{out['prescreen_margin']:.2f}): {'pass' if out['passes_prescreen'] else 'reject'}"
        )
    t = out["throughput"]
    lines.append(
        f"  throughput (estimate, {t['gpu']}): {t['tflops_per_gpu']:.1f} TFLOP/s/GPU, "
        f"step {t['step_time_s']:.3f} s"
    )

    tr = out["trust"]
    lines.append(f"  trust: {Trust(**{k: tr[k] for k in _TRUST_FIELDS}).describe()}")
    return "\n".join(lines)


_TRUST_FIELDS = ("label", "basis", "memory_band", "speed_band", "why")


def _run_table(args: argparse.Namespace) -> int:
    rows = load_table(args.table)
    unknown = sorted({k for r in rows for k in unknown_model_fields(r.model)})
    if unknown:
        sys.stderr.write(
            f"dse estimate: note: {args.table}: model field(s) {unknown} are not part of the "
            "model dse estimates; left out\n"
        )
    results = evaluate_rows(rows, calibrate=args.calibrate)
    if args.json:
        _out(json.dumps([r.as_dict() for r in results], indent=1))
        return 0
    head = (
        f"{'row':>4} {'status':<7} {'pred GiB':>9} {'meas GiB':>9} {'fits':>5} "
        f"{'est TF/s':>9} {'meas TF/s':>9}"
    )
    mode = "sequentially calibrated" if args.calibrate else "uncalibrated"
    _out(f"estimates ({mode}, not measurements):")
    _out(head)
    for r in results:
        meas = "-" if r.measured_peak_mem_gib is None else f"{r.measured_peak_mem_gib:.2f}"
        mt = "-" if r.measured_tflops_per_gpu is None else f"{r.measured_tflops_per_gpu:.1f}"
        _out(
            f"{r.index:>4} {r.status:<7} {r.predicted_peak_mem_gib:>9.2f} {meas:>9} "
            f"{'yes' if r.predicted_fits else 'no':>5} {r.estimated_tflops_per_gpu:>9.1f} {mt:>9}"
        )
    s = summarize(results)
    _out(json.dumps(s))
    return 0
